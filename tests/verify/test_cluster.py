"""The verifier on a node of 2 prefill + 1 decode instances (the gpu01-2p1d layout: two
prefills of TP 2, a decode of TP 4 with attention-DP 4), stand-ins behind the REAL
sglang-router 0.3.2, with the plan pdnode.core.plan.build.build_plan makes for it. All serve: PASS,
every instance named and proven; one prefill stopped: FAIL, naming it, while the others
are still proven. The stop runs last (it kills prefill-1 for the module).

Set PDNODE_VERIFY_TIMINGS=FILE to get the measured times as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from cluster import standin_cluster
from nodeplan import plan_for

from pdnode.node.router_launch import control_plane_args
from pdnode.verify.config import build_run
from pdnode.verify.engine import Report, verify

pytestmark = pytest.mark.integration
KEY = "sk-cluster-9d2e41"
ADMIN_KEY = "adm-cluster-5b7a"
THRESHOLDS = {"ttft_p50_max_s": 2.0, "ttft_p99_max_s": 5.0, "itl_p50_max_s": 0.05, "itl_p99_max_s": 0.5,
              "e2e_p99_max_s": 10.0, "decode_throughput_min_tok_s": 5.0, "kv_transfer_speed_min_gb_s": 0.001}
SETTINGS = {"pdnode_verify_thresholds": THRESHOLDS, "pdnode_verify_burst_requests": 12,
            "pdnode_verify_burst_concurrency": 4, "pdnode_verify_max_tokens": 8, "pdnode_verify_prompt_words": 128,
            "pdnode_verify_timeout_s": 15}
ENGINES = ("prefill-0", "prefill-1", "decode-0")
TIMINGS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name, value in (("api-key", KEY), ("router-admin-key", ADMIN_KEY)):
        (d / name).write_text(value + "\n")
        (d / name).chmod(0o600)
        out[name] = str(d / name)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    with standin_cluster(d, prefills=[[0, 1], [2, 3]], decodes=[[4, 5, 6, 7]], api_key=KEY,
                         router_args=control_plane_args(ADMIN_KEY)) as c:
        TIMINGS["cluster_start_s"] = round(c.started_s, 2)
        yield c
    out = os.environ.get("PDNODE_VERIFY_TIMINGS")
    if out:
        Path(out).write_text(json.dumps(TIMINGS, indent=2))


@pytest.fixture(scope="module")
def plan(cluster):
    return plan_for(cluster, **SETTINGS)


def run_verify(plan: dict, files: dict, label: str, **kw: Any) -> Report:
    t0 = time.monotonic()
    rep = verify(build_run(plan, api_key_file=files["api-key"], admin_key_file=files["router-admin-key"], env={},
                           on_node=True, **kw))
    TIMINGS[label] = {"wall_s": round(time.monotonic() - t0, 2), "exit_code": rep.exit_code,
                      "failed": [c.id for c in rep.failed()], **rep.measurements.get("timing", {})}
    return rep


def explain(rep: Report) -> str:
    return "\n".join(f"{c.id} {c.status}: {c.evidence} | {c.hint}" for c in rep.checks)


def test_the_plan_is_the_real_one(plan, cluster):
    services = plan["services"]
    assert [k for k in services] == [*ENGINES, "router"]
    assert services["prefill-1"]["url"] == cluster.instances["prefill-1"].url
    assert services["prefill-1"]["bootstrap_port"] == cluster.instances["prefill-1"].bootstrap_port


def test_all_instances_serve_passes_and_each_is_named(plan, files):
    rep = run_verify(plan, files, "2p1d_healthy")
    checks = {c.id: c for c in rep.checks}
    assert rep.exit_code == 0, explain(rep)
    assert checks["services"].status == "N/A"
    # the stand-in's KV link is not measured (kv.link runs the Mooncake check on GPUs)
    assert checks["kv.link"].status == "N/A" and "KV path is nvlink" in checks["kv.link"].evidence
    # and kv.transport reads the engines' journals: no systemd here
    assert checks["kv.transport"].status == "N/A" and "journal" in checks["kv.transport"].evidence
    assert all(c.status == "PASS" for c in rep.checks if c.id not in ("services", "kv.link", "kv.transport")), \
        explain(rep)
    for iid in ENGINES:
        assert checks[iid].status == checks[f"disaggregation.{iid}"].status == "PASS"
        assert iid in checks[f"disaggregation.{iid}"].evidence
    for iid in ("prefill-0", "prefill-1"):
        assert checks[f"bootstrap.{iid}"].status == "PASS"
        assert "= 2 ranks per pipeline stage registered (plan: 2: tp_size 2)" in checks[f"bootstrap.{iid}"].evidence
    router = checks["router"].evidence
    assert "2 prefill [prefill-0 http://127.0.0.1:" in router and ", prefill-1 http://127.0.0.1:" in router
    inst = rep.measurements["instances"]
    assert inst["prefill-1"]["partner"] == "decode-0" and inst["decode-0"]["partner"] == "prefill-0"
    assert inst["prefill-1"]["counters"]["kv_transfers"] >= 1 and inst["prefill-1"]["counters"]["tokens"] > 0
    # thresholds over the instances of a role, summed
    assert "prefill (prefill-0, prefill-1 summed)" in checks["threshold.kv_transfer_speed_min_gb_s"].evidence
    TIMINGS["2p1d_router_spread"] = rep.measurements["burst"]["router_spread"]


def test_one_prefill_stopped_fails_naming_it(plan, files, cluster):
    cluster.stop("prefill-1")
    rep = run_verify(plan, files, "2p1d_prefill_1_stopped", skip_burst=True)
    checks = {c.id: c for c in rep.checks}
    assert rep.exit_code == 1, explain(rep)
    assert checks["prefill-1"].status == "FAIL" and "connection refused" in checks["prefill-1"].evidence
    assert "prefill-1" in checks["prefill-1"].evidence and "prefill-1 is not running" in checks["prefill-1"].hint
    assert checks["bootstrap.prefill-1"].status == "FAIL"
    assert checks["disaggregation.prefill-1"].evidence == "skipped: because prefill-1 failed"
    # the instances that serve are still proven, each by its own request
    for iid in ("prefill-0", "decode-0"):
        assert checks[iid].status == checks[f"disaggregation.{iid}"].status == "PASS", explain(rep)
    assert {c.id for c in rep.failed()} <= {"prefill-1", "bootstrap.prefill-1", "router"}, explain(rep)
