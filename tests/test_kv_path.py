"""The plan chooses how KV moves from prefill to decode (issue 19, section 1;
docs/kv-path.md): NVLink inside one host, RDMA between hosts, TCP without NICs (a
warning that says what it costs), and it renders what the engines need for the path."""

from __future__ import annotations

import subprocess
import sys

import pytest
from planvars import ROOT, changed, variables

from pdnode.inventory import inventory_variables
from pdnode.plan import build_plan

NVLINK_ENV = {"MC_INTRANODE_NVLINK": "1", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "INTRA_NODE_NVLINK"}


def _engines_env(plan) -> list[dict]:
    return [s["environment"] for s in plan.engines()]


def test_one_host_moves_kv_over_nvlink_and_renders_it_in_every_engine():
    plan = build_plan(variables("gpu01"), "gpu01")
    kv = plan.cluster["kv"]
    assert kv["path"] == "nvlink" and kv["gb_s"] == 385.0
    for env in _engines_env(plan):
        assert {k: env[k] for k in NVLINK_ENV} == NVLINK_ENV
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"mooncake"}
    assert "MC_INTRANODE_NVLINK" not in plan.services["router"]["environment"]


def test_mooncake_tcp_on_one_host_still_takes_nvlink_with_the_mooncake_backend():
    """mooncake_tcp would set MC_FORCE_TCP in SGLang; under NVLink the plan renders mooncake."""
    plan = build_plan(changed(variables("gpu01"), {"pdnode_transfer_backend": "mooncake_tcp",
                                                    "pdnode_ib_devices": None}), "gpu01")
    assert plan.cluster["kv"]["path"] == "nvlink"
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"mooncake"}


def test_nvlink_switched_off_without_nics_is_tcp_with_a_warning_naming_its_ttft_cost():
    plan = build_plan(changed(variables("gpu01"), {
        "pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None, "pdnode_kv_intranode_nvlink": False,
        "pdnode_model_kv_bytes_per_token": 188_416, "pdnode_kv_prompt_tokens": 4000}), "gpu01")
    kv = plan.cluster["kv"]
    assert kv["path"] == "tcp" and kv["gb_s"] == 1.8
    assert kv["handoff_s"] == pytest.approx(188_416 * 4000 / 1.8e9, rel=1e-3)
    assert all("MC_INTRANODE_NVLINK" not in env for env in _engines_env(plan))
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"mooncake_tcp"}
    [warning] = [w for w in plan.warnings if w.rule_id == "kv-over-tcp"]
    assert "about 0.42 s of TTFT for a 4000-token prompt" in str(warning), str(warning)


def test_rdma_with_the_nic_map_when_nvlink_is_off():
    plan = build_plan(changed(variables("gpu01"), {"pdnode_kv_intranode_nvlink": False}), "gpu01")
    assert plan.cluster["kv"]["path"] == "rdma" and "per-GPU NIC map" in plan.cluster["kv"]["why"]
    assert not [w for w in plan.warnings if w.rule_id == "kv-over-tcp"]


def test_a_layout_over_two_hosts_is_rdma_for_every_pair_and_says_why_not_nvlink():
    peers = inventory_variables(ROOT / "inventories" / "gpu-pair")
    for host in peers:
        plan = build_plan(peers[host], host, peers)
        kv = plan.cluster["kv"]
        assert kv["path"] == "rdma" and "spans hosts" in kv["why"]
        assert all("MC_INTRANODE_NVLINK" not in env for env in _engines_env(plan))


def test_nixl_keeps_its_backend():
    plan = build_plan(changed(variables("gpu01"), {"pdnode_transfer_backend": "nixl"}), "gpu01")
    assert plan.cluster["kv"]["path"] == "nixl"
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"nixl"}


def test_the_stand_in_node_says_its_bytes_go_over_loopback_tcp():
    plan = build_plan(variables("demo"), "pdnode-demo")
    assert plan.cluster["kv"]["path"] == "nvlink" and "loopback TCP" in plan.cluster["kv"]["why"]
    assert plan.cluster["kv"]["handoff_s"] is not None  # the stand-in's bytes per token are known


def test_explain_shows_each_pairs_path_speed_and_ttft():
    r = subprocess.run([sys.executable, "-m", "pdnode.cli", "explain", str(ROOT / "inventories" / "gpu01-2p1d")],
                       capture_output=True, text=True, check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(ln.startswith("KV hand-off: nvlink, about 385 GB/s") for ln in lines), r.stdout
    pairs = [ln.strip() for ln in lines if "-> decode-0:" in ln]
    assert pairs == ["prefill-0 -> decode-0: nvlink (on this host), ~385 GB/s",
                     "prefill-1 -> decode-0: nvlink (on this host), ~385 GB/s"], r.stdout
