"""What the stand-in reports is its simulated GPU time, not the CPU's clock (issue 27).

A busy CPU must not look like a slow GPU: verification's thresholds judge the stand-in's
TTFT, ITL, e2e and KV speed, and CI's machines are shared. The same workload runs on one
node twice, once alone and once beside CPU burners (twice as many busy processes as the
machine has cores); the engine-reported sums are equal, and the decode's ITL is exactly
the modelled step. Sequential requests make every simulated value deterministic (each
rank is idle when a request arrives), so the comparison can be exact: there is no band
for load to fall outside. The client's wall-clock times are printed for information.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from .node import metric_sum, standin_node

REQUESTS = 12
NEW_TOKENS = 8
DECODE_MS = 20.0  # one decode step of a lone request: the ITL
ENV = {"PDNODE_SIM_PREFILL_MS_PER_TOKEN": "0.5", "PDNODE_SIM_DECODE_MS_PER_TOKEN": str(DECODE_MS),
       "PDNODE_SIM_KV_GB_S": "0.5"}
SUMS = {  # role -> the histogram sums the thresholds read
    "decode": ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
               "sglang:e2e_request_latency_seconds"),
    "prefill": ("sglang:kv_transfer_latency_ms", "sglang:kv_transfer_speed_gb_s", "sglang:e2e_request_latency_seconds"),
}


@contextlib.contextmanager
def cpu_burners() -> Iterator[int]:
    """Twice as many spinning processes as cores, for the block's duration."""
    n = 2 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5)  # let them take the cores
        yield n
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _snapshot(node) -> dict[str, float]:
    out: dict[str, float] = {}
    for role, names in SUMS.items():
        fams = node.metrics(role)
        for name in names:
            out[f"{role} {name}_sum"] = metric_sum(fams, name + "_sum")
            out[f"{role} {name}_count"] = metric_sum(fams, name + "_count")
    return out


def _workload(node) -> tuple[dict[str, float], float]:
    """The sums each histogram gained over REQUESTS sequential requests, and the wall time."""
    before = _snapshot(node)
    t0 = time.monotonic()
    for i in range(REQUESTS):
        resp = node.post(node.router_url + "/generate", {
            "text": f"[{i}] " + " ".join(["word"] * 300),
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True}})
        assert resp.status == 200, resp.body
    wall = time.monotonic() - t0
    after = _snapshot(node)
    return {k: after[k] - before[k] for k in after}, wall


@pytest.mark.integration
def test_a_busy_cpu_does_not_change_what_the_engines_report(tmp_path):
    with standin_node(tmp_path, env=ENV) as node:
        _workload(node)  # warm: the first request also opens connections and sessions
        quiet, quiet_wall = _workload(node)
        with cpu_burners() as burners:
            busy, busy_wall = _workload(node)
    print(f"client wall time of the workload: {quiet_wall:.2f} s alone, {busy_wall:.2f} s beside {burners} burners")
    ttft, itl = "decode sglang:time_to_first_token_seconds", "decode sglang:inter_token_latency_seconds"
    # the counts say the workload ran whole both times
    for d in (quiet, busy):
        assert d[ttft + "_count"] == REQUESTS
        assert d[itl + "_count"] == REQUESTS * (NEW_TOKENS - 1)
        assert d["prefill sglang:kv_transfer_latency_ms_count"] == REQUESTS
    # each decode step of a lone request is the modelled step, exactly
    assert busy[itl + "_sum"] / busy[itl + "_count"] == pytest.approx(DECODE_MS / 1000, rel=1e-9)
    # and every reported sum is the same alone and beside the burners
    for key in quiet:
        assert busy[key] == pytest.approx(quiet[key], rel=1e-9), (key, quiet[key], busy[key])
