"""False alarms are defects like false passes (issue 9, item 7): a half-open circuit
breaker on an idle node, raw bytes from an endpoint, a loopback address taken for
on-node mode. (The services check's restart judgement: test_services.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import chat_reply, fake_server, minimal_plan
from pdnode.verify.base import FAIL, NA, PASS, Ctx
from pdnode.verify.checks_router import check_router
from pdnode.verify.config import build_run
from pdnode.verify.engine import verify
from pdnode.verify.report import to_json, to_table
from pdnode.verify.text import printable

REPO = Path(__file__).resolve().parents[2]
WORKERS = {"workers": [
    {"id": "p", "url": "http://127.0.0.1:2", "worker_type": "prefill", "bootstrap_port": 3, "is_healthy": True},
    {"id": "d", "url": "http://127.0.0.1:4", "worker_type": "decode", "is_healthy": True}]}


def metrics_text(state: int, failures: int = 0) -> str:
    return ("# TYPE smg_worker_cb_state gauge\n"
            f'smg_worker_cb_state{{worker="http://127.0.0.1:2"}} {state}\n'
            'smg_worker_cb_state{worker="http://127.0.0.1:4"} 0\n'
            "# TYPE smg_worker_cb_consecutive_failures gauge\n"
            f'smg_worker_cb_consecutive_failures{{worker="http://127.0.0.1:2"}} {failures}\n')


def router(chat_status: int = 200, readiness_body: bytes | None = None, code: str = "server_selection_failed"):
    """A fake router: /readiness, /workers, chat (plain and SSE)."""
    def handler(req, body):
        if req.path == "/readiness":
            return (503, readiness_body) if readiness_body is not None else (200, {"status": "ready"})
        if req.path == "/workers":
            return 200, WORKERS
        if req.path == "/v1/chat/completions":
            if chat_status != 200:
                return chat_status, {"error": {"code": code, "message": "no worker"}}
            return chat_reply(body, "Paris OK", 2)
        return 404, {}
    return fake_server(handler)


def _run(base: str, metrics_url: str | None = None, **settings):
    plan = minimal_plan(**settings)
    plan["services"]["router"]["args"]["cb_timeout_duration_secs"] = 5
    return build_run(plan, router_url=base, base_url=base, router_metrics_url=metrics_url, env={}, skip_burst=True)


# --- circuit breaker --------------------------------------------------------------------
def test_half_open_circuit_on_an_idle_node_is_not_a_failure():
    with router() as base, fake_server(lambda r, b: (200, metrics_text(2, 0).encode())) as m:
        rep = verify(_run(base, m + "/metrics"))
    checks = {c.id: c for c in rep.checks}
    assert checks["router"].status == PASS, checks["router"]
    assert "half-open" in checks["router"].evidence and "completion check judges" in checks["router"].evidence
    # the completion checks run (a real request is what closes the circuit) and pass
    assert checks["completion"].status == PASS, checks["completion"]
    assert "circuit breaker was not closed" in checks["completion"].evidence
    assert rep.exit_code == 0, [c.evidence for c in rep.failed()]


def test_open_circuit_fails_only_when_completions_fail_and_the_hint_has_the_plans_timeout():
    with router(chat_status=503) as base, fake_server(lambda r, b: (200, metrics_text(1, 10).encode())) as m:
        rep = verify(_run(base, m + "/metrics"))
    checks = {c.id: c for c in rep.checks}
    assert checks["router"].status == PASS, checks["router"]
    assert checks["completion"].status == FAIL
    hint = checks["completion"].hint
    assert "http://127.0.0.1:2 (open, 10 consecutive failures)" in hint
    assert "for 5 s (cb_timeout_duration_secs in the plan" in hint and "60" not in hint


# the code each router package answers when it has no usable pair: sglang-router 0.3.2's, smg's
@pytest.mark.parametrize("code", ["server_selection_failed", "no_available_workers"])
def test_no_usable_pair_points_at_the_router_check(code):
    with router(chat_status=503, code=code) as base:
        rep = verify(_run(base))
    checks = {c.id: c for c in rep.checks}
    assert checks["completion"].status == FAIL
    assert checks["completion"].hint == "the router has no healthy worker pair: see router"


def test_open_circuit_with_completions_served_passes():
    # the gauge says open, but the timeout passed: the router lets requests through
    with router() as base, fake_server(lambda r, b: (200, metrics_text(1, 10).encode())) as m:
        rep = verify(_run(base, m + "/metrics"))
    assert rep.exit_code == 0 and {c.id: c for c in rep.checks}["completion"].status == PASS


# --- raw bytes ----------------------------------------------------------------------------
def test_printable_escapes_controls_and_keeps_text():
    assert printable("a\x1b[31mred\x1b[0m\x00\x07\u202e b\n\tc é") == "a\\x1b[31mred\\x1b[0m\\x00\\x07\\u202e b c é"
    assert printable("x" * 10, 4) == "xxxx..."


def test_binary_and_ansi_bytes_from_an_endpoint_are_escaped_in_the_report():
    evil = b"\x1b[2J\x1b[31mboom\x07\x00\xff\xfe\x9b31m\xe2\x80\xaeevil\r\nline2"
    with router(readiness_body=evil) as base:
        rep = verify(_run(base))
    router_check = {c.id: c for c in rep.checks}["router"]
    assert router_check.status == FAIL
    assert "\\x1b[2J\\x1b[31mboom\\x07\\x00" in router_check.evidence and "\\u202eevil line2" in router_check.evidence
    for text in (to_table(rep, width=120), router_check.evidence, router_check.hint, json.dumps(rep.failure_lines())):
        bad = [c for c in text if not c.isprintable() and c != "\n"]
        assert not bad, bad
    assert "\\u001b" not in to_json(rep)  # escaped once, by the engine


# --- where the verifier runs ------------------------------------------------------------------
def test_a_loopback_node_address_is_not_on_node_mode():
    run = build_run(minimal_plan(), node_address="127.0.0.1", env={})  # e.g. a tunnel from the controller
    assert not run.targets.on_node
    assert all(i.url is None and i.bootstrap_url is None for i in run.targets.instances)
    assert run.targets.router_metrics_url is None and run.targets.router_url == "http://127.0.0.1:1"
    assert build_run(minimal_plan(), node_address="127.0.0.1", env={}, on_node=True).targets.on_node


def _inventory(tmp_path: Path, **host: str) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu01": host}}}))
    demo = (REPO / "inventories/demo/group_vars/all")
    for f in demo.glob("*.yml"):
        (inv / "group_vars" / "all" / f.name).write_text(f.read_text())
    return inv


def _targets(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, *argv], check=False, capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    return json.loads(proc.stdout)["targets"]


def test_inventory_entry_with_loopback_address_is_remote(tmp_path):
    inv = _inventory(tmp_path, ansible_host="192.0.2.10", ansible_user="ops")
    t = _targets(["-m", "pdnode.commands.cli", "verify", str(inv), "--node-address", "127.0.0.1", "--json", "--timeout", "1"])
    assert t["on_node"] is False and t["instances"]["prefill-0"]["url"] is None
    assert t["router_url"].startswith("http://127.0.0.1:")
    t = _targets(["-m", "pdnode.commands.cli", "verify", str(inv), "--node-address", "127.0.0.1", "--on-node", "--json",
                  "--timeout", "1"])
    assert t["on_node"] is True and t["instances"]["prefill-0"]["url"].startswith("http://127.0.0.1:")
    local = _inventory(tmp_path / "l", ansible_connection="local")
    assert _targets(["-m", "pdnode.commands.cli", "verify", str(local), "--json", "--timeout", "1"])["on_node"] is True


def test_plan_entry_is_the_node_unless_remote(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(minimal_plan()))
    assert _targets(["-m", "pdnode.verify", "--plan", str(plan), "--json", "--timeout", "1"])["on_node"] is True
    t = _targets(["-m", "pdnode.verify", "--plan", str(plan), "--remote", "--json", "--timeout", "1"])
    assert t["on_node"] is False and t["instances"]["prefill-0"]["url"] is None


def test_remote_services_check_is_not_applicable():
    ctx = Ctx(build_run(minimal_plan(), node_address="127.0.0.1", env={}))
    from pdnode.verify.checks_services import check_services

    assert check_services(ctx).status == NA


def test_router_check_unit_with_half_open_metrics():
    with router() as base, fake_server(lambda r, b: (200, metrics_text(2).encode())) as m:
        ctx = Ctx(_run(base, m + "/metrics"))
        res = check_router(ctx)
    assert res.status == PASS and ctx.circuits == ["http://127.0.0.1:2 (half-open, 0 consecutive failures)"]
    assert not ctx.circuit_open


# --- with the real router ---------------------------------------------------------------
@pytest.mark.integration
def test_tripped_circuit_on_an_idle_recovered_node_passes(tmp_path):
    """Prefill failed (the circuit opened), then recovered; nobody sends traffic. The
    verifier's own requests go through and close the circuit: no false FAIL."""
    from node import request, standin_node
    from nodeplan import plan_for
    from pdnode.node.router_launch import control_plane_args

    admin = tmp_path / "admin"
    admin.write_text("adm-cb-test\n")
    admin.chmod(0o600)
    args = [*control_plane_args("adm-cb-test"), "--cb-failure-threshold", "2", "--cb-timeout-duration-secs", "2"]
    with standin_node(tmp_path / "n", router_args=args) as node:
        plan = plan_for(node, pdnode_router_circuit_open_s=2, pdnode_verify_timeout_s=15)
        node.set_faults("prefill", ["error500"])
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for _ in range(3):
            assert request("POST", node.router_url + "/v1/chat/completions", body).status != 200
        node.set_faults("prefill", [])
        time.sleep(2.5)  # past cb_timeout_duration_secs: the router would let a request through
        text = request("GET", node.router_metrics_url).text
        states = [line for line in text.splitlines() if line.startswith("smg_worker_cb_state")]
        assert any(not line.endswith(" 0") for line in states), states  # not closed: the old false FAIL
        rep = verify(build_run(plan, admin_key_file=str(admin), env={}, skip_burst=True, on_node=True))
    checks = {c.id: c for c in rep.checks}
    assert checks["router"].status == PASS and "circuit breaker not closed" in checks["router"].evidence, \
        checks["router"]
    assert checks["completion"].status == PASS, checks["completion"]
    assert rep.exit_code == 0, rep.failure_lines()
