"""`pdnode plan` with NVIDIA aiconfigurator's prior (pdnode.core.planner.prior, docs/planner.md).

The prior's numbers are aiconfigurator's own: each ranked layout is compared with
`cli_estimate` called here with the parallel sizes spelled out from the layout. What
pdnode adds is checked by hand: the KV hand-off over the plan's path, the batches written
as SGLang reads them, the calibration to bench runs. aiconfigurator is the `prior` extra
of the dev toolchain: without it these tests fail (never skip). Nothing here may reach the
network: aiconfigurator fetches an unknown model's config.json from the hub, which pdnode
must never let it try, so every connection attempt of this module is refused and counted.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from pdnode.commands.cli import main
from pdnode.core.planner import prior
from pdnode.core.plan.kv_path import SPEEDS

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "h200_sxm"
ISL, OSL = 4000, 1000
MOE = "Qwen/Qwen3-30B-A3B-FP8"
# HF id, pdnode_model_kind, weights GB (the checkpoint's size, rounded up)
MODELS = {MOE: ("moe", 32), "Qwen/Qwen3-32B-FP8": ("dense", 34), "meta-llama/Meta-Llama-3.1-8B": ("dense", 17)}
# Fewer decode batches than the default grid: the same code, a third of the estimates.
FAST = ["--batch-limit-per-rank", "16"]
ATTEMPTS: list[tuple] = []


@pytest.fixture(scope="module", autouse=True)
def no_network():
    """Every connection of this module's process is refused and recorded."""
    def refuse(*args, **kwargs):
        ATTEMPTS.append(args[:2])
        raise OSError("the network is blocked in tests/test_planner_prior.py")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket.socket, "connect_ex", refuse)
        mp.setattr(socket, "create_connection", refuse)
        yield
    assert not ATTEMPTS, f"something tried to connect: {ATTEMPTS}"


@pytest.fixture(autouse=True)
def nothing_connected():
    yield
    assert not ATTEMPTS, f"something tried to connect: {ATTEMPTS}"


def inventory(tmp: Path, model: str, **over) -> Path:
    """inventories/gpu01 serving MODEL (a later group_vars file overrides the model)."""
    inv = tmp / "inv"
    shutil.copytree(ROOT / "inventories" / "gpu01", inv)
    kind, weights = MODELS[model]
    values = {"pdnode_model_path": f"/models/{model.split('/')[1]}", "pdnode_model_kind": kind,
              "pdnode_model_weights_gb": weights, **over}
    (inv / "group_vars" / "all" / "zz-model.yml").write_text(yaml.safe_dump(values))
    return inv


@pytest.fixture(scope="module")
def moe_inv(tmp_path_factory):
    return inventory(tmp_path_factory.mktemp("moe"), MOE)


def plan_json(capsys, *argv) -> dict:
    assert main(["plan", *map(str, argv), "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def reference(model: str, cand: dict, moe: bool, pb: int, db: int):
    """cli_estimate for a candidate of the JSON, its sizes spelled out from pdnode's
    instances: a decode instance of tp_size t with attention DP d is d ranks of TP t/d;
    experts over the same t GPUs, ep_size of them (moe_tp = t / ep); prefill plain TP."""
    from aiconfigurator.cli.api import cli_estimate

    p, d = cand["instances"]["prefill"], cand["instances"]["decode"]
    kw = {"prefill_tp_size": p["tp_size"], "prefill_attention_dp_size": 1, "prefill_num_workers": p["count"],
          "decode_tp_size": d["tp_size"] // d["attn_dp_size"], "decode_attention_dp_size": d["attn_dp_size"],
          "decode_num_workers": d["count"]}
    if moe:
        kw.update(prefill_moe_tp_size=p["tp_size"], prefill_moe_ep_size=1, decode_moe_ep_size=d["ep_size"],
                  decode_moe_tp_size=d["tp_size"] // d["ep_size"])
    return cli_estimate(model, SYSTEM, mode="disagg", backend_name="sglang", backend_version="0.5.14", isl=ISL,
                        osl=OSL, prefill_batch_size=pb, decode_batch_size=db, **kw)


def exact(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


# --- the prior's numbers are aiconfigurator's ---------------------------------------------------
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_ranked_layout_is_cli_estimates_own(tmp_path, capsys, model):
    moe = MODELS[model][0] == "moe"
    report = plan_json(capsys, inventory(tmp_path, model), "--isl", ISL, "--osl", OSL, *FAST)
    assert report["schema"] == "pdnode.planner-prior/1" and report["mode"] == "prior"
    assert report["prior"]["model"] == model  # found by pdnode_model_path's name
    ranked = [c for c in report["candidates"] if c["prediction"]]
    assert len(ranked) >= 10
    for cand in ranked[:3] + ranked[-1:]:
        pred, pb, db = cand["prediction"], cand["prefill_batch"], cand["decode_batch_per_rank"]
        ref = reference(model, cand, moe, pb, db)
        assert exact(pred["prior_ttft_s"], ref.ttft / 1e3), cand["layout"]
        assert exact(pred["tpot_s"], ref.tpot / 1e3), cand["layout"]
        assert exact(pred["request_throughput"], ref.seq_per_second), cand["layout"]
        assert exact(pred["output_tok_s_per_gpu"], ref.tokens_per_second_per_gpu), cand["layout"]
        assert pred["gpus"] == ref.num_total_gpus == 8
        assert pred["database_sglang"] == ref.backend_version == "0.5.14"
        assert pb in report["prior"]["batches"]["prefill"] and db in (1, 2, 4, 8, 16)
    # ranked by output tokens/s per GPU (to 4 significant digits; ties to the lower TTFT)
    per_gpu = [float(f"{c['prediction']['output_tok_s_per_gpu']:.4g}") for c in ranked]
    assert per_gpu == sorted(per_gpu, reverse=True)


def test_the_chosen_batches_are_the_best_of_the_grid(moe_inv, capsys):
    # every pair of the grid, asked of aiconfigurator directly: none serves more within the limits
    report = plan_json(capsys, moe_inv, "--isl", ISL, "--osl", OSL, "--ttft-max", "0.15", "--tpot-max", "0.012",
                       "--batch-limit-per-rank", "32")
    best = next(c for c in report["candidates"] if c["layout"] == report["best"])
    kv = best["prediction"]["kv_handoff_s"]
    top = 0.0
    for pb in report["prior"]["batches"]["prefill"]:
        for db in (1, 2, 4, 8, 16, 32):
            try:
                ref = reference(MOE, best, True, pb, db)
            except Exception:  # noqa: BLE001,S112 - a pair that does not fit is no rival
                continue
            if ref.ttft / 1e3 + kv <= 0.15 and ref.tpot / 1e3 <= 0.012:
                top = max(top, ref.tokens_per_second_per_gpu)
    assert best["prediction"]["output_tok_s_per_gpu"] == pytest.approx(top, rel=1e-4)
    assert best["prediction"]["ttft_s"] <= 0.15 and best["prediction"]["tpot_s"] <= 0.012


# --- what pdnode adds: the KV hand-off ----------------------------------------------------------
@pytest.mark.parametrize(("changes", "path"), [
    ({}, "nvlink"),
    ({"pdnode_kv_intranode_nvlink": False, "pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None},
     "tcp"),
])
def test_the_hand_off_is_kv_bytes_times_input_over_the_plans_path(tmp_path, capsys, changes, path):
    # Qwen3-30B-A3B: 48 layers, 4 KV heads of 128, a key and a value of 2 bytes each
    per_token = 2 * 48 * 4 * 128 * 2
    assert prior.kv_bytes_per_token(MOE) == per_token
    report = plan_json(capsys, inventory(tmp_path, MOE, **changes), "--isl", ISL, "--osl", OSL, *FAST)
    assert report["kv_handoff"]["bytes_per_token"] == per_token
    ranked = [c for c in report["candidates"] if c["prediction"]]
    for cand in ranked:
        pred = cand["prediction"]
        assert cand["kv_path"] == path
        assert pred["kv_handoff_s"] == pytest.approx(per_token * ISL / (SPEEDS[path][0] * 1e9), rel=1e-12)
        assert pred["ttft_s"] == pytest.approx(pred["prior_ttft_s"] + pred["kv_handoff_s"], rel=1e-12)


def test_kv_bytes_from_the_inventorys_config_come_first(tmp_path, capsys):
    cfg = tmp_path / "model"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"num_hidden_layers": 10, "num_attention_heads": 8,
                                                 "num_key_value_heads": 2, "head_dim": 64}))
    report = plan_json(capsys, inventory(tmp_path, MOE, pdnode_model_controller_path=str(cfg)), "--isl", ISL,
                       "--osl", OSL, *FAST)
    assert report["kv_handoff"]["bytes_per_token"] == 2 * 10 * 2 * 64 * 2


# --- the command --------------------------------------------------------------------------------
def test_prior_ranks_and_writes_what_pdnode_check_accepts(moe_inv, tmp_path, capsys):
    inv = tmp_path / "inv"
    shutil.copytree(moe_inv, inv)
    out = inv / "host_vars" / "gpu01.yml"
    out.parent.mkdir(exist_ok=True)
    filters = warnings.filters[:]
    levels = {n: logging.getLogger(n).level for n in ("aiconfigurator", "aiconfigurator_core")}
    assert main(["plan", str(inv), "--isl", str(ISL), "--osl", str(OSL), "--write", str(out)]) == 0
    text = capsys.readouterr().out
    assert "prior: aiconfigurator 0.12.0, its SGLang 0.5.14 database" in text and "deploys SGLang 0.5.23" in text
    assert "P bs  D bs/rank  TTFT" in text and "best deployable:" in text
    # the prefill TP4 layouts split the FP8 experts below their block: aiconfigurator says so
    assert "aiconfigurator: Invalid quantized MoE configuration" in text
    # aiconfigurator's state is as it was: its scales, its loggers, the warnings filters
    from aiconfigurator.cli import api

    assert (api.DEFAULT_PREFILL_LATENCY_CORRECTION_SCALE, api.DEFAULT_DECODE_LATENCY_CORRECTION_SCALE) == (1.1, 1.08)
    assert warnings.filters == filters
    assert {n: logging.getLogger(n).level for n in levels} == levels
    written = yaml.safe_load(out.read_text())
    decode = written["pdnode_decode_instances"]
    for entry in decode:
        extra = entry["extra_args"]
        # SGLang 0.5.23 splits max_running_requests over the attention-DP ranks; graphs are per rank
        assert extra["max_running_requests"] == extra["cuda_graph_max_bs_decode"] * entry.get("attn_dp_size", 1)
        assert extra["trust_remote_code"] is True  # the inventory's own extra_args stay
    for entry in written["pdnode_prefill_instances"]:
        assert entry["extra_args"] == {"trust_remote_code": True, "chunked_prefill_size": 16384}
    assert main(["check", str(inv)]) == 0, capsys.readouterr()
    capsys.readouterr()


@pytest.fixture(scope="module")
def sglang_validator() -> str:
    """The Python of SGLang's own judge (scripts/sglang-validator builds it once, as for
    tests/conformance); a failure to build it fails the test, never skips it."""
    r = subprocess.run([str(ROOT / "scripts" / "sglang-validator")], capture_output=True, text=True, timeout=3600,
                       cwd=ROOT, check=False)
    assert r.returncode == 0, f"scripts/sglang-validator could not build SGLang's validator: {r.stderr[-2000:]}"
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.conformance
def test_sglang_itself_accepts_the_written_batches(moe_inv, tmp_path, capsys, monkeypatch, sglang_validator):
    # the unit tests switch SGLang's judge off (tests/conftest.py); here pdnode check asks it
    monkeypatch.setenv("PDNODE_SGLANG_VALIDATOR", sglang_validator)
    inv = tmp_path / "inv"
    shutil.copytree(moe_inv, inv)
    out = inv / "host_vars" / "gpu01.yml"
    out.parent.mkdir(exist_ok=True)
    assert main(["plan", str(inv), "--isl", str(ISL), "--osl", str(OSL), "--write", str(out)]) == 0
    capsys.readouterr()
    assert "max_running_requests" in out.read_text()
    assert main(["check", str(inv), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and not [w for w in report["warnings"] if w["rule"] == "sglang-validation-not-run"], report


def test_the_prior_draws_its_ranking(moe_inv, tmp_path, capsys):
    picture = tmp_path / "plan.svg"
    assert main(["plan", str(moe_inv), "--isl", str(ISL), "--osl", str(OSL), *FAST, "--top", "5",
                 "--plot", str(picture)]) == 0
    capsys.readouterr()
    svg = picture.read_text()
    assert "aiconfigurator 0.12.0" in svg and "2P3D P 2x TP1 | D 3x TP2 DP2" in svg


# --- refusals: one line, an exit code, no traceback ---------------------------------------------
def one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err


def test_an_unsupported_gpu_is_one_line_naming_the_known_ones(capsys):
    # the demo's stand-in and its tiny model: no database has them
    assert main(["plan", str(ROOT / "inventories" / "demo"), "--isl", "256", "--osl", "64"]) == 1
    err = one_line(capsys)
    assert "pdnode_gpu_model='NVIDIA H200 (stand-in)'" in err and "NVIDIA H200," in err
    assert "pdnode bench --json" in err and "--measurements" in err


def test_an_unsupported_model_is_one_line_and_no_download(moe_inv, capsys):
    assert main(["plan", str(moe_inv), "--prior-model", "Qwen/Qwen2.5-7B-Instruct", "--isl", "100", "--osl", "10"]) == 1
    err = one_line(capsys)
    n = len(prior.supported_models(SYSTEM))
    assert "model 'Qwen/Qwen2.5-7B-Instruct'" in err and f"it has {n}: " in err and f"and {n - 6} more" in err
    assert "pdnode bench --json" in err


def test_a_model_path_it_does_not_know_names_prior_model(capsys):
    # gpu01 serves GLM-4.5-Air, which aiconfigurator does not list
    assert main(["plan", str(ROOT / "inventories" / "gpu01"), "--isl", "100", "--osl", "10"]) == 1
    err = one_line(capsys)
    assert "pdnode_model_path='/models/GLM-4.5-Air-FP8'" in err and "--prior-model HF_ID" in err


def test_without_the_workload_the_prior_says_which_flags(moe_inv, capsys):
    assert main(["plan", str(moe_inv)]) == 1
    assert "--isl N (--input-len) and --osl N (--output-len)" in one_line(capsys)


def test_without_aiconfigurator_it_is_exit_2_naming_the_extra(moe_inv, capsys, monkeypatch):
    prior._modules.cache_clear()
    try:
        with monkeypatch.context() as mp:
            mp.setitem(sys.modules, "aiconfigurator.cli", None)  # what an absent package imports as
            assert main(["plan", str(moe_inv), "--isl", "100", "--osl", "10"]) == 2
            err = one_line(capsys)
            assert "pip install 'pdnode[prior]'" in err and "pdnode bench --json" in err
    finally:
        prior._modules.cache_clear()
    assert prior.available()


def test_importing_pdnode_does_not_import_aiconfigurator():
    code = ("import sys, pdnode.commands.cli, pdnode.commands.planner, pdnode.core.planner.prior; "
            "sys.exit(any(m.startswith('aiconfigurator') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- calibration --------------------------------------------------------------------------------
def bench_doc(batch: int, ttft_factor: float) -> dict:
    """A pdnode.bench/1 run of 2P1D (P 2x TP2 | D 1x TP4 DP4 EP4) whose ITL and throughput
    are the prior's own at `batch` running requests per decode rank and whose TTFT is the
    prior's times ttft_factor, plus the hand-off (over NVLink, the plan's path)."""
    layout = prior.Layout(prefill_tp=2, prefill_workers=2, decode_tp=4, decode_workers=1, decode_attn_dp=4,
                          decode_ep=4)
    est = prior.estimate(MOE, SYSTEM, ISL, OSL, layout, 1, batch, moe=True)
    handoff = prior.kv_bytes_per_token(MOE) * ISL / (SPEEDS["nvlink"][0] * 1e9)
    throughput = batch * 4 / ((OSL - 1) * est.tpot_s)  # Little's law over the 4 decode ranks
    return {
        "schema": "pdnode.bench/1", "host": "gpu01", "client": {},
        "layout": {"prefill": [{"id": f"prefill-{i}", "gpus": [2 * i, 2 * i + 1], "tp_size": 2, "dp_size": 1,
                                "attn_dp_size": 1, "ep_size": 1} for i in range(2)],
                   "decode": [{"id": "decode-0", "gpus": [4, 5, 6, 7], "tp_size": 4, "dp_size": 1,
                               "attn_dp_size": 4, "ep_size": 4}]},
        "workload": {"requests": 500, "concurrency": batch * 4, "rate": None, "input_len": ISL, "output_len": OSL,
                     "range_ratio": 1.0},
        "results": {"duration_s": 60.0, "completed": 500, "failed": 0, "request_throughput": throughput,
                    "input_token_throughput": throughput * ISL, "output_token_throughput": throughput * OSL,
                    "ttft_s": {"mean": est.ttft_s * ttft_factor + handoff, "p50": 0.1, "p99": 0.1},
                    "itl_s": {"mean": est.tpot_s, "p50": est.tpot_s, "p99": est.tpot_s},
                    "e2e_s": {"mean": 1.0, "p50": 1.0, "p99": 1.0}},
        "instances": {},
    }


def test_calibration_to_runs_twice_as_slow_to_first_token(moe_inv, tmp_path, capsys):
    runs = []
    for batch in (8, 32):
        path = tmp_path / f"c{batch}.json"
        path.write_text(json.dumps(bench_doc(batch, 2.0)))
        runs += ["--measurements", str(path)]
    report = plan_json(capsys, moe_inv, *runs, "--prior", "--isl", ISL, "--osl", OSL, *FAST)
    assert report["mode"] == "calibrated"
    assert report["correction_scales"]["prefill"] == pytest.approx(2.0, rel=1e-6)
    assert report["correction_scales"]["decode"] == pytest.approx(1.0, rel=1e-9)
    for check in report["calibration"]:
        assert check["prior"]["ttft_s"] < check["measured"]["ttft_s"]
        assert check["prior"]["tpot_s"] == pytest.approx(check["measured"]["itl_s"], rel=1e-12)
    ranked = [c for c in report["candidates"] if c["prediction"]]
    for cand in ranked[:4]:
        pred, inst = cand["prediction"], cand["instances"]
        layout = prior.Layout(prefill_tp=inst["prefill"]["tp_size"], prefill_workers=inst["prefill"]["count"],
                              decode_tp=inst["decode"]["tp_size"], decode_workers=inst["decode"]["count"],
                              decode_attn_dp=inst["decode"]["attn_dp_size"], decode_ep=inst["decode"]["ep_size"])
        plain = prior.estimate(MOE, SYSTEM, ISL, OSL, layout, cand["prefill_batch"], cand["decode_batch_per_rank"],
                               moe=True)
        # aiconfigurator rounds its milliseconds to 3 decimals
        assert pred["prior_ttft_s"] == pytest.approx(2 * plain.ttft_s, rel=1e-4)
        assert pred["tpot_s"] == pytest.approx(plain.tpot_s, rel=1e-4)
    # and the table says how far the uncalibrated prior was from each run
    assert main(["plan", str(moe_inv), *runs, "--prior", "--isl", str(ISL), "--osl", str(OSL), *FAST]) == 0
    text = capsys.readouterr().out
    assert text.count("prior vs ") == 2 and "calibrated: latencies x 2.000 (prefill) and x 1.000 (decode)" in text
    assert "(+0.0%), " in text  # the TPOT the runs measured is the prior's own


def test_the_calibrated_picture_shows_the_measured_runs_beside_the_prior(moe_inv, tmp_path, capsys):
    runs = []
    for batch in (8, 32):
        path = tmp_path / f"c{batch}.json"
        path.write_text(json.dumps(bench_doc(batch, 2.0)))
        runs += ["--measurements", str(path)]
    picture = tmp_path / "plan.svg"
    assert main(["plan", str(moe_inv), *runs, "--prior", "--isl", str(ISL), "--osl", str(OSL), *FAST, "--top", "3",
                 "--plot", str(picture)]) == 0
    capsys.readouterr()
    svg = picture.read_text()
    # both runs listed by file with what they measured, and the legend's marker for them
    assert "m1  c8.json  measured" in svg and "m2  c32.json  measured" in svg and "measured (bench)" in svg
    # without measurements (the prior alone) there is nothing measured to draw
    alone = tmp_path / "alone.svg"
    assert main(["plan", str(moe_inv), "--isl", str(ISL), "--osl", str(OSL), *FAST, "--top", "3",
                 "--plot", str(alone)]) == 0
    assert "measured (bench)" not in alone.read_text()


def test_the_prior_takes_the_model_from_an_hf_source(tmp_path, capsys):
    from pdnode.core.inventory.model_source import Lock, ManifestFile

    # a model directory named otherwise: only the source says which model it is
    inv = inventory(tmp_path, MOE, pdnode_model_path="/models/served", pdnode_model_source=f"hf://{MOE}@main")
    (inv / ".model.lock.json").write_text(Lock(f"hf://{MOE}@main", MOE, "main", "7" * 40, (
        ManifestFile("config.json", 1000, None), ManifestFile("model.safetensors", 31_000_000_000, "8" * 64))).text())
    doc = plan_json(capsys, inv, "--isl", "100", "--osl", "10")
    assert MOE in json.dumps(doc)
