"""The verifier against a real stand-in node (tests/standin/node.py: prefill + decode
stand-ins with Mooncake over TCP, the REAL sglang-router 0.3.2), healthy and with each
fault made to happen for real. One node for the module (started with an API key, the
router's control-plane admin key and a 2 s SGLANG_DISAGGREGATION_WAITING_TIMEOUT: a hundred
times a healthy hand-off here, so only the transfer_stall fault misses it, and short enough
that the router's retries of a stalled request end inside the verifier's 15 s); faults
are switched with POST /sim/faults and cleared after each test. Order matters:
transfer_stall trips the router's circuit breaker (open for the plan's
cb_timeout_duration_secs) and decode_stopped kills decode, so they run last.

Set PDNODE_VERIFY_TIMINGS=FILE to get the measured times as JSON (docs/verification.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from nodeplan import plan_for

from pdnode.node.router_launch import control_plane_args
from pdnode.verify.config import build_run
from pdnode.verify.engine import Report, verify

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-node-5f1c2a9e"
ADMIN_KEY = "adm-node-77c0d1e4"
# Far above what the healthy stand-in node shows (ITL 2 ms, TTFT tens of ms: 25x or more),
# so a busy machine cannot fail the healthy run; the `slow` fault below is 2x over its limit
# (load only slows it further).
THRESHOLDS = {"ttft_p50_max_s": 1.0, "ttft_p99_max_s": 5.0, "itl_p50_max_s": 0.05, "itl_p99_max_s": 0.5,
              "e2e_p99_max_s": 10.0, "decode_throughput_min_tok_s": 5.0, "kv_transfer_speed_min_gb_s": 0.001}
SETTINGS = {"pdnode_verify_thresholds": THRESHOLDS, "pdnode_verify_burst_requests": 8,
            "pdnode_verify_burst_concurrency": 4, "pdnode_verify_max_tokens": 8, "pdnode_verify_prompt_words": 128,
            "pdnode_verify_timeout_s": 15}
TIMINGS: dict[str, Any] = {}
ADMIN_FILE: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _admin(admin_key_file):
    ADMIN_FILE["path"] = admin_key_file


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from node import standin_node

    d = tmp_path_factory.mktemp("node")
    # the router as the plan starts it: admin key, and the plan's circuit-breaker timeout
    router_args = [*control_plane_args(ADMIN_KEY), "--cb-timeout-duration-secs",
                   str(plan_for_node_defaults()["services"]["router"]["args"]["cb_timeout_duration_secs"])]
    with standin_node(d, api_key=KEY, env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "2"},
                      router_args=router_args) as n:
        TIMINGS["node_start_s"] = round(n.started_s, 2)
        yield n
    out = os.environ.get("PDNODE_VERIFY_TIMINGS")
    if out:
        Path(out).write_text(json.dumps(TIMINGS, indent=2))


def plan_for_node_defaults() -> dict:
    class _Ports:
        ports = {"prefill": 20000, "bootstrap": 20001, "decode": 20002, "router": 20003, "router_metrics": 20004}
    return plan_for(_Ports(), **SETTINGS)


@pytest.fixture(scope="module")
def plan(node):
    return plan_for(node, **SETTINGS)


@pytest.fixture(scope="module")
def admin_key_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("admin") / "router-admin-key"
    f.write_text(ADMIN_KEY + "\n")
    f.chmod(0o600)
    return str(f)


@pytest.fixture
def key_file(tmp_path):
    f = tmp_path / "api-key"
    f.write_text(KEY + "\n")
    f.chmod(0o600)
    return str(f)


def run_verify(plan: dict, key_file: str | None, label: str, **kw: Any) -> Report:
    kw.setdefault("env", {})
    kw.setdefault("on_node", True)  # the node's loopback services are this machine's
    kw.setdefault("admin_key_file", ADMIN_FILE.get("path"))
    t0 = time.monotonic()
    rep = verify(build_run(plan, api_key_file=key_file, **kw))
    TIMINGS[label] = {"wall_s": round(time.monotonic() - t0, 2), "exit_code": rep.exit_code,
                      "failed": [c.id for c in rep.failed()], **rep.measurements.get("timing", {})}
    return rep


def by_id(rep: Report) -> dict[str, Any]:
    return {c.id: c for c in rep.checks}


def explain(rep: Report) -> str:
    return "\n".join(f"{c.id} {c.status}: {c.evidence} | {c.hint}" for c in rep.checks)


class faults:
    def __init__(self, node, role: str, specs: list[str]):
        self.node, self.role, self.specs = node, role, specs

    def __enter__(self):
        self.node.set_faults(self.role, self.specs)

    def __exit__(self, *exc):
        self.node.set_faults(self.role, [])


def test_healthy_node_passes(node, plan, key_file):
    rep = run_verify(plan, key_file, "healthy")
    checks = by_id(rep)
    assert rep.exit_code == 0, explain(rep)
    assert checks["services"].status == "N/A"  # no systemd here
    # the stand-in's KV link is not measured (kv.link runs the Mooncake check on GPUs)
    assert checks["kv.link"].status == "N/A" and "KV path is nvlink" in checks["kv.link"].evidence
    # and kv.transport reads the engines' journals: no systemd here
    assert checks["kv.transport"].status == "N/A" and "journal" in checks["kv.transport"].evidence
    assert all(c.status == "PASS" for c in rep.checks if c.id not in ("services", "kv.link", "kv.transport")), \
        explain(rep)
    m = rep.measurements
    assert m["disaggregation"]["prefill_prompt_tokens"] > 0 and m["disaggregation"]["kv_transfers"] >= 3
    # each instance's own proof: the pair the verifier sent a request to counted it
    assert m["instances"]["prefill-0"]["partner"] == "decode-0" and m["instances"]["decode-0"]["partner"] == "prefill-0"
    assert m["instances"]["prefill-0"]["counters"]["kv_transfers"] >= 1
    assert m["instances"]["decode-0"]["counters"]["tokens"] >= 1
    assert set(m["thresholds"]) == set(THRESHOLDS) and all(t["ok"] for t in m["thresholds"].values())
    # how long it took (goal <= 5 s without the burst) is a benchmark: docs/verification.md,
    # PDNODE_VERIFY_TIMINGS; here only that it was measured
    assert m["timing"]["without_burst_s"] > 0, m["timing"]


def test_both_entry_points_agree(node, plan, key_file, admin_key_file, tmp_path):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"hosts": {"standin": {"ansible_connection": "local", "ansible_host": "127.0.0.1"}}}}))
    (inv / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump(plan["settings"]))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    common = ["--json", "--skip-burst", "--api-key-file", key_file, "--admin-key-file", admin_key_file]
    t0 = time.monotonic()
    a = subprocess.run([sys.executable, "-m", "pdnode.verify", "--plan", str(plan_file), *common],
                       capture_output=True, text=True, timeout=120, env=env)
    TIMINGS["cli_plan_entry_skip_burst_s"] = round(time.monotonic() - t0, 2)
    b = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "verify", str(inv), *common],
                       capture_output=True, text=True, timeout=120, env=env)
    assert a.returncode == b.returncode == 0, a.stdout + a.stderr + b.stdout + b.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["targets"] == jb["targets"]
    assert [(c["id"], c["status"]) for c in ja["checks"]] == [(c["id"], c["status"]) for c in jb["checks"]]
    assert by_status(ja, "SKIP") == ["burst"] + [f"threshold.{k}" for k in THRESHOLDS]


def by_status(j: dict, status: str) -> list[str]:
    return [c["id"] for c in j["checks"] if c["status"] == status]


def test_wrong_api_key(node, plan, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("sk-not-the-node-key\n")
    rep = run_verify(plan, str(wrong), "wrong_api_key", skip_burst=True)
    checks = by_id(rep)
    assert rep.exit_code == 1
    assert rep.failed() == [checks["access"]], explain(rep)
    assert "HTTP 401" in checks["access"].evidence and "not the key the endpoint expects" in checks["access"].evidence
    assert "sk-not" not in checks["access"].evidence
    assert checks["prefill-0"].status == "SKIP" and "API key was refused" in checks["prefill-0"].evidence
    assert checks["disaggregation.prefill-0"].evidence == "skipped: because the API key was refused (see access)"
    assert checks["completion"].evidence == "skipped: because the API key was refused (see access)"


def test_bearer_missing_against_the_standin_itself(node, plan, key_file):
    # The stand-in (SGLang's auth) as the OpenAI endpoint, a client that omits "Bearer".
    run = build_run(plan, api_key_file=key_file, base_url=node.decode_url, auth_template="{key}", env={})
    from pdnode.verify.checks import Ctx, check_access

    res = check_access(Ctx(run))
    assert res.status == "FAIL" and "without the word 'Bearer'" in res.evidence, res


def test_proxy_variable_set(node, plan, key_file):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    rep = run_verify(plan, key_file, "proxy_variable", skip_burst=True,
                     env={"http_proxy": f"http://127.0.0.1:{dead}"})
    checks = by_id(rep)
    assert rep.exit_code == 1 and rep.failed() == [checks["proxy"]], explain(rep)
    assert f"http_proxy=http://127.0.0.1:{dead}" in checks["proxy"].evidence
    assert "NO_PROXY=127.0.0.1" in checks["proxy"].hint
    assert checks["completion"].status == "PASS"  # the node itself is fine


def test_bootstrap_down(node, plan, key_file):
    with faults(node, "prefill", ["bootstrap_down"]):
        rep = run_verify(plan, key_file, "bootstrap_down", skip_burst=True)
    checks = by_id(rep)
    boot = checks["bootstrap.prefill-0"]
    assert rep.exit_code == 1 and boot.status == "FAIL", explain(rep)
    assert "connection refused" in boot.evidence and "bootstrap server" in boot.hint and "prefill-0" in boot.evidence
    assert checks["completion"].evidence == "skipped: because bootstrap.prefill-0 failed"
    # decode-0's only partner is down: its own proof cannot be made, which says so
    assert checks["disaggregation.decode-0"].evidence == \
        "skipped: because no prefill instance passed its checks (prefill-0)"
    assert checks["access"].status == "SKIP"
    _wait_ok(node.bootstrap_url + "/health")


def _wait_ok(url: str, timeout: float = 10.0) -> None:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come back")


def test_a_decode_that_fails_generation_while_its_health_stays_200_is_named(node, plan, key_file):
    """Field failure 2 (sglang#32652): a decode's control path fails while /health stays 200.
    The verifier proves the pair with a real generate and names the decode."""
    with faults(node, "decode", ["error500"]):
        assert node.get(node.decode_url + "/health").status == 200  # green to a health check
        rep = run_verify(plan, key_file, "decode_generation_fails", skip_burst=True)
    checks = by_id(rep)
    assert rep.exit_code == 1, explain(rep)
    assert checks["decode-0"].status == "PASS", explain(rep)  # alive and healthy, as a prober sees it
    # the pair is named, and the decode's answer in it (1P1D: no other partner to clear the prefill)
    evidence = checks["disaggregation.decode-0"].evidence
    assert checks["disaggregation.decode-0"].status == "FAIL", explain(rep)
    assert "prefill-0 + decode-0 hand-off" in evidence and "decode-0 HTTP 500" in evidence, explain(rep)


def test_metric_renamed(node, plan, key_file):
    with faults(node, "decode", ["rename_metric"]):
        rep = run_verify(plan, key_file, "metric_renamed")
    checks = by_id(rep)
    assert rep.exit_code == 1 and rep.failed() == [checks["metrics"]], explain(rep)
    ev = checks["metrics"].evidence
    assert ("decode-0 lacks sglang:e2e_request_latency_seconds (needed by threshold e2e_p99_max_s, "
            "threshold decode_throughput_min_tok_s)") in ev
    assert "sglang:request_e2e_latency_seconds" in ev
    assert checks["threshold.e2e_p99_max_s"].status == "SKIP"
    # the throughput's time base is that histogram: skipped for the same cause, not a second FAIL
    assert checks["threshold.decode_throughput_min_tok_s"].status == "SKIP"
    assert checks["threshold.itl_p50_max_s"].status == "PASS"


def test_decode_slow_breaks_itl(node, plan, key_file):
    with faults(node, "decode", ["slow:50"]):  # 2 ms steps x 50: twice the 50 ms limit
        rep = run_verify(plan, key_file, "decode_slow")
    checks = by_id(rep)
    assert rep.exit_code == 1 and checks["threshold.itl_p50_max_s"].status == "FAIL", explain(rep)
    assert "> 50.0 ms (limit)" in checks["threshold.itl_p50_max_s"].evidence
    assert "decode is slow" in checks["threshold.itl_p50_max_s"].hint
    assert all(checks[k].status == "PASS" for k in ("bootstrap.prefill-0", "prefill-0", "decode-0", "router",
                                                    "completion", "disaggregation.prefill-0", "disaggregation.decode-0",
                                                    "disaggregation", "metrics", "burst"))


def test_transfer_stalled(node, plan, key_file):
    with faults(node, "prefill", ["transfer_stall"]):
        rep = run_verify(plan, key_file, "transfer_stall", skip_burst=True)
    checks = by_id(rep)
    assert rep.exit_code == 1, explain(rep)
    assert checks["disaggregation"].status == "FAIL" and "KV transfers failed on prefill-0" in \
        checks["disaggregation"].evidence, explain(rep)
    # the hand-off the verifier sends the pair itself stalls too: both instances' proofs fail
    assert checks["disaggregation.prefill-0"].status == "FAIL", explain(rep)
    assert "WAITING_TIMEOUT" in checks["disaggregation"].hint
    assert checks["completion"].status == "FAIL" and "did not reach decode" in checks["completion"].hint
    # a second run finds the router's circuit breaker open (a real 0.3.2 behaviour): the
    # router check says so without failing; the completion fails, and its hint gives the
    # plan's circuit timeout
    rep2 = run_verify(plan, key_file, "after_transfer_stall", skip_burst=True)
    c2 = by_id(rep2)
    assert c2["router"].status == "PASS", explain(rep2)
    assert "circuit breaker not closed for" in c2["router"].evidence, explain(rep2)
    if c2["completion"].status == "FAIL":
        secs = plan["services"]["router"]["args"]["cb_timeout_duration_secs"]
        assert f"for {secs} s (cb_timeout_duration_secs in the plan" in c2["completion"].hint, explain(rep2)


def test_decode_stopped(node, plan, key_file):
    proc = node.procs["decode"]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    rep = run_verify(plan, key_file, "decode_stopped", skip_burst=True)
    checks = by_id(rep)
    assert rep.exit_code == 1 and checks["decode-0"].status == "FAIL", explain(rep)
    assert "connection refused" in checks["decode-0"].evidence and "decode-0 is not running" in checks["decode-0"].hint
    assert checks["completion"].evidence == "skipped: because decode-0 failed"
