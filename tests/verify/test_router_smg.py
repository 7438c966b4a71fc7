"""The REAL smg 1.13.0 (the successor of sglang-router, docs/smg.md) in PD mode in front
of stand-in workers on loopback, started by pdnode.node.router_launch --router-package smg
from the router JSON the plan renders, exactly as the unit would start it.

smg must be importable by the Python that runs the router: the project venv once
pyproject's dev extras pin smg (scripts/setup), or PDNODE_SMG_PYTHON naming another
interpreter that has it (the stand-ins keep running in this one). Missing smg FAILS
these tests: they never pass by being skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nodeplan import plan_for
from pdnode.verify.config import build_run
from pdnode.verify.engine import verify
from routerproc import REPO, call, decode_out_and_back, key_file, router_process

pytestmark = pytest.mark.integration

SMG_VERSION = "1.13.0"
SMG_PYTHON = os.environ.get("PDNODE_SMG_PYTHON") or sys.executable
CLIENT = "sk-client-5e0b11"
ADMIN = "adm-7d:with-colons:22"  # smg splits id:name:role:key at the first three colons


def _require_smg() -> None:
    r = subprocess.run([SMG_PYTHON, "-c", "import smg.launch_router, importlib.metadata as m; print(m.version('smg'))"],
                       capture_output=True, text=True, check=False, timeout=60)
    found = r.stdout.strip() or (r.stderr.strip().splitlines() or ["no output"])[-1]
    if r.returncode != 0 or found != SMG_VERSION:
        pytest.fail(f"smg {SMG_VERSION} is not importable by {SMG_PYTHON} ({found}): "
                    f"add smg=={SMG_VERSION} to pyproject's dev extras and run scripts/setup, or set "
                    "PDNODE_SMG_PYTHON to a Python that has it")


@contextlib.contextmanager
def smg_node(d: Path, client_key: str | None) -> Iterator[Any]:
    """Stand-in prefill + decode, and smg started by pdnode.node.router_launch."""
    from node import standin_node

    _require_smg()
    with standin_node(d, api_key=client_key, router=False) as node:
        plan = plan_for(node)
        router = dict(plan["services"]["router"]["args"], worker_startup_check_interval=1,
                      shutdown_grace_period_secs=1, log_json=True)
        (d / "router.json").write_text(json.dumps(router))
        argv = [SMG_PYTHON, "-m", "pdnode.node.router_launch", str(d / "router.json"), "--router-package", "smg",
                "--admin-key-file", key_file(d, "router-admin-key", ADMIN)]
        if client_key:
            argv += ["--api-key-file", key_file(d, "api-key", client_key)]
        with router_process(argv, d, node.router_url + "/readiness", {"HF_HUB_OFFLINE": "1"}) as proc:
            node.router_proc, node.plan = proc, plan
            yield node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with smg_node(tmp_path_factory.mktemp("smg-node"), CLIENT) as n:
        yield n


def workers(node: Any) -> dict[str, Any]:
    resp = call(node, "GET", "/workers", ADMIN)
    assert resp.status == 200, resp.text
    return {w["worker_type"]: w for w in resp.json()["workers"]}


def rooms(node: Any, role: str) -> set[int]:
    return {r["bootstrap_room"] for r in node.recent_requests(role) if r["status"] == 200}


def test_smg_serves_pd_requests_through_both_workers(node):
    before_p, before_d = rooms(node, "prefill"), rooms(node, "decode")
    chat = call(node, "POST", "/v1/chat/completions", CLIENT,
                {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert chat.status == 200 and chat.json()["choices"][0]["message"]["content"], chat.text
    comp = call(node, "POST", "/v1/completions", CLIENT, {"model": "fake-model", "prompt": "hi", "max_tokens": 4})
    assert comp.status == 200 and comp.json()["usage"]["completion_tokens"] == 4, comp.text
    gen = call(node, "POST", "/generate", CLIENT, {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    assert gen.status == 200 and gen.json()["meta_info"]["completion_tokens"] == 4, gen.text
    # each request went to prefill AND decode with one bootstrap room (a KV hand-off per request)
    new_p, new_d = rooms(node, "prefill") - before_p, rooms(node, "decode") - before_d
    assert len(new_p) == 3 and new_p == new_d, (new_p, new_d)
    models = call(node, "GET", "/v1/models", None)
    assert models.status == 200 and [m["id"] for m in models.json()["data"]] == ["fake-model"]


def test_generation_takes_the_client_key_only(node):
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
    assert call(node, "POST", "/v1/completions", None, body).status == 401
    assert call(node, "POST", "/v1/completions", ADMIN, body).status == 401  # the admin key is no client key
    assert call(node, "GET", "/liveness", None).status == 200
    assert call(node, "GET", "/readiness", None).json()["healthy_workers"] == 2


@pytest.mark.parametrize("who", [None, CLIENT], ids=["no key", "client key"])
def test_worker_management_answers_to_the_admin_key_only(node, who):
    ids = {role: w["id"] for role, w in workers(node).items()}
    for method, path, body in [
        ("GET", "/workers", None),
        ("DELETE", f"/workers/{ids['decode']}", None),
        ("POST", "/workers", {"url": "http://127.0.0.1:9", "worker_type": "decode"}),
        ("PUT", f"/workers/{ids['decode']}", {"priority": 1}),
        ("POST", "/flush_cache", None),
        ("GET", "/get_loads", None),
    ]:
        resp = call(node, method, path, who, body)
        assert resp.status == 401, (method, path, resp.status, resp.text)
    assert {role: w["id"] for role, w in workers(node).items()} == ids
    assert call(node, "GET", "/readiness", None).status == 200


def test_workers_list_the_plan_in_the_shape_the_verifier_reads(node):
    got = workers(node)
    plan = node.plan["services"]
    assert got["prefill"]["url"] == plan["prefill-0"]["url"]
    assert got["prefill"]["bootstrap_port"] == plan["prefill-0"]["bootstrap_port"]
    assert got["decode"]["url"] == plan["decode-0"]["url"]
    assert got["prefill"]["is_healthy"] is True and got["decode"]["is_healthy"] is True


def test_alert_rule_metrics_are_on_the_metrics_listener(node):
    from node import parse_metrics, request

    resp = request("GET", node.plan["services"]["router"]["metrics_url"], timeout=10)
    assert resp.status == 200
    fams = parse_metrics(resp.text)
    urls = {node.plan["services"]["prefill-0"]["url"], node.plan["services"]["decode-0"]["url"]}
    # templates/prometheus/pdnode-alerts.rules.template.yml and pdnode.verify read these, by `worker`
    for family, healthy in (("smg_worker_cb_state", 0), ("smg_worker_health", 1),
                            ("smg_worker_cb_consecutive_failures", 0)):
        series = {lab.get("worker"): v for _, lab, v in fams.get(family, [])}
        assert set(series) == urls and set(series.values()) == {healthy}, (family, series)


def test_keys_stay_off_the_command_line_and_the_log(node):
    proc = Path(f"/proc/{node.router_proc.pid}")
    for what in ("cmdline", "environ"):
        data = (proc / what).read_bytes()
        assert ADMIN.encode() not in data and CLIENT.encode() not in data, what
    log = (Path(node.dir) / "router.log").read_bytes()
    assert ADMIN.encode() not in log and CLIENT.encode() not in log
    # log_json: one JSON object per line, no terminal colour codes for journald to store as blobs
    assert b"\x1b[" not in log and b'"message":"control_plane_audit"' in log


def test_the_verifier_passes_against_smg(node, tmp_path):
    run = build_run(node.plan, api_key_file=key_file(tmp_path, "client", CLIENT),
                    admin_key_file=key_file(tmp_path, "admin", ADMIN), env={}, skip_burst=True, on_node=True)
    rep = verify(run)
    checks = {c.id: c for c in rep.checks}
    assert rep.exit_code == 0, [(c.id, c.status, c.evidence, c.hint) for c in rep.checks]
    assert checks["router"].status == "PASS"
    assert "/workers: 1 prefill [prefill-0 " in checks["router"].evidence
    assert "1 decode [decode-0 " in checks["router"].evidence


def test_smg_argument_table_is_current():
    _require_smg()
    r = subprocess.run([SMG_PYTHON, "-m", "pdnode.core.rules.argtable", "smg"], capture_output=True, text=True, check=False,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    committed = json.loads((REPO / "src/pdnode/data/routerargs-smg-1.13.0.json").read_text())
    assert json.loads(r.stdout) == committed, (
        "regenerate: PYTHONPATH=src python -m pdnode.core.rules.argtable smg > src/pdnode/data/routerargs-smg-1.13.0.json")


def test_without_a_client_key_the_admin_key_still_guards_workers(tmp_path):
    with smg_node(tmp_path, None) as n:
        ids = {role: w["id"] for role, w in workers(n).items()}
        assert call(n, "DELETE", f"/workers/{ids['decode']}", None).status == 401
        assert call(n, "GET", "/workers", None).status == 401
        assert call(n, "POST", "/v1/completions", None, {"model": "fake-model", "prompt": "hi",
                                                          "max_tokens": 2}).status == 200
        assert {role: w["id"] for role, w in workers(n).items()} == ids


def test_admin_key_manages_workers(node):
    # last in the module: takes decode out and puts it back
    decode = workers(node)["decode"]
    decode_out_and_back(node, decode["id"], decode["url"], ADMIN, CLIENT)
    assert call(node, "POST", "/v1/completions", CLIENT, {"model": "fake-model", "prompt": "hi",
                                                           "max_tokens": 2}).status == 200


def test_a_failing_worker_opens_its_breaker_and_counts_the_opening(tmp_path):
    """What PdWorkerFailing reads: a decode that answers every generate with 500 while its
    /health stays 200 (sglang#32652) has its breaker opened, counted in
    smg_worker_cb_transitions_total{to="open"} by worker (its prefill's too: the pair failed)."""
    from node import parse_metrics, request

    with smg_node(tmp_path, CLIENT) as n:
        n.set_faults("decode", ["error500"])
        statuses = [call(n, "POST", "/v1/completions", CLIENT, {"model": "fake-model", "prompt": f"hi {i}",
                                                                 "max_tokens": 2}).status for i in range(4)]
        assert statuses[0] >= 500 and all(s >= 500 for s in statuses), statuses
        fams = parse_metrics(request("GET", n.plan["services"]["router"]["metrics_url"], timeout=10).text)
        opened = {lab["worker"]: v for _, lab, v in fams.get("smg_worker_cb_transitions", [])
                  if lab.get("to") == "open" and lab.get("from") == "closed"}
        assert opened.get(n.plan["services"]["decode-0"]["url"], 0) >= 1, opened
        assert request("GET", n.plan["services"]["decode-0"]["url"] + "/health", timeout=10).status == 200
