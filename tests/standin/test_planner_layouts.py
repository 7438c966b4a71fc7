"""The planner against stand-in nodes: measure 1P1D, predict other layouts, run them, and
compare (the issue's end-to-end check, without molecule: stand-ins started directly with
the ServerArgs and environment build_plan derives for each layout).

What is asserted is what only a wrong planner gets wrong, whatever else runs on the
machine: the ORDER of layouts that differ in structure by a wide margin (one decode rank
instead of four; a prefill on 1 GPU instead of 4): predicted at 0.27-0.40x the others
(asserted: under 0.6x), and measured below them too (0.26-0.49x), and each prediction
within a factor of 2 of its measurement (a wrong formula, rank count or unit is off by
more; the errors measured so far lie between -35% and +5%). How close each prediction
comes (the planner's accuracy) is a benchmark: printed here (`pytest -s`) and recorded,
with its spread over runs, in docs/measurements.md. The stand-in keeps each rank's
forward passes on its own timeline (scheduler.py), so CPU contention no longer stretches
the simulated engine; what still moves the error is the closed loop's timing around it
(at concurrency 32 the 1P1D the planner is fitted to falls into convoys: 4.5-6.0 req/s
between runs, and every prediction follows it).
"""

from __future__ import annotations

import pytest

from pdnode.core.inventory import load_inventory
from pdnode.core.planner_model import fit, predict, run_from_bench

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
    # the prefill on one GPU instead of four (tensor parallelism: a quarter of the rate)
    "1P1D-prefill-tp1": ([{"gpus": [0], "tp_size": 1}], [DECODE_DP4]),
}
# Layouts the structure makes much slower than the 4-decode-rank, 4-prefill-GPU ones
# (1P1D, 2P1D, 1P2D): predicted under WIDE x each of them (0.27-0.40x in the runs of
# docs/measurements.md; a planner blind to ranks or TP predicts ~1x), and measured below
# each of them (0.26-0.49x: the 1P1D run's convoys move it).
SLOW, FAST, WIDE = ("1P1D-no-attn-dp", "1P1D-prefill-tp1"), ("1P1D", "2P1D", "1P2D"), 0.6
# Each prediction within this factor of its measurement (either way): the benchmark's
# errors are -35% to +5% (docs/measurements.md); a wrong formula or rank count is 2x off.
RANGE = 2.0


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
    # the 1P1D run at 32 (fitted) is predicted too: one more layout to order
    results = {"1P1D": (predict(runs[1].shape, params, runs[1].workload).request_s, runs[1].request_s)}
    for name in ("2P1D", "1P2D", *SLOW):
        with layout_node(tmp_path / name, _variables(name), env=ENV) as node:
            report = closed_loop(node, concurrency=32, input_len=INPUT, output_len=OUTPUT, seconds=45)
        measured = run_from_bench(report, name)
        predicted = predict(measured.shape, params, measured.workload)
        results[name] = (predicted.request_s, measured.request_s)
    # the benchmark (docs/measurements.md): printed, not asserted
    print(f"\nplanner fit from 1P1D: {params.as_dict()}")
    p0, m0 = results["2P1D"]
    for name, (p, m) in results.items():
        print(f"planner {name}: predicted {p:.2f} req/s, measured {m:.2f} req/s, error {p / m - 1:+.1%} "
              f"(relative to 2P1D: {p / p0 / (m / m0) - 1:+.1%})")
    detail = (params, results)
    for slow in SLOW:
        for fast in FAST:
            # the planner sees the structure: far slower in its prediction ...
            assert results[slow][0] < WIDE * results[fast][0], (slow, fast, detail)
            # ... and in the measurement (the stand-in's capacity model at work)
            assert results[slow][1] < results[fast][1], (slow, fast, detail)
    for name, (p, m) in results.items():
        assert 1 / RANGE < p / m < RANGE, (name, detail)
