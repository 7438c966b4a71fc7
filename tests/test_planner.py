"""`pdnode plan`: the layouts it enumerates, the model's arithmetic, the fit, the CLI's
output and errors. Measurements are built here from the model itself (a run the model
predicts exactly), so a test knows the true rates; tests/standin/test_planner_layouts.py
checks the model against running stand-ins."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pdnode.core.planner import layouts as planner_layouts
from pdnode.commands.cli import main
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import PlanError, Problem, build_plan
from pdnode.commands.planner import _shape, kv_bytes_from_config
from pdnode.core.planner.layouts import Candidate, Inst
from pdnode.core.planner.model import (MeasurementError, Params, Pool, Run, Shape, Workload, capacities, fit, pool_of,
                                  predict, run_from_bench)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "inventories" / "demo"
TRUE = Params(tau=0.5e-3, beta=0.005, gamma=0.001, delta=0.01, kv_s_per_token=16384 / 1.8e9)
P4_D4DP4 = Shape(prefill=Pool(ranks=1, gpus=4), decode=Pool(ranks=4, gpus=4))


def bench_doc(concurrency: int, params: Params = TRUE, shape: Shape = P4_D4DP4, **over) -> dict:
    """A pdnode.bench/1 report of the demo's 1P1D layout, as the model predicts it."""
    pr = predict(shape, params, Workload(256, 64, concurrency=concurrency))
    doc = {
        "schema": "pdnode.bench/1", "host": "pdnode-demo", "client": {},
        "layout": {"prefill": [{"id": "prefill-0", "gpus": [0, 1, 2, 3], "tp_size": 4, "dp_size": 1,
                                "attn_dp_size": 1, "ep_size": 1}],
                   "decode": [{"id": "decode-0", "gpus": [4, 5, 6, 7], "tp_size": 4, "dp_size": 1,
                               "attn_dp_size": 4, "ep_size": 4}]},
        "workload": {"requests": 500, "concurrency": concurrency, "rate": None, "input_len": 256,
                     "output_len": 64, "range_ratio": 1.0},
        "results": {"duration_s": 60.0, "completed": 500, "failed": 0, "request_throughput": pr.request_s,
                    "input_token_throughput": pr.request_s * 256, "output_token_throughput": pr.output_tok_s,
                    "ttft_s": {"mean": pr.ttft_s, "p50": pr.ttft_s, "p99": pr.ttft_s},
                    "itl_s": {"mean": pr.itl_s, "p50": pr.itl_s, "p99": pr.itl_s},
                    "e2e_s": {"mean": 1.0, "p50": 1.0, "p99": 1.0}},
        "instances": {},
    }
    for path, value in over.items():
        cur = doc
        keys = path.split("__")
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    return doc


def measurement_args(directory: Path) -> list[str]:
    """`--measurements FILE` for a bench report at concurrency 8 and one at 32, written to DIRECTORY."""
    out = []
    for c in (8, 32):
        p = directory / f"bench-c{c}.json"
        p.write_text(json.dumps(bench_doc(c)))
        out += ["--measurements", str(p)]
    return out


@pytest.fixture
def bench_files(tmp_path):
    paths = []
    for c in (8, 32):
        p = tmp_path / f"c{c}.json"
        p.write_text(json.dumps(bench_doc(c)))
        paths.append(str(p))
    return paths


# --- the model's arithmetic, computed by hand ---------------------------------------------
def test_open_loop_prediction_by_hand():
    p = Params(tau=1e-3, beta=0.01, gamma=0.002, delta=0.05, kv_s_per_token=1e-5)
    shape = Shape(prefill=Pool(ranks=1, gpus=4), decode=Pool(ranks=4, gpus=4))
    pr = predict(shape, p, Workload(input_len=400, output_len=11, rate=5.0))
    # prefill: s = 400 x 1e-3 / 4 = 0.1 s, rho = 0.5, latency 0.2 s
    # decode: 10 steps, a = 5 x 10 / 4 = 12.5 per s, a x beta = 0.125 < 1 -> n = 0.125, ITL = beta
    # TTFT = 0.05 + 0.2 + 400 x 1e-5 + 0.5 x 0.01 x 0.125
    assert pr.prefill_util == pytest.approx(0.5)
    assert pr.decode_batch == pytest.approx(0.125)
    assert pr.itl_s == pytest.approx(0.01)
    assert pr.ttft_s == pytest.approx(0.254625)
    assert pr.request_s == 5.0 and pr.output_tok_s == 55.0


def test_decode_batch_grows_the_step_by_hand():
    p = Params(tau=1e-6, beta=0.01, gamma=0.002, delta=0.0, kv_s_per_token=0.0)
    shape = Shape(prefill=Pool(ranks=1, gpus=1), decode=Pool(ranks=4, gpus=4))
    pr = predict(shape, p, Workload(input_len=100, output_len=11, rate=80.0))
    # a = 80 x 10 / 4 = 200; n = a (beta - gamma) / (1 - a gamma) = 200 x 0.008 / 0.6
    assert pr.decode_batch == pytest.approx(8 / 3)
    assert pr.itl_s == pytest.approx(0.01 + 0.002 * (8 / 3 - 1))
    # Little's law holds on every decode rank: n = X x steps x ITL / ranks
    assert pr.decode_batch == pytest.approx(80 * 10 * pr.itl_s / 4)


def test_attention_dp_ranks_multiply_decode_capacity():
    p = Params(tau=1e-6, beta=0.01, gamma=0.002, delta=0.0, kv_s_per_token=0.0)
    w = Workload(input_len=100, output_len=101, concurrency=10_000)
    one = predict(Shape(Pool(1, 4), Pool(ranks=1, gpus=4)), p, w)
    four = predict(Shape(Pool(1, 4), Pool(ranks=4, gpus=4)), p, w)
    # saturated decode: X -> ranks / (steps x gamma) (the step grows with the batch)
    assert one.request_s == pytest.approx(1 / (100 * 0.002), rel=1e-3)
    assert four.request_s == pytest.approx(4 * one.request_s, rel=5e-3)
    assert one.bottleneck == four.bottleneck == "decode"


def test_prefill_bound_closed_loop_is_pd_max_not_sum():
    # PD: a request costs a = I tau / g on a prefill rank and the decode is far from full,
    # so X -> prefill ranks / a = max(a/m, b/n)^-1 with the prefill term the larger
    p = Params(tau=1e-3, beta=0.001, gamma=0.0, delta=0.0, kv_s_per_token=0.0)
    w = Workload(input_len=400, output_len=2, concurrency=5000)
    pd = predict(Shape(Pool(ranks=2, gpus=4), Pool(ranks=1, gpus=4)), p, w)
    assert pd.request_s == pytest.approx(2 / 0.2, rel=1e-3) and pd.bottleneck == "prefill"
    # colocated on the same 8 GPUs (4 ranks of 2): prefill and decode share each rank
    co = predict(Shape(None, Pool(ranks=4, gpus=8)), p, w)
    assert co.request_s == pytest.approx(4 / 0.2, rel=1e-2)


def test_closed_loop_satisfies_littles_law():
    for c in (1, 8, 64):
        pr = predict(P4_D4DP4, TRUE, Workload(256, 64, concurrency=c))
        assert pr.request_s * (pr.ttft_s + 63 * pr.itl_s) == pytest.approx(c, rel=1e-6)


def test_batch_limit_per_rank_caps_decode():
    p = Params(tau=1e-6, beta=0.01, gamma=0.0, delta=0.0, kv_s_per_token=0.0)
    w = Workload(input_len=10, output_len=11, concurrency=1000)
    pr = predict(Shape(Pool(1, 1), Pool(ranks=2, gpus=2, batch_limit=4)), p, w)
    # 2 ranks x 4 running, each a step of 10 ms for 10 steps: 8 / 0.1 s
    assert pr.request_s == pytest.approx(80, rel=1e-3) and pr.bottleneck == "decode batch limit"


def test_kv_bytes_from_config():
    mla = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert kv_bytes_from_config(mla) == 61 * 576 * 2
    gqa = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192}
    assert kv_bytes_from_config(gqa) == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_from_config({"model_type": "x"}) is None


# --- layouts of several instances: every instance counts ----------------------------------
# Each instance with the ranks and GPUs it brings, by docs/planner.md ("The model"): a
# prefill instance is one rank of its tp_size GPUs (dp_size replicas: one rank each); a
# decode instance of tp_size GPUs with attention DP d is d ranks over those GPUs.
def _p(tp, dp=1):
    return ({"tp_size": tp, "dp_size": dp}, dp, tp * dp)


def _d(tp, adp=1):
    return ({"tp_size": tp, "attn_dp_size": adp}, adp if adp > 1 else 1, tp)


MULTI = {  # name -> (prefill instances, decode instances), each (instance, its ranks, its GPUs)
    "2P1D": ([_p(2), _p(2)], [_d(4, 4)]),
    "1P2D": ([_p(4)], [_d(2, 2), _d(2, 2)]),
    "2P2D": ([_p(2), _p(2)], [_d(2, 2), _d(2, 2)]),
    "3P1D": ([_p(2), _p(2), _p(2)], [_d(2, 2)]),
    "1P4D": ([_p(4)], [_d(1), _d(1), _d(1), _d(1)]),
    # uneven: prefill TP4, TP2 and 2 replicas of TP1; decode TP4 DP4, TP2 without attention DP, TP2 DP2
    "uneven": ([_p(4), _p(2), _p(1, dp=2)], [_d(4, 4), _d(2), _d(2, 2)]),
}


def _sum_pool(entries, batch_limit=None):
    return Pool(ranks=sum(r for _, r, _ in entries), gpus=sum(g for _, _, g in entries), batch_limit=batch_limit)


@pytest.mark.parametrize("name", sorted(MULTI))
def test_pool_of_counts_every_instance(name):
    for entries in MULTI[name]:
        insts = [i for i, _, _ in entries]
        for inst, ranks, gpus in entries:
            assert pool_of([inst]) == Pool(ranks=ranks, gpus=gpus)
        assert pool_of(insts) == _sum_pool(entries)
        assert pool_of(list(reversed(insts))) == _sum_pool(entries)  # no instance is special
        # the instance count is exact: without its last instance the pool is that much smaller
        if len(entries) > 1:
            assert pool_of(insts[:-1]) == _sum_pool(entries[:-1]) != pool_of(insts)
        # a batch limit per instance: the pool takes the smallest (the first rank to fill)
        limits = list(range(10, 10 + len(insts)))
        assert pool_of(insts, limits) == _sum_pool(entries, batch_limit=10)


@pytest.mark.parametrize("name", sorted(MULTI))
def test_bench_layouts_of_several_instances_are_read_whole(name):
    prefill, decode = MULTI[name]
    doc = bench_doc(8, layout__prefill=[i for i, _, _ in prefill], layout__decode=[i for i, _, _ in decode])
    assert run_from_bench(doc, name).shape == Shape(prefill=_sum_pool(prefill), decode=_sum_pool(decode))


@pytest.mark.parametrize("name", sorted(MULTI))
def test_capacity_is_the_sum_over_instances(name):
    # prefill: each instance carries its GPUs / (I tau) requests/s; decode: each its ranks /
    # (steps gamma). A layout carries the sum of what its instances carry alone.
    p = Params(tau=1e-3, beta=0.01, gamma=0.002, delta=0.02, kv_s_per_token=1e-6)
    w = Workload(input_len=300, output_len=51, concurrency=64)
    prefill, decode = MULTI[name]
    shape = Shape(prefill=pool_of([i for i, _, _ in prefill]), decode=pool_of([i for i, _, _ in decode]))
    caps = capacities(shape, p, w)
    assert caps["prefill"] == pytest.approx(sum(g / (300 * 1e-3) for _, _, g in prefill), rel=1e-12)
    assert caps["decode"] == pytest.approx(sum(r / (50 * 0.002) for _, r, _ in decode), rel=1e-12)
    alone_p = [capacities(Shape(prefill=pool_of([i]), decode=shape.decode), p, w)["prefill"] for i, _, _ in prefill]
    alone_d = [capacities(Shape(prefill=shape.prefill, decode=pool_of([i])), p, w)["decode"] for i, _, _ in decode]
    assert caps["prefill"] == pytest.approx(sum(alone_p), rel=1e-12)
    assert caps["decode"] == pytest.approx(sum(alone_d), rel=1e-12)
    # offered more than it can carry (open loop), the layout serves exactly its smaller sum
    over = predict(shape, p, Workload(input_len=300, output_len=51, rate=10 * (caps["prefill"] + caps["decode"])))
    assert over.request_s == pytest.approx(min(caps["prefill"], caps["decode"]), rel=1e-9)
    assert over.bottleneck == min(caps, key=caps.get)


def test_a_second_decode_instance_doubles_decode_capacity_exactly():
    # 1P2D (two TP2 DP2 decode instances) against 1P1D with one of them: the decode pool
    # carries exactly twice the load, and at twice the rate every decode rank runs exactly
    # as the lone instance's do (same batch, same ITL); a dropped instance halves it.
    p = Params(tau=1e-6, beta=0.01, gamma=0.002, delta=0.0, kv_s_per_token=0.0)
    one_d = [_d(2, 2)[0]]
    two_d = [_d(2, 2)[0], _d(2, 2)[0]]
    pre = pool_of([_p(4)[0]])
    one, two = Shape(pre, pool_of(one_d)), Shape(pre, pool_of(two_d))
    w = Workload(input_len=100, output_len=11, rate=1.0)
    assert capacities(two, p, w)["decode"] == pytest.approx(2 * capacities(one, p, w)["decode"], rel=1e-12)
    for rate in (20.0, 60.0, 90.0):
        lone = predict(one, p, Workload(100, 11, rate=rate))
        both = predict(two, p, Workload(100, 11, rate=2 * rate))
        assert both.decode_batch == pytest.approx(lone.decode_batch, rel=1e-12)
        assert both.itl_s == pytest.approx(lone.itl_s, rel=1e-12)
        assert both.request_s == 2 * lone.request_s
    saturated = Workload(100, 11, concurrency=100_000)
    assert predict(two, p, saturated).request_s == pytest.approx(2 * predict(one, p, saturated).request_s, rel=1e-3)


def test_the_planners_candidates_are_counted_like_measured_layouts():
    # the command ranks candidates (planner_layouts.Inst) through _shape; measured layouts
    # are read through pool_of: both count every instance, the same way
    for cand in planner_layouts.enumerate_layouts(8, "moe_mla"):
        want_d = Pool(ranks=sum(i.attn_dp_size for i in cand.decode), gpus=sum(len(i.gpus) for i in cand.decode))
        shape = _shape(cand, None)
        assert shape.decode == want_d, cand.label()
        if cand.colocated:
            assert shape.prefill is None
        else:
            assert shape.prefill == Pool(ranks=len(cand.prefill), gpus=sum(len(i.gpus) for i in cand.prefill))
    uneven = Candidate(prefill=(Inst((0, 1, 2, 3), 4), Inst((4,), 1)),
                       decode=(Inst((5,), 1), Inst((6, 7), 2, attn_dp_size=2)))
    assert _shape(uneven, 32) == Shape(prefill=Pool(ranks=1 + 1, gpus=4 + 1, batch_limit=32),
                                       decode=Pool(ranks=1 + 2, gpus=1 + 2, batch_limit=32))
    dicts = [{"tp_size": i.tp_size, "attn_dp_size": i.attn_dp_size} for i in uneven.decode]
    assert _shape(uneven, None).decode == pool_of(dicts)


# --- fitting -------------------------------------------------------------------------------
def test_fit_recovers_the_rates_of_runs_it_did_not_make():
    runs = [run_from_bench(bench_doc(c), f"c{c}") for c in (8, 32)]
    got = fit(runs, TRUE.kv_s_per_token)
    assert got.beta == pytest.approx(TRUE.beta, rel=1e-6)
    assert got.gamma == pytest.approx(TRUE.gamma, rel=1e-6)
    assert got.tau == pytest.approx(TRUE.tau, rel=0.03)
    assert got.delta == pytest.approx(TRUE.delta, abs=0.003)
    # and so it predicts another layout like the true rates do
    other = Shape(prefill=Pool(ranks=2, gpus=4), decode=Pool(ranks=2, gpus=4))
    w = Workload(256, 64, concurrency=24)
    assert predict(other, got, w).request_s == pytest.approx(predict(other, TRUE, w).request_s, rel=0.02)


def test_one_batch_size_cannot_separate_the_decode_terms():
    runs = [run_from_bench(bench_doc(16), "a"), run_from_bench(bench_doc(16), "b")]
    with pytest.raises(MeasurementError, match="two runs with different batches"):
        fit(runs, 0.0)


# --- layouts -------------------------------------------------------------------------------
def test_layouts_cover_the_gpus_once_with_power_of_two_instances():
    cands = list(planner_layouts.enumerate_layouts(8, "moe_mla"))
    labels = {c.label() for c in cands}
    assert "1P1D  P 1x TP4 | D 1x TP4 DP4 EP4" in labels and "2P1D  P 2x TP2 | D 1x TP4 DP4" in labels
    assert "1P2D  P 1x TP4 | D 2x TP2 DP2 EP2" in labels and "colocated 1x TP8 DP8" in labels
    for c in cands:
        gpus = [g for inst in c.prefill + c.decode for g in inst.gpus]
        assert sorted(gpus) == list(range(8)), c.label()
        for inst in c.prefill + c.decode:
            assert inst.tp_size == len(inst.gpus) and inst.tp_size & (inst.tp_size - 1) == 0
            assert inst.ep_size in (1, inst.tp_size) and inst.tp_size % inst.attn_dp_size == 0
        assert all(i.attn_dp_size == 1 and i.ep_size == 1 for i in c.prefill)
    assert all(i.ep_size == 1 for c in planner_layouts.enumerate_layouts(8, "dense") for i in c.decode)


def test_what_the_plan_refuses_is_never_deployable(monkeypatch):
    variables = load_inventory(DEMO).variables

    def refusing(trial, host="node", inventory=None, inventory_dir=None):  # refuses every TP-1 decode
        for i, inst in enumerate(trial["pdnode_decode_instances"]):
            if inst["tp_size"] == 1:
                raise PlanError([Problem(rule_id="test", field=f"pdnode_decode_instances[{i}].tp_size", value=1,
                                         rule="too small", fix="use 2")])
        return build_plan(trial, host, inventory, inventory_dir)

    monkeypatch.setattr(planner_layouts, "build_plan", refusing)
    judged = [planner_layouts.judge(c, variables, "pdnode-demo")
              for c in planner_layouts.enumerate_layouts(8, "moe_mla")]
    tp1 = [c for c in judged if not c.colocated and c.decode[0].tp_size == 1]
    assert tp1 and all(not c.deployable for c in tp1)
    assert all(c.rejected.startswith("pdnode_decode_instances[0].tp_size=1: too small") for c in tp1)
    assert all(not c.deployable and "not deployable" in c.rejected for c in judged if c.colocated)
    # every layout called deployable is one the real plan accepts
    deployable = [c for c in judged if c.deployable]
    assert deployable
    for c in deployable:
        build_plan(c.variables, "pdnode-demo")


# --- the command ---------------------------------------------------------------------------
def test_plan_ranks_and_writes_group_vars_that_pdnode_check_accepts(bench_files, tmp_path, capsys):
    inv = tmp_path / "inv"
    shutil.copytree(DEMO, inv)
    out = inv / "host_vars" / "pdnode-demo.yml"
    out.parent.mkdir(exist_ok=True)
    argv = ["plan", str(inv), "--measurements", bench_files[0], "--measurements", bench_files[1], "--write", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "1P1D  P 1x TP4 | D 1x TP4 DP4" in text and "colocated (not deployable by this bundle)" in text
    assert "(+0.0%)" in text or "(-0.0%)" in text  # the fit reproduces the measured runs
    written = yaml.safe_load(out.read_text())
    assert set(written) == {"pdnode_prefill_instances", "pdnode_decode_instances"}
    # the host_vars file overrides the group's instances: the merged inventory is valid
    assert main(["check", str(inv)]) == 0
    capsys.readouterr()
    merged = load_inventory(inv).variables
    assert merged["pdnode_decode_instances"] == written["pdnode_decode_instances"]
    assert main(["plan", str(inv), "--measurements", bench_files[0], "--measurements", bench_files[1],
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "pdnode.planner/1" and report["best_instances"] == written
    assert all(c["deployable"] is False for c in report["candidates"] if c["kind"] == "colocated")


def test_ttft_limit_marks_layouts_and_none_left_is_exit_1(bench_files, capsys):
    argv = ["plan", str(DEMO), "--measurements", bench_files[0], "--measurements", bench_files[1],
            "--ttft-max", "0.000001"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "misses TTFT" in captured.out
    assert captured.err.strip().count("\n") == 0 and "no deployable layout meets the limits" in captured.err


@pytest.mark.parametrize(("content", "expected"), [
    ("{not json", "not JSON"),
    (json.dumps({"schema": "other/1"}), "schema='other/1' is not 'pdnode.bench/1'"),
    (json.dumps(bench_doc(8, results__ttft_s={"p50": 0.1})), "results.ttft_s.mean is missing"),
    (json.dumps(bench_doc(8, results__request_throughput=-1)), "results.request_throughput=-1 must be a number > 0"),
    (json.dumps(bench_doc(8, results__failed=50)), "results.failed=50 of 550 requests"),
    (json.dumps(bench_doc(8, layout__decode=[])), "layout.decode must be a non-empty list"),
    (json.dumps(bench_doc(8, layout__prefill=[{"tp_size": "4"}])), "layout.prefill[0].tp_size='4'"),
])
def test_bad_measurements_are_one_line_exit_1(tmp_path, capsys, content, expected):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(bench_doc(32)))
    assert main(["plan", str(DEMO), "--measurements", str(good), "--measurements", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and str(bad) in err, err


def test_unreadable_measurements_exit_2(tmp_path, capsys):
    assert main(["plan", str(DEMO), "--measurements", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read --measurements" in err


@pytest.mark.parametrize("flag", [["--concurrency", "0"], ["--rate", "-2"], ["--output-len", "1"]])
def test_bad_flags_are_one_line_exit_1(bench_files, capsys, flag):
    assert main(["plan", str(DEMO), "--measurements", bench_files[0], *flag]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag[0] in err


def test_runs_are_read_into_shapes():
    run: Run = run_from_bench(bench_doc(8), "x")
    assert run.shape.prefill == Pool(ranks=1, gpus=4) and run.shape.decode == Pool(ranks=4, gpus=4)
    assert run.workload == Workload(256, 64, concurrency=8)
    # lengths drawn from half to the full length: the model takes their mean
    assert run_from_bench(bench_doc(8, workload__range_ratio=0.5), "x").workload == Workload(192, 48, concurrency=8)
    replicas = bench_doc(8, layout__prefill=[{"tp_size": 2, "dp_size": 2}])
    assert run_from_bench(replicas, "x").shape.prefill == Pool(ranks=2, gpus=4)


def test_written_instances_keep_the_inventorys_extra_args_and_pass_yamllint(bench_files, tmp_path, capsys):
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "gpu01-2p1d", inv)
    host = load_inventory(inv).host
    out = inv / "host_vars" / f"{host}.yml"
    out.parent.mkdir(exist_ok=True)
    assert main(["plan", str(inv), "--measurements", bench_files[0], "--measurements", bench_files[1],
                 "--write", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    carried = load_inventory(ROOT / "inventories" / "gpu01-2p1d").variables["pdnode_prefill_instances"][0]["extra_args"]
    assert all(e["extra_args"] == carried for e in written["pdnode_prefill_instances"])
    assert main(["check", str(inv)]) == 0
    lint = subprocess.run([str(ROOT / ".venv" / "bin" / "yamllint"), "-s", "-c", str(ROOT / ".yamllint"), str(out)],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize(("inventory", "changes", "path", "link"), [
    ("gpu01", {}, "nvlink", 385.0),
    ("gpu01", {"pdnode_kv_intranode_nvlink": False, "pdnode_transfer_backend": "mooncake_tcp",
               "pdnode_ib_devices": None}, "tcp", 1.8),
    ("demo", {}, "nvlink", 1.8),  # the stand-in's bytes cross loopback: no faster than TCP
    ("demo", {"pdnode_kv_intranode_nvlink": False}, "tcp", 1.8),
])
def test_the_hand_off_term_is_the_plans_path(bench_files, tmp_path, capsys, inventory, changes, path, link):
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / inventory, inv)
    extra = inv / "group_vars" / "all" / "zz-kv.yml"
    extra.write_text(yaml.safe_dump(changes) if changes else "---\n")
    argv = ["plan", str(inv), "--measurements", bench_files[0], "--measurements", bench_files[1], "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kv_handoff"]["path"] == path and report["kv_handoff"]["link_gb_s"] == link
