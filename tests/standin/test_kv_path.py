"""The stand-in's hand-off follows the path the plan rendered (pdnode.core.kv_path): it reads
Mooncake's own switches from its environment (MC_INTRANODE_NVLINK, MC_FORCE_TCP), says
which path it runs, and reports each transfer at PDNODE_SIM_KV_GB_S, the plan's speed for
that path: its simulated time, which no machine load changes. The bytes cross loopback
TCP either way, paced on the wall clock to at least that time."""

from __future__ import annotations

import pytest

from .node import metric_sum, standin_node

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
