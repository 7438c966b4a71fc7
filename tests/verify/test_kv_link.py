"""kv.link: the verify measures the plan's KV path with roles/mooncake's real transfer
check (here: host memory over TCP through the non-CUDA Mooncake in .venv; the GPU
transports ran on an H200, docs/hardware-runs.md), and judges intact data and the floor."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import minimal_plan
from pdnode.verify.base import FAIL, NA, PASS, Ctx
from pdnode.verify.checks_kvlink import check_kv_link
from pdnode.verify.config import build_run

TOOL = Path(__file__).resolve().parents[2] / "roles" / "mooncake" / "files" / "mooncake_loopback_check.py"
# What the plan gives a TCP pair, less the GPU arguments this CPU machine cannot run.
HOST_TCP = {"pair": "prefill-0 -> decode-0", "src_gpu": 0, "dst_gpu": 4, "args": ["--protocol", "tcp"]}


def _ctx(checks, tool=str(TOOL), on_node=True, floor=None):
    plan = copy.deepcopy(minimal_plan())
    plan.setdefault("cluster", {})["kv"] = {"path": "tcp", "checks": checks}
    plan.setdefault("install", {})["kv_check_tool"] = tool
    if floor is not None:
        plan["settings"]["pdnode_verify_thresholds"] = {"kv_transfer_speed_min_gb_s": floor}
    return Ctx(build_run(plan, env={}, skip_burst=True, on_node=on_node))


@pytest.mark.integration
def test_the_real_check_passes_with_intact_data_and_names_the_pair():
    r = check_kv_link(_ctx([HOST_TCP], floor=0.001))
    assert r.status == PASS, r.evidence
    assert "prefill-0 -> decode-0 (GPU 0 -> 4) over tcp" in r.evidence and "intact" in r.evidence


@pytest.mark.integration
def test_a_link_below_the_floor_fails_naming_the_pair_and_the_floor():
    r = check_kv_link(_ctx([HOST_TCP], floor=1e9))
    assert r.status == FAIL and "below the floor of 1e+09 GB/s" in r.evidence and "prefill-0 -> decode-0" in r.hint


def test_a_check_that_cannot_run_fails_with_its_reason():
    bad = {**HOST_TCP, "args": ["--intranode-nvlink"]}  # refused by the tool: no GPUs given
    r = check_kv_link(_ctx([bad]))
    assert r.status == FAIL and "could not run (exit 2)" in r.evidence and "--src-gpu" in r.evidence


def test_a_missing_tool_fails_naming_the_phase_that_installs_it(tmp_path):
    r = check_kv_link(_ctx([HOST_TCP], tool=str(tmp_path / "absent.py")))
    assert r.status == FAIL and "absent.py" in r.evidence and "--tags provision" in r.hint


def test_no_checks_or_remote_is_not_applicable():
    assert check_kv_link(_ctx([])).status == NA
    assert check_kv_link(_ctx([HOST_TCP], on_node=False)).status == NA
