"""`pdnode plan INVENTORY [--measurements BENCH.json ...] [--prior]`: which split of the
host's GPUs into prefill and decode instances serves a workload best (docs/planner.md).

Measured (--measurements): it fits the engine's rates to `pdnode bench --json` runs
(planner_model.py). Prior (no --measurements): NVIDIA aiconfigurator's SGLang database
estimates each layout at its best batch sizes (core/planner/prior.py), before any GPU hour;
calibrated (--measurements with --prior): the prior's latencies scaled to the runs.
Either way it enumerates the layouts of pdnode_gpu_count GPUs, asks the plan which it
accepts (planner_layouts.py), predicts each layout's throughput, TTFT and ITL, and prints
them ranked. `--write FILE` writes the best deployable layout as group_vars
(pdnode_prefill_instances / pdnode_decode_instances) that `pdnode check` accepts.
Exit 0 with a ranking, 1 when the input is wrong or nothing deployable remains, 2 when
a file cannot be read or written or the prior is not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.planner import prior
from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from ..core.plan.kv_path import SPEEDS, kv_bytes_from_config
from ..core.resources import controller_dir
from ..core.planner.model import (MeasurementError, Params, Pool, Prediction, Run, Shape, Workload, fit, pool_of,
                                  predict, run_from_bench)

SCHEMA = "pdnode.planner/1"
# --json of the prior and calibrated modes: other contents (batches, the prior's versions)
SCHEMA_PRIOR = "pdnode.planner-prior/1"
# Batches the prior searches per layout: prompts per prefill pass, running requests per
# decode attention-DP rank (aiconfigurator's decode batch is per rank, as SGLang's is).
PREFILL_BATCHES = (1, 2, 4, 8)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A prefill pass takes waiting prompts up to chunked_prefill_size tokens; unset, SGLang
# 0.5.23 picks 8192 on 80-160 GB GPUs (srt/arg_groups/memory_hook.py; 16384 above). A
# prefill batch of b prompts is searched only while b x input fits the pass.
DEFAULT_PREFILL_TOKENS = 8192
MEASURE_INSTEAD = "or rank from measurements: `pdnode bench --json` runs of the node, then `pdnode plan --measurements`"
# The stand-in's fake model moves PDNODE_SIM_KV_BYTES_PER_TOKEN bytes per prompt token
# (its default): a property of that model, as config.json's shapes are of a real one.
SIM_KV_BYTES_PER_TOKEN = 16384
EPILOG = """\
Measurements: two or more `pdnode bench --json` runs of the deployed node at different
concurrency (e.g. 8 and 32), so a decode step's base and per-request cost separate.
Example:
  pdnode plan inventories/demo --measurements c8.json --measurements c32.json \\
      --input-len 256 --output-len 64 --concurrency 32 --write plan.yml
Before any measurement, from aiconfigurator's database (pip install 'pdnode[prior]'):
  pdnode plan inventories/gpu01 --prior --prior-model Qwen/Qwen3-30B-A3B-FP8 --isl 4000 --osl 1000 \\
      --ttft-max 1 --tpot-max 0.05 --write plan.yml
Calibrated: --prior with --measurements scales the prior's latencies to the runs.
"""


class PlannerError(Exception):
    """Wrong input: one line, exit 1."""


def _kv_bytes(args: argparse.Namespace, settings: Mapping[str, Any], repo: Path) -> tuple[int, str]:
    if args.kv_bytes_per_token is not None:
        return args.kv_bytes_per_token, "--kv-bytes-per-token"
    if settings.get("pdnode_engine") == "sim":
        return SIM_KV_BYTES_PER_TOKEN, "the stand-in's fake model"
    path = settings.get("pdnode_model_controller_path")
    if isinstance(path, str) and path:
        cfg_file = repo / path / "config.json"  # an absolute path stays as it is (pathlib)
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = None
        value = kv_bytes_from_config(cfg) if isinstance(cfg, dict) else None
        if value:
            return value, f"{cfg_file}"
    return 0, "unknown: KV hand-off not counted (give --kv-bytes-per-token)"


def load_bench(paths: Sequence[str]) -> list[tuple[dict[str, Any], Run]]:
    """Each report with its run (the calibration reads the instances the run had)."""
    out = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise OSError(f"cannot read --measurements {path}: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise MeasurementError(f"{path}: not JSON ({exc}); Fix: save `pdnode bench --json` output") from None
        out.append((doc, run_from_bench(doc, path)))
    return out


def load_runs(paths: Sequence[str]) -> list[Run]:
    return [run for _, run in load_bench(paths)]


def _workload(args: argparse.Namespace, runs: Sequence[Run]) -> Workload:
    last = runs[-1].workload
    il = args.input_len if args.input_len is not None else last.input_len
    ol = args.output_len if args.output_len is not None else last.output_len
    if args.concurrency is None and args.rate is None:
        if last.concurrency is None and last.rate is None:
            raise PlannerError("give --concurrency C or --rate R (the last measurement names neither)")
        return Workload(il, ol, concurrency=last.concurrency, rate=None if last.concurrency else last.rate)
    return Workload(il, ol, concurrency=args.concurrency, rate=args.rate)


def _shape(cand: Any, batch_limit: int | None) -> Shape:
    """A candidate's pools, counted by the same pool_of that reads a measured layout: one
    rule for every instance of both, so the ranked layouts and the fitted ones agree."""
    def pool(insts: Sequence[Any]) -> Pool:
        return pool_of([{"tp_size": i.tp_size, "attn_dp_size": i.attn_dp_size} for i in insts],
                       [batch_limit] * len(insts))

    return Shape(prefill=pool(cand.prefill) if cand.prefill else None, decode=pool(cand.decode))


def _why(cand: Any, pred: Prediction, args: argparse.Namespace) -> str:
    if cand.rejected:
        return cand.rejected
    misses = []
    if args.ttft_max is not None and pred.ttft_s > args.ttft_max:
        misses.append(f"TTFT {_secs(pred.ttft_s)} > --ttft-max {args.ttft_max:g} s")
    if args.itl_max is not None and pred.itl_s > args.itl_max:
        misses.append(f"ITL {_secs(pred.itl_s)} > --itl-max {args.itl_max:g} s")
    if misses:
        return "misses " + "; ".join(misses)
    load = f"prefill {pred.prefill_util:.0%} busy, {pred.decode_batch:.1f} running per decode rank"
    if pred.bottleneck in ("prefill", "decode", "decode batch limit"):
        return f"limited by {pred.bottleneck}; {load}"
    return load


def _secs(v: float) -> str:
    return "unbounded" if not math.isfinite(v) else (f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s")


def _yaml_value(value: Any) -> str:
    # JSON is YAML: a carried value (extra_args, ...) is written in flow style, quoted as JSON quotes it
    return json.dumps(value)


def group_vars_yaml(entries: Mapping[str, list[dict[str, Any]]], header: Sequence[str]) -> str:
    lines = ["---"] + [f"# {h}" for h in header]
    for role in ("pdnode_prefill_instances", "pdnode_decode_instances"):
        lines.append(f"{role}:")
        for entry in entries[role]:
            first = True
            for key, value in entry.items():
                lines.append(("  - " if first else "    ") + f"{key}: {_yaml_value(value)}")
                first = False
    return "\n".join(lines) + "\n"


def write_atomic(path: str, text: str) -> None:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plan_layouts(args: argparse.Namespace) -> dict[str, Any]:
    from ..core.plan.load import load_plan
    from ..core.planner.layouts import enumerate_layouts, instance_entries, judge

    loaded = load_plan(args.inventory, args.host)  # Unplannable: pdnode's main says why
    plan, variables, host, inventory_dir = loaded.plan, loaded.variables, loaded.plan.host, loaded.inventory_dir
    settings = plan.settings
    runs = load_runs(args.measurements)
    workload = _workload(args, runs)
    repo = controller_dir()
    kv_bytes, kv_source = _kv_bytes(args, settings, repo)
    backend = str(settings.get("pdnode_transfer_backend") or "mooncake")
    # The path the plan chose (pdnode.core.plan.kv_path). The stand-in's bytes cross loopback TCP,
    # paced down to the path's speed: no faster than TCP's, slower on a slower path.
    link = args.link_gb_s if args.link_gb_s is not None else (
        plan.cluster["kv"]["gb_s"] if settings.get("pdnode_engine") == "sglang"
        else min(plan.cluster["kv"]["gb_s"], SPEEDS["tcp"][0]))
    params = fit(runs, kv_bytes / (link * 1e9))
    residuals = []
    for r in runs:
        w = Workload(r.workload.input_len, r.workload.output_len, r.workload.concurrency, r.workload.rate)
        if w.concurrency is None and w.rate is None:
            continue
        pr = predict(r.shape, params, w)
        residuals.append({"source": r.source, "measured_request_throughput": r.request_s,
                          "predicted_request_throughput": pr.request_s,
                          "error": pr.request_s / r.request_s - 1})
    candidates = []
    for cand in enumerate_layouts(int(settings["pdnode_gpu_count"]), str(settings.get("pdnode_model_kind"))):
        judge(cand, variables, host, inventory_dir)
        pred = predict(_shape(cand, args.batch_limit_per_rank), params, workload)
        candidates.append((cand, pred))
    deployable = [(c, p) for c, p in candidates if c.deployable]
    meets = [(c, p) for c, p in deployable if not _why(c, p, args).startswith("misses")]
    # Ties (to 4 significant digits) go to the lower TTFT, then to fewer instances: fewer
    # processes to run for the same predicted service.
    order = sorted(candidates, key=lambda cp: (not cp[0].deployable, _why(cp[0], cp[1], args).startswith("misses"),
                                              -float(f"{cp[1].request_s:.4g}"), float(f"{cp[1].ttft_s:.4g}"),
                                              len(cp[0].prefill) + len(cp[0].decode)))
    best = next((cp for cp in order if cp in meets), None)
    return {
        "host": host, "workload": workload, "params": params, "runs": runs, "residuals": residuals,
        "kv": {"bytes_per_token": kv_bytes, "source": kv_source, "link_gb_s": link, "backend": backend,
               "path": plan.cluster["kv"]["path"]},
        "order": order, "best": best, "variables": variables,
        "entries": instance_entries(best[0], variables) if best else None,
    }


def _report_json(res: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    w: Workload = res["workload"]
    params: Params = res["params"]
    out = {
        "schema": SCHEMA, "host": res["host"], "inventory": str(args.inventory),
        "workload": {"input_len": w.input_len, "output_len": w.output_len, "concurrency": w.concurrency,
                     "rate": w.rate},
        "rates": params.as_dict(), "kv_handoff": res["kv"], "fit": res["residuals"],
        "candidates": [], "best": res["best"][0].label() if res["best"] else None,
        "best_instances": res["entries"],
    }
    for cand, pred in res["order"]:
        out["candidates"].append({
            "layout": cand.label(), "kind": "colocated" if cand.colocated else "pd",
            "deployable": cand.deployable, "rejected": cand.rejected, "kv_path": cand.kv_path,
            "why": _why(cand, pred, args),
            "prediction": {k: (v if not isinstance(v, float) or math.isfinite(v) else None)
                           for k, v in pred.as_dict().items()},
        })
    return out


def _print_table(res: Mapping[str, Any], args: argparse.Namespace) -> None:
    w: Workload = res["workload"]
    p: Params = res["params"]
    load = f"concurrency {w.concurrency}" if w.concurrency else f"rate {w.rate:g} req/s"
    print(f"host {res['host']}: input {w.input_len}, output {w.output_len} tokens, {load}")
    print(f"rates fitted to {len(res['runs'])} run(s): prefill {1 / p.tau:,.0f} tok/s per GPU, decode step "
          f"{p.beta * 1000:.2f} ms + {p.gamma * 1000:.3f} ms per running request, fixed TTFT "
          f"{p.delta * 1000:.1f} ms; KV {res['kv']['bytes_per_token']} B/token ({res['kv']['source']}) "
          f"over {res['kv']['link_gb_s']:g} GB/s (path {res['kv']['path']}"
          + (", the stand-in's loopback bytes: no faster than TCP" if res["variables"].get("pdnode_engine") == "sim"
             else "") + ")"
          + (f": the hand-off adds {res['kv']['bytes_per_token'] * w.input_len / (res['kv']['link_gb_s'] * 1e6):.1f} "
             f"ms to each {w.input_len}-token prompt's TTFT" if res["kv"]["bytes_per_token"] else ""))
    for r in res["residuals"]:
        print(f"  fit check {r['source']}: measured {r['measured_request_throughput']:.2f} req/s, "
              f"model {r['predicted_request_throughput']:.2f} ({r['error']:+.1%})")
    rows = [("#", "layout", "req/s", "out tok/s", "TTFT", "ITL", "why")]
    shown = 0
    rejected: Counter[str] = Counter()
    colocated_best: list[tuple[Any, Prediction]] = []
    for cand, pred in res["order"]:
        if cand.colocated:
            if len(colocated_best) < 3:
                colocated_best.append((cand, pred))
            continue
        if not cand.deployable:
            rejected[cand.rejected or "?"] += 1
            continue
        if shown < args.top:
            shown += 1
            rows.append((str(shown), cand.label(), f"{pred.request_s:.2f}", f"{pred.output_tok_s:,.0f}",
                         _secs(pred.ttft_s), _secs(pred.itl_s), _why(cand, pred, args)))
    for cand, pred in sorted(colocated_best, key=lambda cp: -cp[1].request_s):
        rows.append(("-", cand.label(), f"{pred.request_s:.2f}", f"{pred.output_tok_s:,.0f}",
                     _secs(pred.ttft_s), _secs(pred.itl_s), "colocated (not deployable by this bundle)"))
    _print_ranking(rows, rejected, "the plan", res["best"][0].label() if res["best"] else None)


def _print_ranking(rows: Sequence[Sequence[str]], rejected: Counter[str], by: str, best: str | None) -> None:
    """The ranked table (its last column unpadded), the rejections' commonest reasons, the choice."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(wd) for c, wd in zip(row[:-1], widths)) + "  " + row[-1])
        if i == 0:
            print("  ".join("-" * wd for wd in widths) + "  ---")
    if rejected:
        print(f"rejected by {by}: {sum(rejected.values())} layout(s)")
        for reason, n in rejected.most_common(5):
            print(f"  {n} x {reason}")
    if best:
        print(f"best deployable: {best}")


def plot_points(res: Mapping[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """What the picture shows: the table's rows (the ranked deployable layouts, then the
    best colocated ones for comparison), each with the KV path the plan chose for it."""
    points: list[dict[str, Any]] = []
    colocated = sorted(((c, p) for c, p in res["order"] if c.colocated), key=lambda cp: -cp[1].request_s)[:3]
    ranked = [(c, p) for c, p in res["order"] if c.deployable][:args.top]
    for i, (cand, pred) in enumerate(ranked + colocated):
        points.append({"rank": i + 1 if i < len(ranked) else f"c{i - len(ranked) + 1}",
                       "label": " ".join(cand.label().split()), "path": cand.kv_path,
                       "request_s": pred.request_s, "ttft_s": pred.ttft_s, "colocated": cand.colocated,
                       "best": res["best"] is not None and cand is res["best"][0],
                       "misses": _why(cand, pred, args).startswith("misses")})
    return points


def write_plot(res: Mapping[str, Any], args: argparse.Namespace) -> None:
    from . import plot

    w: Workload = res["workload"]
    load = f"concurrency {w.concurrency}" if w.concurrency else f"rate {w.rate:g} req/s"
    title = (f"pdnode plan {res['host']}: layouts ranked for input {w.input_len}, output {w.output_len} tokens, "
             f"{load} (predicted from {len(res['runs'])} bench run(s))")
    plot.save(plot.plan_figure(plot_points(res, args), title, args.ttft_max), args.plot)


# --- the prior: aiconfigurator's estimate, before (or scaled to) measurements ----------------

@dataclass
class PriorRow:
    """One enumerated layout in the prior's ranking: its choice of batches, or why not."""

    cand: Any  # planner_layouts.Candidate
    choice: prior.Choice | None = None
    rejected: str | None = None  # the plan's reason, or the prior's ("aiconfigurator: ...")
    link_gb_s: float | None = None
    handoff_s: float = 0.0

    def why(self, args: argparse.Namespace) -> str:
        if self.choice is None:
            return self.rejected or "?"
        c = self.choice
        misses = []
        if c.misses_ttft:
            misses.append(f"TTFT {_secs(c.ttft_s)} > --ttft-max {args.ttft_max:g} s")
        if c.misses_tpot:
            misses.append(f"TPOT {_secs(c.estimate.tpot_s)} > --tpot-max {args.itl_max:g} s")
        if misses:
            return "misses " + "; ".join(misses)
        return f"limited by {c.bottleneck}; hand-off {_secs(self.handoff_s)} over {self.cand.kv_path}"


def _prior_model(args: argparse.Namespace, settings: Mapping[str, Any], system: str, version: str,
                 model: Mapping[str, Any] | None = None) -> str:
    """--prior-model, else the hf:// source's repository (the plan's model), else the
    supported HF id named like pdnode_model_path's directory."""
    if args.prior_model:
        prior.check_model(args.prior_model, system, version)
        return args.prior_model
    repo = (model or {}).get("repo")
    if repo:
        prior.check_model(repo, system, version)
        return str(repo)
    path = str(settings.get("pdnode_model_path") or "")
    found = prior.model_for_path(path, system, version)
    if found is None:
        models = list(prior.supported_models(system, version))
        raise PlannerError(f"pdnode_model_path={path!r}: no model of aiconfigurator's {system} SGLang database is "
                           f"named {path.rstrip('/').rsplit('/', 1)[-1]!r}; give --prior-model HF_ID, one of its "
                           f"{len(models)}: {prior.short_list(models)}; {MEASURE_INSTEAD}")
    return found


def _prior_kv_bytes(args: argparse.Namespace, settings: Mapping[str, Any], model: str) -> tuple[int, str]:
    """--kv-bytes-per-token, else the inventory's config.json, else the one aiconfigurator
    ships for the model (aiconfigurator itself moves no KV: pdnode adds the hand-off)."""
    value, source = _kv_bytes(args, settings, controller_dir())
    if value:
        return value, source
    bundled = prior.kv_bytes_per_token(model)
    if bundled:
        return bundled, f"{model}'s config.json as aiconfigurator ships it"
    return 0, source


def _prior_layout(cand: Any) -> prior.Layout:
    return prior.Layout(prefill_tp=cand.prefill[0].tp_size, prefill_workers=len(cand.prefill),
                        decode_tp=cand.decode[0].tp_size, decode_workers=len(cand.decode),
                        decode_attn_dp=cand.decode[0].attn_dp_size, decode_ep=cand.decode[0].ep_size)


def _bench_layout(doc: Mapping[str, Any], src: str) -> prior.Layout:
    """The measured node's instances as one prior layout: aiconfigurator models one instance
    shape per role, so every prefill (and every decode) instance must have the same."""
    shapes = {}
    counts = {}
    for role in ("prefill", "decode"):
        seen = set()
        counts[role] = 0
        for i, inst in enumerate(doc["layout"][role]):
            ep = inst.get("ep_size") or 1  # run_from_bench checked the other sizes
            if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
                raise PlannerError(f"{src}: layout.{role}[{i}].ep_size={ep!r} must be an integer >= 1; Fix: use a "
                                   f"`pdnode bench --json` report")
            tp, dp, adp = (int(inst.get(k) or 1) for k in ("tp_size", "dp_size", "attn_dp_size"))
            seen.add((tp, adp, ep))
            counts[role] += 1 if adp > 1 else dp  # DP replicas without attention DP: one worker each
        if len(seen) != 1:
            raise PlannerError(f"{src}: layout.{role} has instances of {len(seen)} shapes; the prior models one shape "
                               f"per role: calibrate with runs of a layout whose {role} instances are alike")
        shapes[role] = seen.pop()
    (ptp, _, pep), (dtp, dadp, dep) = shapes["prefill"], shapes["decode"]
    return prior.Layout(prefill_tp=ptp, prefill_workers=counts["prefill"], prefill_ep=pep, decode_tp=dtp,
                        decode_workers=counts["decode"], decode_attn_dp=dadp, decode_ep=dep)


def _calibrate(bench: Sequence[tuple[dict[str, Any], Run]], ctx: Mapping[str, Any]) -> tuple[dict[str, float],
                                                                                            list[dict[str, Any]]]:
    """The prior for each run's own layout and workload, next to what the run measured; the
    correction scales are measured / prior, averaged over the runs: prefill from TTFT (less
    the hand-off, which the prior does not hold), decode from ITL against TPOT. A run's
    decode batch per rank is Little's law on its own numbers (throughput x steps x ITL / ranks)."""
    checks = []
    for doc, run in bench:
        layout = _bench_layout(doc, run.source)
        w = run.workload
        batch = max(1, round(run.request_s * (w.output_len - 1) * run.itl_s / run.shape.decode.ranks))
        try:
            est = prior.estimate(ctx["model"], ctx["system"], w.input_len, w.output_len, layout, 1, batch,
                                 moe=ctx["moe"], version=ctx["version"])
        except prior.Infeasible as exc:
            raise PlannerError(f"{run.source}: aiconfigurator cannot model the measured layout ({exc}); calibrate "
                               f"with runs of a layout it models") from None
        handoff = ctx["kv_bytes"] * w.input_len / (ctx["link_gb_s"] * 1e9)
        checks.append({"source": run.source, "decode_batch_per_rank": batch, "kv_handoff_s": handoff,
                       "measured": {"ttft_s": run.ttft_s, "itl_s": run.itl_s, "request_throughput": run.request_s},
                       "prior": {"ttft_s": est.ttft_s + handoff, "tpot_s": est.tpot_s,
                                 "request_throughput": est.request_s},
                       "prefill_scale": max(run.ttft_s - handoff, 1e-9) / est.ttft_s,
                       "decode_scale": run.itl_s / est.tpot_s})
    scales = {k: sum(c[f"{k}_scale"] for c in checks) / len(checks) for k in ("prefill", "decode")}
    return scales, checks


def _prefill_batches(variables: Mapping[str, Any], isl: int) -> tuple[int, ...]:
    """Prefill batches whose prompts fit one pass of the prefill instances' chunked_prefill_size."""
    items = variables.get("pdnode_prefill_instances")
    first = items[0] if isinstance(items, list) and items and isinstance(items[0], Mapping) else {}
    extra = first.get("extra_args") if isinstance(first.get("extra_args"), Mapping) else {}
    tokens = extra.get("chunked_prefill_size")
    tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else DEFAULT_PREFILL_TOKENS
    return tuple(b for b in PREFILL_BATCHES if b == 1 or b * isl <= tokens)


def _decode_batches(args: argparse.Namespace) -> tuple[int, ...]:
    limit = args.batch_limit_per_rank
    return tuple(b for b in DECODE_BATCHES if limit is None or b <= limit) or (limit,)


def plan_prior(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    from ..core.plan.load import load_plan
    from ..core.planner.layouts import MOE_KINDS, enumerate_layouts, instance_entries, judge

    if args.concurrency is not None or args.rate is not None:
        raise PlannerError(f"--{'concurrency' if args.concurrency is not None else 'rate'}: the prior ranks what each "
                           f"layout serves at its best batch, not under a given load; leave it out and bound the "
                           f"batch with --ttft-max, --tpot-max or --batch-limit-per-rank")
    loaded = load_plan(args.inventory, args.host)  # Unplannable: pdnode's main says why
    plan, variables, host, inventory_dir = loaded.plan, loaded.variables, loaded.plan.host, loaded.inventory_dir
    settings = plan.settings
    system = prior.system_for_gpu(str(settings.get("pdnode_gpu_model")))
    version = prior.default_version(system)
    model = _prior_model(args, settings, system, version, plan.model)
    bench = load_bench(args.measurements or [])
    last = bench[-1][1].workload if bench else None
    isl = args.input_len if args.input_len is not None else (last.input_len if last else None)
    osl = args.output_len if args.output_len is not None else (last.output_len if last else None)
    if isl is None or osl is None:
        raise PlannerError("the prior needs the workload: give --isl N (--input-len) and --osl N (--output-len)")
    kv_bytes, kv_source = _prior_kv_bytes(args, settings, model)
    ctx = {"model": model, "system": system, "version": version, "moe": settings.get("pdnode_model_kind") in MOE_KINDS,
           "kv_bytes": kv_bytes, "link_gb_s": args.link_gb_s or plan.cluster["kv"]["gb_s"]}
    scales, checks = _calibrate(bench, ctx) if bench else ({"prefill": 1.0, "decode": 1.0}, [])
    pbs, dbs = _prefill_batches(variables, isl), _decode_batches(args)
    search = prior.Search(model, system, isl, osl, moe=ctx["moe"], prefill_batches=pbs, decode_batches=dbs,
                          ttft_max=args.ttft_max, tpot_max=args.itl_max, version=version,
                          prefill_scale=scales["prefill"] if bench else None,
                          decode_scale=scales["decode"] if bench else None)
    rows = []
    for cand in enumerate_layouts(int(settings["pdnode_gpu_count"]), str(settings.get("pdnode_model_kind"))):
        judge(cand, variables, host, inventory_dir)
        row = PriorRow(cand, rejected=cand.rejected)
        rows.append(row)
        if not cand.deployable:
            continue
        row.link_gb_s = args.link_gb_s or SPEEDS[cand.kv_path][0]  # the path the plan chose for this layout
        row.handoff_s = kv_bytes * isl / (row.link_gb_s * 1e9)
        try:
            row.choice = search.best(_prior_layout(cand), row.handoff_s)
        except prior.Infeasible as exc:
            row.rejected = f"aiconfigurator: {exc}"
    # the most output tokens/s per GPU within the limits; ties (4 significant digits) to the
    # lower TTFT, then to fewer instances (fewer processes for the same service)
    order = sorted(rows, key=lambda r: (r.choice is None, r.choice is not None and (r.choice.misses_ttft or
                                                                                   r.choice.misses_tpot),
                                        -float(f"{r.choice.estimate.tok_s_per_gpu:.4g}") if r.choice else 0.0,
                                        r.choice.ttft_s if r.choice else 0.0,
                                        len(r.cand.prefill) + len(r.cand.decode)))
    best = next((r for r in order if r.choice and not (r.choice.misses_ttft or r.choice.misses_tpot)), None)
    return {
        "mode": mode, "host": host, "isl": isl, "osl": osl, "model": model, "system": system,
        "aiconfigurator": prior.aic_version(), "database_sglang": version,
        "database_versions": prior.database_versions(system), "pdnode_sglang": str(settings["pdnode_sglang_version"]),
        "kv": {"bytes_per_token": kv_bytes, "source": kv_source, "path": plan.cluster["kv"]["path"]},
        "scales": scales, "checks": checks, "order": order, "best": best, "variables": variables,
        "batches": {"prefill": list(pbs), "decode_per_rank": list(dbs)}, "estimates": search.calls,
        "entries": prior_entries(best, instance_entries(best.cand, variables)) if best else None,
    }


def prior_entries(row: PriorRow, entries: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The chosen decode batch, as SGLang 0.5.23 reads it: max_running_requests is the
    instance's, split over its attention-DP ranks (max_running_requests // attn_dp_size per
    rank, srt/mem_cache/kv_cache_configurator.py resolve_max_num_reqs), and the decode CUDA
    graphs are captured per rank (cuda_graph_max_bs_decode; 0.5.23's name for the old
    cuda_graph_max_bs). The prefill is left to its chunked_prefill_size: its
    max_running_requests would also count the requests whose KV is still in flight, not
    the prompts of one pass, which the search kept within that size. Other extra_args the
    inventory carries stay."""
    assert row.choice is not None
    out = {"pdnode_prefill_instances": entries["pdnode_prefill_instances"], "pdnode_decode_instances": []}
    for entry, inst in zip(entries["pdnode_decode_instances"], row.cand.decode):
        extra = dict(entry.get("extra_args") or {})
        extra.update(max_running_requests=row.choice.decode_batch * inst.attn_dp_size,
                     cuda_graph_max_bs_decode=row.choice.decode_batch)
        out["pdnode_decode_instances"].append({**entry, "extra_args": extra})
    return out


def _prior_header(res: Mapping[str, Any]) -> str:
    return (f"prior: aiconfigurator {res['aiconfigurator']}, its SGLang {res['database_sglang']} database "
            f"({res['system']}; it has {', '.join(res['database_versions'])}) for {res['model']}; pdnode deploys "
            f"SGLang {res['pdnode_sglang']}")


def _prior_json(res: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": SCHEMA_PRIOR, "mode": res["mode"], "host": res["host"], "inventory": str(args.inventory),
        "workload": {"input_len": res["isl"], "output_len": res["osl"]},
        "prior": {"aiconfigurator": res["aiconfigurator"], "system": res["system"], "model": res["model"],
                  "database_sglang": res["database_sglang"], "database_versions": res["database_versions"],
                  "pdnode_sglang": res["pdnode_sglang"], "batches": res["batches"], "estimates": res["estimates"]},
        "kv_handoff": res["kv"], "correction_scales": res["scales"], "calibration": res["checks"],
        "limits": {"ttft_max_s": args.ttft_max, "tpot_max_s": args.itl_max},
        "candidates": [], "best": res["best"].cand.label() if res["best"] else None,
        "best_instances": res["entries"],
    }
    for row in res["order"]:
        c = row.choice
        out["candidates"].append({
            "layout": row.cand.label(), "kind": "colocated" if row.cand.colocated else "pd",
            "deployable": row.cand.deployable, "rejected": row.rejected if c is None else None,
            "kv_path": row.cand.kv_path, "why": row.why(args),
            "instances": {role: {"count": len(insts), "tp_size": insts[0].tp_size,
                                 "attn_dp_size": insts[0].attn_dp_size, "ep_size": insts[0].ep_size}
                          for role, insts in (("prefill", row.cand.prefill), ("decode", row.cand.decode)) if insts},
            "prefill_batch": c.prefill_batch if c else None, "decode_batch_per_rank": c.decode_batch if c else None,
            "prediction": None if c is None else {**c.estimate.as_dict(), "ttft_s": c.ttft_s,
                                                  "prior_ttft_s": c.estimate.ttft_s, "kv_handoff_s": row.handoff_s,
                                                  "link_gb_s": row.link_gb_s, "bottleneck": c.bottleneck},
        })
    return out


def _print_prior(res: Mapping[str, Any], args: argparse.Namespace) -> None:
    kv = res["kv"]
    print(f"host {res['host']}: input {res['isl']}, output {res['osl']} tokens ({res['mode']} mode)")
    print(_prior_header(res))
    print(f"KV {kv['bytes_per_token']} B/token ({kv['source']}) over the path the plan chose for each layout "
          f"({kv['path']} here): added to each TTFT (aiconfigurator has no hand-off)")
    for c in res["checks"]:
        m, p = c["measured"], c["prior"]
        print(f"  prior vs {c['source']} (decode batch {c['decode_batch_per_rank']}/rank): TTFT {_secs(p['ttft_s'])} "
              f"vs {_secs(m['ttft_s'])} ({p['ttft_s'] / m['ttft_s'] - 1:+.1%}), TPOT {_secs(p['tpot_s'])} vs ITL "
              f"{_secs(m['itl_s'])} ({p['tpot_s'] / m['itl_s'] - 1:+.1%}), {p['request_throughput']:.2f} vs "
              f"{m['request_throughput']:.2f} req/s ({p['request_throughput'] / m['request_throughput'] - 1:+.1%})")
    if res["checks"]:
        print(f"calibrated: latencies x {res['scales']['prefill']:.3f} (prefill) and x {res['scales']['decode']:.3f} "
              f"(decode), measured / prior over {len(res['checks'])} run(s)")
    rows = [("#", "layout", "P bs", "D bs/rank", "TTFT", "TPOT", "req/s", "tok/s/GPU", "why")]
    rejected: Counter[str] = Counter()
    for row in res["order"]:
        c = row.choice
        if c is None:
            rejected[row.rejected or "?"] += 1
        elif len(rows) <= args.top:
            e = c.estimate
            rows.append((str(len(rows)), row.cand.label(), str(c.prefill_batch), str(c.decode_batch), _secs(c.ttft_s),
                         _secs(e.tpot_s), f"{e.request_s:.2f}", f"{e.tok_s_per_gpu:,.0f}", row.why(args)))
    _print_ranking(rows, rejected, "the plan or the prior", res["best"].cand.label() if res["best"] else None)


def prior_plot_points(res: Mapping[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The table's ranked layouts for plot.plan_figure (the prior has no colocated estimate)."""
    ranked = [r for r in res["order"] if r.choice][:args.top]
    return [{"rank": i + 1, "label": " ".join(r.cand.label().split()), "path": r.cand.kv_path,
             "request_s": r.choice.estimate.request_s, "ttft_s": r.choice.ttft_s, "colocated": False,
             "best": r is res["best"], "misses": r.why(args).startswith("misses")} for i, r in enumerate(ranked)]


def write_prior_plot(res: Mapping[str, Any], args: argparse.Namespace) -> None:
    from . import plot

    title = (f"pdnode plan {res['host']}: layouts ranked for input {res['isl']}, output {res['osl']} tokens "
             f"({res['mode']})\n{_prior_header(res)}")
    measured = [{"label": Path(c["source"]).name, "request_s": c["measured"]["request_throughput"],
                 "ttft_s": c["measured"]["ttft_s"]} for c in res["checks"]]
    plot.save(plot.plan_figure(prior_plot_points(res, args), title, args.ttft_max, measured), args.plot)


def _write_group_vars(args: argparse.Namespace, entries: Mapping[str, list[dict[str, Any]]],
                      header: Sequence[str]) -> int:
    try:
        write_atomic(args.write, group_vars_yaml(entries, header))
    except OSError as exc:
        print(f"pdnode plan: cannot write --write {args.write}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    print(f"wrote {args.write}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def _report(res: Mapping[str, Any], args: argparse.Namespace, measured: bool) -> int:
    if args.json:
        print(json.dumps(_report_json(res, args) if measured else _prior_json(res, args), indent=2))
    else:
        (_print_table if measured else _print_prior)(res, args)
    if args.plot:
        try:
            (write_plot if measured else write_prior_plot)(res, args)
        except OSError as exc:
            print(f"pdnode plan: cannot write --plot {args.plot}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    if res["best"] is None:
        print("pdnode plan: no deployable layout meets the limits (see the reasons above); relax --ttft-max / "
              + ("--itl-max" if measured else "--tpot-max") + " or fix what the plan rejects", file=sys.stderr)
        return EXIT_FAILED
    if not args.write:
        return EXIT_OK
    if measured:
        cand, pred = res["best"]
        w: Workload = res["workload"]
        load = f"concurrency {w.concurrency}" if w.concurrency else f"rate {w.rate:g} req/s"
        header = [f"Written by `pdnode plan` for {res['host']}: {cand.label()}",
                  f"predicted {pred.request_s:.2f} req/s, TTFT {_secs(pred.ttft_s)}, ITL {_secs(pred.itl_s)} "
                  f"at input {w.input_len}, output {w.output_len}, {load}."]
    else:
        row: PriorRow = res["best"]
        c = row.choice
        assert c is not None
        header = [f"Written by `pdnode plan` ({res['mode']}) for {res['host']}: {row.cand.label()}, prefill batch "
                  f"{c.prefill_batch}, decode batch {c.decode_batch} per attention-DP rank",
                  f"predicted {c.estimate.request_s:.2f} req/s, {c.estimate.tok_s_per_gpu:,.0f} output tok/s per GPU, "
                  f"TTFT {_secs(c.ttft_s)} (KV hand-off included), TPOT {_secs(c.estimate.tpot_s)} at input "
                  f"{res['isl']}, output {res['osl']}.", _prior_header(res) + "."]
    header.append("Put these in place of the inventory's pdnode_prefill_instances / pdnode_decode_instances.")
    return _write_group_vars(args, res["entries"], header)


def cmd_plan(args: argparse.Namespace) -> int:
    for name in ("input_len", "output_len", "concurrency", "batch_limit_per_rank", "kv_bytes_per_token", "top"):
        value = getattr(args, name)
        if value is not None and value < (2 if name == "output_len" else 0 if name == "kv_bytes_per_token" else 1):
            print(f"pdnode plan: --{name.replace('_', '-')}={value} is too small; give a positive count"
                  + (" of at least 2 (one prefill token, one decode step)" if name == "output_len" else ""),
                  file=sys.stderr)
            return EXIT_FAILED
    for name in ("rate", "ttft_max", "itl_max", "link_gb_s"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            print(f"pdnode plan: --{name.replace('_', '-')}={value} must be a positive number", file=sys.stderr)
            return EXIT_FAILED
    if args.plot:  # refused before the work, as every other bad flag
        from . import plot

        try:
            plot.check_target(args.plot)
            plot.pyplot()
        except plot.PlotError as exc:
            print(f"pdnode plan: {exc}", file=sys.stderr)
            return exc.code
    # no measurements: the prior alone; measurements: measured, or calibrated with --prior
    measured = bool(args.measurements) and not args.prior
    try:
        res = plan_layouts(args) if measured else plan_prior(args, "calibrated" if args.measurements else "prior")
    except (MeasurementError, PlannerError) as exc:
        print(f"pdnode plan: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except prior.Unsupported as exc:
        print(f"pdnode plan: {exc}; {MEASURE_INSTEAD}", file=sys.stderr)
        return EXIT_FAILED
    except prior.PriorUnavailable as exc:
        print(f"pdnode plan: {exc}; {MEASURE_INSTEAD}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except OSError as exc:
        print(f"pdnode plan: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    return _report(res, args, measured)


def register(sub: Any) -> None:
    """Add `pdnode plan` to pdnode's subcommands (called by pdnode.commands.cli)."""
    # the help is also pdnode.commands.cli's stub (OPTIONAL_HELP): the two say the same
    p = sub.add_parser("plan", help="rank the host's prefill/decode layouts for a workload from bench measurements",
                       description=" ".join(__doc__.split("\n\n")[0].split()), epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")
    p.add_argument("--measurements", action="append", metavar="BENCH.json",
                   help="a `pdnode bench --json` report (pdnode.bench/1); repeat for several runs (none: the prior)")
    p.add_argument("--prior", action="store_true",
                   help="estimate with NVIDIA aiconfigurator's SGLang database (pip install 'pdnode[prior]'); "
                        "implied without --measurements, with them it calibrates the prior to the runs")
    p.add_argument("--prior-model", metavar="HF_ID",
                   help="the model as aiconfigurator names it, e.g. Qwen/Qwen3-30B-A3B-FP8 (default: the one "
                        "named like pdnode_model_path's directory)")
    p.add_argument("--input-len", "--isl", type=int, metavar="I", help="prompt tokens (default: the last run's)")
    p.add_argument("--output-len", "--osl", type=int, metavar="O", help="output tokens (default: the last run's)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, metavar="C", help="closed loop: C clients, each sends on reply")
    load.add_argument("--rate", type=float, metavar="R", help="open loop: R requests/s")
    p.add_argument("--ttft-max", type=float, metavar="S", help="mean TTFT limit, seconds")
    p.add_argument("--itl-max", "--tpot-max", type=float, metavar="S",
                   help="mean ITL (TPOT, time per output token) limit, seconds")
    p.add_argument("--kv-bytes-per-token", type=int, metavar="N",
                   help="KV cache bytes per prompt token (default: from the model's config.json)")
    p.add_argument("--link-gb-s", type=float, metavar="X",
                   help="KV hand-off speed, GB/s (default: the plan's path, pdnode explain; the stand-in's "
                        "no faster than TCP's)")
    p.add_argument("--batch-limit-per-rank", type=int, metavar="N",
                   help="running requests per decode rank (default: not limiting; the prior searches batches "
                        "up to it)")
    p.add_argument("--top", type=int, default=12, help="deployable layouts to print (default 12)")
    p.add_argument("--write", metavar="FILE", help="write the best deployable layout as group_vars YAML")
    p.add_argument("--json", action="store_true", help=f"print the ranking as JSON (schema {SCHEMA}; with the "
                                                       f"prior {SCHEMA_PRIOR})")
    p.add_argument("--plot", metavar="FILE", help="also draw the ranked layouts, throughput against TTFT with each "
                                                  "one's KV path, to FILE (.png or .svg; needs matplotlib: "
                                                  "pip install 'pdnode[plot]')")
    p.set_defaults(func=cmd_plan)
