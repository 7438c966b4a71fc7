"""The stand-in's hand-off follows the path the plan rendered (pdnode.core.plan.kv_path): it reads
Mooncake's own switches from its environment (MC_INTRANODE_NVLINK, MC_FORCE_TCP), says
which path it runs, and reports each transfer at PDNODE_SIM_KV_GB_S, the plan's speed for
that path: its simulated time, which no machine load changes. The bytes cross loopback
TCP either way, paced on the wall clock to at least that time."""

from __future__ import annotations

import pytest

from pdnode.core.plan.kv_path import MOONCAKE_NO_RNIC, MOONCAKE_RDMA, MOONCAKE_RDMA_INSTALL_FAILED

from .node import NodeError, metric_sum, standin_node

PROMPT_TOKENS = 400  # x 16 KiB (FAST_ENV) = 6.25 MiB of KV per request


def _one_request(node) -> None:
    resp = node.post(node.router_url + "/generate",
                     {"text": " ".join(["word"] * PROMPT_TOKENS), "sampling_params": {"max_new_tokens": 2}})
    assert resp.status == 200, resp.body


@pytest.mark.integration
def test_tcp_path_is_paced_to_the_plans_speed(tmp_path):
    gb_s = 0.02  # 6.25 MiB at 20 MB/s: at least 0.33 s per transfer
    with standin_node(tmp_path, env={"MC_FORCE_TCP": "1", "PDNODE_SIM_KV_GB_S": str(gb_s)},
                      prefill_args={"disaggregation_transfer_backend": "mooncake_tcp"},
                      decode_args={"disaggregation_transfer_backend": "mooncake_tcp"}) as node:
        for _ in range(2):
            _one_request(node)
        fams = node.metrics("prefill")
        count = metric_sum(fams, "sglang:kv_transfer_latency_ms_count")
        sim_ms = PROMPT_TOKENS * 16384 / (gb_s * 1e9) * 1000
        assert count == 2
        assert metric_sum(fams, "sglang:kv_transfer_latency_ms_sum") == pytest.approx(count * sim_ms, rel=1e-9)
        log = node.log("prefill")
        assert "KV hand-off over tcp" in log and f"simulated at {gb_s:g} GB/s" in log
        assert log.count("over tcp in") == 2


@pytest.mark.integration
def test_nvlink_path_is_named_and_not_slowed(tmp_path):
    with standin_node(tmp_path, env={"MC_INTRANODE_NVLINK": "1", "PDNODE_SIM_KV_GB_S": "385.0"}) as node:
        _one_request(node)
        for role in ("prefill", "decode"):
            assert "KV hand-off over nvlink" in node.log(role)
        assert "over nvlink in" in node.log("prefill")


@pytest.mark.integration
def test_rdma_with_the_plans_mc_force_hca_runs_where_the_host_has_nics(tmp_path):
    # The plan renders MC_FORCE_HCA on the RDMA path (field failure 7c): a host with its
    # NICs runs RDMA as before, and the stand-in's own Mooncake (loopback TCP, no NICs here)
    # still starts: it drops the switch the simulated host has already answered.
    with standin_node(tmp_path, env={"MC_FORCE_HCA": "1", "PDNODE_SIM_KV_GB_S": "25.0"}) as node:
        _one_request(node)
        for role in ("prefill", "decode"):
            assert "KV hand-off over rdma" in node.log(role) and MOONCAKE_RDMA in node.log(role)


@pytest.mark.integration
def test_rdma_with_mc_force_hca_on_a_host_without_nics_fails_its_start_naming_mooncakes_line(tmp_path):
    # Without MC_FORCE_HCA the same host falls back to TCP in silence (field failure 8, the
    # verify's kv.transport); with it, each engine exits at start with Mooncake's own line.
    with pytest.raises(NodeError, match="exited with 1") as failed:
        with standin_node(tmp_path, env={"MC_FORCE_HCA": "1", "PDNODE_SIM_NO_HCA": "1"}):
            pass
    assert MOONCAKE_NO_RNIC in str(failed.value) and MOONCAKE_RDMA_INSTALL_FAILED in str(failed.value)
