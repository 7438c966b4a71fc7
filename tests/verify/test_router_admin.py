"""The router's worker management answers to the admin key only (issue 9, item 6).

Against the REAL sglang-router 0.3.2, started by pdnode.node.router_launch exactly as the
unit starts it (router JSON from the plan, --api-key-file, --admin-key-file), in front
of stand-in workers on loopback. Without the admin key, with no client key configured,
`curl -X DELETE http://NODE:8000/workers/<decode id>` took decode out: a full outage
from one unauthenticated request; with a client key, the client key was the admin key.
docs/security.md has the whole endpoint table these tests sample.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nodeplan import plan_for
from pdnode.node import router_launch
from pdnode.verify.config import build_run
from pdnode.verify.engine import verify
from routerproc import call, decode_out_and_back, key_file, router_process

CLIENT = "sk-client-3f9a07"
ADMIN = "adm-0c41:with-colons:9e"  # sglang-router splits id:name:role:key at the first three colons


@contextlib.contextmanager
def launched_node(d: Path, client_key: str | None) -> Iterator[Any]:
    """Stand-in prefill + decode, and the router started by pdnode.node.router_launch."""
    from node import standin_node

    with standin_node(d, api_key=client_key, router=False) as node:
        plan = plan_for(node, pdnode_router_package="sglang-router")
        router = dict(plan["services"]["router"]["args"], worker_startup_check_interval=1, shutdown_grace_period_secs=1)
        (d / "router.json").write_text(json.dumps(router))
        argv = [sys.executable, "-m", "pdnode.node.router_launch", str(d / "router.json"), "--router-package", "sglang-router",
                "--admin-key-file", key_file(d, "router-admin-key", ADMIN)]
        if client_key:
            argv += ["--api-key-file", key_file(d, "api-key", client_key)]
        with router_process(argv, d, node.router_url + "/readiness", {"HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}) as proc:
            node.router_proc = proc
            node.plan = plan
            yield node


def workers(node: Any) -> dict[str, str]:
    """worker_type -> id, read with the admin key."""
    resp = call(node, "GET", "/workers", ADMIN)
    assert resp.status == 200, resp.text
    return {w["worker_type"]: w["id"] for w in resp.json()["workers"]}


def chat(node: Any, key: str | None) -> Any:
    return call(node, "POST", "/v1/chat/completions", key,
                {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with launched_node(tmp_path_factory.mktemp("admin-node"), CLIENT) as n:
        yield n


# --- the launcher -----------------------------------------------------------------------
def test_launcher_dry_run_redacts_and_refuses_bad_keys(tmp_path, capsys):
    rj = tmp_path / "router.json"
    rj.write_text(json.dumps({"pd_disaggregation": True, "port": 8000}))
    admin, client = key_file(tmp_path, "admin", ADMIN), key_file(tmp_path, "client", CLIENT)
    assert router_launch.main([str(rj), "--admin-key-file", admin, "--api-key-file", client, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--control-plane-api-keys pdnode-admin:pdnode operator:admin:<redacted> --control-plane-audit-enabled" \
        in out and "--api-key <redacted>" in out and ADMIN not in out and CLIENT not in out
    # the admin key must differ from the client key
    same = key_file(tmp_path, "same", CLIENT)
    assert router_launch.main([str(rj), "--admin-key-file", same, "--api-key-file", client, "--dry-run"]) == 2
    assert "equals the client API key" in capsys.readouterr().err
    # a key readable by others is refused, like every pdnode secret
    loose = tmp_path / "loose"
    loose.write_text(ADMIN)
    loose.chmod(0o644)
    assert router_launch.main([str(rj), "--admin-key-file", str(loose), "--dry-run"]) == 2
    # secrets never come from the (world-readable) router JSON
    rj.write_text(json.dumps({"port": 8000, "control_plane_api_keys": ["a:b:admin:c"]}))
    assert router_launch.main([str(rj), "--admin-key-file", admin, "--dry-run"]) == 2
    assert "control_plane_api_keys must not be in the router JSON" in capsys.readouterr().err
    # without an admin key it says what is open
    rj.write_text(json.dumps({"port": 8000}))
    assert router_launch.main([str(rj), "--dry-run"]) == 0
    assert "open to anyone" in capsys.readouterr().err


def test_launcher_parses_the_admin_key_for_the_router(tmp_path):
    from sglang_router.launch_router import parse_router_args

    args = parse_router_args(["--pd-disaggregation", *router_launch.secret_args(CLIENT, ADMIN)])
    assert args.control_plane_api_keys == [("pdnode-admin", "pdnode operator", ADMIN, "admin")]
    assert args.control_plane_audit_enabled and args.api_key == CLIENT



# --- the real router ----------------------------------------------------------------------
@pytest.mark.integration
def test_keys_stay_off_the_command_line(node):
    cmdline = Path(f"/proc/{node.router_proc.pid}/cmdline").read_bytes()
    assert ADMIN.encode() not in cmdline and CLIENT.encode() not in cmdline


@pytest.mark.integration
@pytest.mark.parametrize("who", [None, CLIENT], ids=["no key", "client key"])
def test_worker_management_refuses_clients_and_the_node_keeps_serving(node, who):
    ids = workers(node)
    decode = ids["decode"]
    for method, path, body in [
        ("DELETE", f"/workers/{decode}", None),
        ("DELETE", f"/workers/{ids['prefill']}", None),
        ("POST", "/workers", {"url": "http://127.0.0.1:9", "worker_type": "decode"}),
        ("PUT", f"/workers/{decode}", {"priority": 1}),
        ("GET", "/workers", None),
        ("GET", f"/workers/{decode}", None),
        ("POST", "/flush_cache", None),
        ("GET", "/get_loads", None),
        ("GET", "/v1/tokenizers", None),
    ]:
        resp = call(node, method, path, who, body)
        assert resp.status in (401, 403), (method, path, resp.status, resp.text)
    assert workers(node) == ids  # nothing was removed or added
    assert call(node, "GET", "/readiness", None).status == 200
    resp = chat(node, CLIENT)
    assert resp.status == 200 and resp.json()["choices"][0]["message"]["content"], resp.text


@pytest.mark.integration
def test_client_routes_take_the_client_key_only(node):
    assert chat(node, CLIENT).status == 200
    assert chat(node, None).status == 401
    assert chat(node, ADMIN).status == 401  # the admin key is not a client key


@pytest.mark.integration
def test_mesh_routes_are_inert_without_mesh(node):
    # /ha/* are guarded by the client key only (sglang-router 0.3.2): they must do nothing
    for method, path, body in [("POST", "/ha/shutdown", None), ("POST", "/ha/config", {"key": "k", "value": "00"}),
                               ("POST", "/ha/rate-limit", {"limit_per_second": 1}), ("GET", "/ha/status", None)]:
        assert call(node, method, path, CLIENT, body).status == 503, path
    assert call(node, "GET", "/readiness", None).status == 200


@pytest.mark.integration
def test_verifier_reads_workers_with_the_adminkey_file(node, tmp_path):
    client = key_file(tmp_path, "client", CLIENT)
    run = build_run(node.plan, api_key_file=client, admin_key_file=key_file(tmp_path, "admin", ADMIN), env={},
                    skip_burst=True, on_node=True)
    rep = verify(run)
    router = {c.id: c for c in rep.checks}["router"]
    assert rep.exit_code == 0 and router.status == "PASS", [(c.id, c.evidence) for c in rep.checks]
    assert "/workers: 1 prefill [prefill-0 " in router.evidence and "1 decode [decode-0 " in router.evidence
    # without the admin key: the worker list cannot be read, which is no failure
    rep = verify(build_run(node.plan, api_key_file=client, env={}, skip_burst=True, on_node=True))
    router = {c.id: c for c in rep.checks}["router"]
    assert rep.exit_code == 0 and router.status == "PASS" and "worker list not read" in router.evidence
    # a wrong admin key is
    rep = verify(build_run(node.plan, api_key_file=client, admin_key_file=key_file(tmp_path, "wrong", "adm-wrong"),
                           env={}, skip_burst=True, on_node=True))
    router = {c.id: c for c in rep.checks}["router"]
    assert router.status == "FAIL" and "refused the admin key" in router.hint


@pytest.mark.integration
def test_admin_key_manages_workers(node):
    # last in the module: takes decode out and puts it back
    decode_out_and_back(node, workers(node)["decode"], node.decode_url, ADMIN, CLIENT)
    assert chat(node, CLIENT).status == 200


@pytest.mark.integration
def test_without_a_client_key_the_admin_key_still_guards_workers(tmp_path):
    # the configuration of the report: no client key, anyone reaches the router
    with launched_node(tmp_path, None) as node:
        ids = workers(node)
        resp = call(node, "DELETE", f"/workers/{ids['decode']}", None)
        assert resp.status == 401, resp.text
        assert call(node, "POST", "/workers", None, {"url": "http://127.0.0.1:9", "worker_type": "decode"}).status \
            == 401
        assert workers(node) == ids and chat(node, None).status == 200
