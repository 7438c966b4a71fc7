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
the simulated engine, and the closed loop reports what the engines timed (their TTFT, ITL
and e2e histograms; throughput by Little's law over that e2e: layout_node.closed_loop),
not the client's clock, which on a busy machine measured the CPU: a run beside two CPU
burners once predicted the no-attention-DP layout at 0.76x the fast ones. What still moves
the measurement on a busy machine is the time a request spends outside the engines (fewer
of the 32 requests are inside them at once, so they queue less).

Those rates cannot see an instance miscounted: 1P1D, 2P1D and 1P2D have one capacity
here, and a planner that drops 1P2D's second decode instance predicts it at 0.66x its
measurement, inside the factor of 2, with both orders kept. So each layout is also held to
its instances as counts (check_instances): the report lists every instance; the node ran
one engine per instance and every rank of it took work (GET /sim/ranks); the planner's
pools have exactly the ranks and GPUs counted from the instance list; and the predicted
capacity of each pool is the sum of its instances' capacities alone.
test_the_check_catches_a_dropped_instance runs the same checks on runs made from the model
(no processes) with an instance dropped, and shows that they fail where the rates pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pdnode.commands.bench_report import layout as bench_layout
from pdnode.core.planner import model as planner_model
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan
from pdnode.core.planner.model import Params, Pool, Shape, Workload, capacities, fit, predict, run_from_bench

from .layout_node import closed_loop, layout_node
from .node import REPO, request

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
KV_S_PER_TOKEN = 512 / 1.8e9  # PDNODE_SIM_KV_BYTES_PER_TOKEN over Mooncake TCP's speed
# What each rank of a role must have simulated in a run: proof that it took work.
WORK = {"prefill": "prefill_passes", "decode": "decode_steps"}
Measured = dict[str, tuple[dict[str, Any], dict[str, list[list[dict[str, Any]]]]]]  # name -> (report, ranks)


def _variables(name: str) -> dict:
    base = {k: v for k, v in load_inventory(REPO / "inventories" / "demo").variables.items()
            if not k.startswith(("pdnode_prefill_", "pdnode_decode_"))}
    prefill, decode = LAYOUTS[name]
    return {**base, "pdnode_prefill_instances": prefill, "pdnode_decode_instances": decode}


def counted_pools(name: str) -> dict[str, Pool]:
    """A layout's pools counted from its instance list by docs/planner.md ("The model"),
    not by the planner: a prefill instance is one rank of its GPUs; a decode instance with
    attention DP d is d ranks over its GPUs, without it one rank."""
    prefill, decode = LAYOUTS[name]
    return {"prefill": Pool(ranks=len(prefill), gpus=sum(len(i["gpus"]) for i in prefill)),
            "decode": Pool(ranks=sum(i.get("attn_dp_size", 1) for i in decode),
                           gpus=sum(len(i["gpus"]) for i in decode))}


def node_ranks(node: Any) -> dict[str, list[list[dict[str, Any]]]]:
    """Per role, per engine of the running node: what each of its ranks simulated."""
    out: dict[str, list[list[dict[str, Any]]]] = {"prefill": [], "decode": []}
    for sid, eng in node.engines.items():
        resp = request("GET", eng["url"] + "/sim/ranks", timeout=30.0)
        assert resp.status == 200, (sid, resp.status, resp.text)
        out[eng["role"]].append(resp.json()["ranks"])
    return out


def predictions(measured: Measured, fit_reports: list[dict[str, Any]]) -> tuple[Params, dict[str, tuple[float, float]]]:
    """The rates fitted to the 1P1D runs; per layout (predicted, measured) request/s."""
    runs = [run_from_bench(r, f"1P1D c{r['workload']['concurrency']}") for r in fit_reports]
    params = fit(runs, kv_s_per_token=KV_S_PER_TOKEN)
    results = {}
    for name, (report, _) in measured.items():
        run = run_from_bench(report, name)
        results[name] = (predict(run.shape, params, run.workload).request_s, run.request_s)
    return params, results


def check_order_and_range(results: dict[str, tuple[float, float]], detail: Any) -> None:
    """The rates: the slow layouts predicted far below, and measured below, the fast ones;
    each prediction within a factor of RANGE of its measurement."""
    for slow in SLOW:
        for fast in FAST:
            # the planner sees the structure: far slower in its prediction ...
            assert results[slow][0] < WIDE * results[fast][0], (slow, fast, detail)
            # ... and in the measurement (the stand-in's capacity model at work)
            assert results[slow][1] < results[fast][1], (slow, fast, detail)
    for name, (p, m) in results.items():
        assert 1 / RANGE < p / m < RANGE, (name, detail)


def check_instances(measured: Measured, params: Params) -> None:
    """Counts, exact on any machine: every instance of each layout is in the report, ran
    with every rank taking work, is counted in the planner's pools, and adds its capacity
    to the prediction."""
    for name, (report, ranks) in measured.items():
        want = counted_pools(name)
        for role, insts in zip(("prefill", "decode"), LAYOUTS[name]):
            listed = sorted(tuple(i["gpus"]) for i in report["layout"][role])
            assert listed == sorted(tuple(i["gpus"]) for i in insts), (name, role, "report", report["layout"][role])
            assert len(ranks[role]) == len(insts), (name, role, "engines running", ranks[role])
            assert sum(len(engine) for engine in ranks[role]) == want[role].ranks, (name, role, "ranks", ranks[role])
            idle = [r for engine in ranks[role] for r in engine if not r[WORK[role]] > 0]
            assert not idle, (name, role, "ranks without work", idle)
        run = planner_model.run_from_bench(report, name)
        assert run.shape == Shape(prefill=want["prefill"], decode=want["decode"]), (name, "pools", run.shape, want)
        caps = capacities(run.shape, params, run.workload)
        for role in ("prefill", "decode"):
            alone = [capacities(dataclasses.replace(run.shape, **{role: planner_model.pool_of([inst])}),
                                params, run.workload)[role] for inst in report["layout"][role]]
            assert caps[role] == pytest.approx(sum(alone), rel=1e-9), (name, role, "capacity", caps[role], alone)


@pytest.mark.integration
def test_predictions_from_1p1d_hold_for_other_layouts(tmp_path):
    measured: Measured = {}
    with layout_node(tmp_path / "1P1D", _variables("1P1D"), env=ENV) as node:
        fit_reports = [closed_loop(node, concurrency=concurrency, input_len=INPUT, output_len=OUTPUT, seconds=seconds)
                       for concurrency, seconds in ((8, 15), (32, 25))]
        # the 1P1D run at 32 (fitted) is predicted too: one more layout to order
        measured["1P1D"] = (fit_reports[1], node_ranks(node))
    for name in ("2P1D", "1P2D", *SLOW):
        with layout_node(tmp_path / name, _variables(name), env=ENV) as node:
            report = closed_loop(node, concurrency=32, input_len=INPUT, output_len=OUTPUT, seconds=30)
            measured[name] = (report, node_ranks(node))
    params, results = predictions(measured, fit_reports)
    # the benchmark (docs/measurements.md): printed, not asserted
    print(f"\nplanner fit from 1P1D: {params.as_dict()}")
    p0, m0 = results["2P1D"]
    for name, (p, m) in results.items():
        print(f"planner {name}: predicted {p:.2f} req/s, measured {m:.2f} req/s, error {p / m - 1:+.1%} "
              f"(relative to 2P1D: {p / p0 / (m / m0) - 1:+.1%})")
    check_instances(measured, params)
    check_order_and_range(results, (params, results))


# --- the checks against a planner that drops an instance (no processes) ----------------------
# The stand-in's rates of ENV as the model reads them (delta: a small fixed TTFT).
STANDIN = Params(tau=2.0e-3, beta=0.030, gamma=0.006, delta=0.005, kv_s_per_token=KV_S_PER_TOKEN)


def modelled(name: str, concurrency: int) -> tuple[dict[str, Any], dict[str, list[list[dict[str, Any]]]]]:
    """What a stand-in node of the layout would report if it ran exactly as the model: the
    report's layout as `pdnode bench` writes it from the plan; throughput, TTFT and ITL the
    model's for the counted pools; every rank of every engine with work done."""
    plan = build_plan(_variables(name), "local").as_dict()
    pools = counted_pools(name)
    pr = predict(Shape(prefill=pools["prefill"], decode=pools["decode"]), STANDIN,
                 Workload(INPUT, OUTPUT, concurrency=concurrency))
    report = {"schema": "pdnode.bench/1", "layout": bench_layout(plan),
              "workload": {"concurrency": concurrency, "rate": None, "input_len": INPUT, "output_len": OUTPUT,
                           "range_ratio": 1.0},
              "results": {"completed": 1000, "failed": 0, "request_throughput": pr.request_s,
                          "ttft_s": {"mean": pr.ttft_s}, "itl_s": {"mean": pr.itl_s}}}
    ranks: dict[str, list[list[dict[str, Any]]]] = {"prefill": [], "decode": []}
    for svc in plan["services"].values():
        if svc["role"] in ranks:
            ranks[svc["role"]].append([{"prefill_passes": 0, "decode_steps": 0, WORK[svc["role"]]: 7}
                                       for _ in range(svc["args"].get("attn_dp_size") or 1)])
    return report, ranks


def _modelled_runs() -> tuple[Measured, list[dict[str, Any]]]:
    fit_reports = [modelled("1P1D", 8)[0], modelled("1P1D", 32)[0]]
    return {name: modelled(name, 32) for name in LAYOUTS}, fit_reports


def test_the_checks_pass_a_planner_that_counts_every_instance():
    measured, fit_reports = _modelled_runs()
    params, results = predictions(measured, fit_reports)
    check_instances(measured, params)
    check_order_and_range(results, (params, results))
    # what makes the rates blind to a count: 1P2D has exactly 1P1D's pools, 2P1D their capacity
    assert results["1P2D"][1] == results["1P1D"][1]
    assert counted_pools("1P2D") == counted_pools("1P1D")


def _pool_drops_last_instance(monkeypatch):
    original = planner_model.pool_of

    def pool_of(instances, batch_limits=None):
        instances = list(instances)
        return original(instances[:-1] if len(instances) > 1 else instances, batch_limits)

    monkeypatch.setattr(planner_model, "pool_of", pool_of)


def _decode_pool_drops_last_instance(monkeypatch):
    original = planner_model._instances

    def instances(doc, role, src):
        items = original(doc, role, src)
        return items[:-1] if role == "decode" and len(items) > 1 else items

    monkeypatch.setattr(planner_model, "_instances", instances)


@pytest.mark.parametrize(("mutant", "rates_see_it"), [
    (_pool_drops_last_instance, None),  # the pool of several instances loses the last, either role
    (_decode_pool_drops_last_instance, False),  # the review's case: 1P2D's second decode instance lost
])
def test_the_check_catches_a_dropped_instance(monkeypatch, mutant, rates_see_it):
    measured, fit_reports = _modelled_runs()
    mutant(monkeypatch)
    params, results = predictions(measured, fit_reports)
    if rates_see_it is False:
        # the rates pass it: 1P2D predicted at about two thirds of its measurement
        check_order_and_range(results, (params, results))
        assert 0.5 < results["1P2D"][0] / results["1P2D"][1] < 0.75
    with pytest.raises(AssertionError, match="1P2D|2P1D"):
        check_instances(measured, params)


def test_the_check_catches_a_node_that_runs_without_an_instance():
    measured, fit_reports = _modelled_runs()
    params, _ = predictions(measured, fit_reports)
    report, ranks = measured["1P2D"]
    measured["1P2D"] = (report, {**ranks, "decode": ranks["decode"][:-1]})
    with pytest.raises(AssertionError, match="engines running"):
        check_instances(measured, params)
    measured["1P2D"] = modelled("1P2D", 32)
    measured["2P1D"][1]["prefill"][-1][0]["prefill_passes"] = 0  # running, but the router never sent it a prompt
    with pytest.raises(AssertionError, match="ranks without work"):
        check_instances(measured, params)
