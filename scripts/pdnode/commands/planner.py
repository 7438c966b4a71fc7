"""`pdnode plan INVENTORY --measurements BENCH.json ...`: which split of the host's GPUs
into prefill and decode instances serves a workload best (docs/planner.md).

It fits the engine's rates to `pdnode bench --json` runs (planner_model.py), enumerates
the layouts of pdnode_gpu_count GPUs and asks the plan which it accepts
(planner_layouts.py), predicts each layout's throughput, TTFT and ITL, and prints them
ranked. `--write FILE` writes the best deployable layout as group_vars
(pdnode_prefill_instances / pdnode_decode_instances) that `pdnode check` accepts.
Exit 0 with a ranking, 1 when the input is wrong or nothing deployable remains, 2 when
a file cannot be read or written.
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
from pathlib import Path
from typing import Any

from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from ..core.kv_path import SPEEDS, kv_bytes_from_config
from ..core.resources import controller_dir
from ..core.planner_model import (MeasurementError, Params, Pool, Prediction, Run, Shape, Workload, fit, pool_of,
                                  predict, run_from_bench)

SCHEMA = "pdnode.planner/1"
# The stand-in's fake model moves PDNODE_SIM_KV_BYTES_PER_TOKEN bytes per prompt token
# (its default): a property of that model, as config.json's shapes are of a real one.
SIM_KV_BYTES_PER_TOKEN = 16384
EPILOG = """\
Measurements: two or more `pdnode bench --json` runs of the deployed node at different
concurrency (e.g. 8 and 32), so a decode step's base and per-request cost separate.
Example:
  pdnode plan inventories/demo --measurements c8.json --measurements c32.json \\
      --input-len 256 --output-len 64 --concurrency 32 --write plan.yml
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


def load_runs(paths: Sequence[str]) -> list[Run]:
    runs = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise OSError(f"cannot read --measurements {path}: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise MeasurementError(f"{path}: not JSON ({exc}); Fix: save `pdnode bench --json` output") from None
        runs.append(run_from_bench(doc, path))
    return runs


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
    from ..core.load import load_plan
    from ..core.planner_layouts import enumerate_layouts, instance_entries, judge

    loaded = load_plan(args.inventory, args.host)  # Unplannable: pdnode's main says why
    plan, variables, host = loaded.plan, loaded.variables, loaded.plan.host
    settings = plan.settings
    runs = load_runs(args.measurements)
    workload = _workload(args, runs)
    repo = controller_dir()
    kv_bytes, kv_source = _kv_bytes(args, settings, repo)
    backend = str(settings.get("pdnode_transfer_backend") or "mooncake")
    # The path the plan chose (pdnode.core.kv_path). The stand-in's bytes cross loopback TCP,
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
        judge(cand, variables, host)
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
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(wd) for c, wd in zip(row[:-1], widths)) + "  " + row[-1])
        if i == 0:
            print("  ".join("-" * wd for wd in widths) + "  ---")
    if rejected:
        print(f"rejected by the plan: {sum(rejected.values())} layout(s)")
        for reason, n in rejected.most_common(5):
            print(f"  {n} x {reason}")
    if res["best"]:
        print(f"best deployable: {res['best'][0].label()}")


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
    try:
        res = plan_layouts(args)
    except (MeasurementError, PlannerError) as exc:
        print(f"pdnode plan: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"pdnode plan: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if args.json:
        print(json.dumps(_report_json(res, args), indent=2))
    else:
        _print_table(res, args)
    if args.plot:
        try:
            write_plot(res, args)
        except OSError as exc:
            print(f"pdnode plan: cannot write --plot {args.plot}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    if res["best"] is None:
        print("pdnode plan: no deployable layout meets the limits (see the reasons above); relax --ttft-max / "
              "--itl-max or fix what the plan rejects", file=sys.stderr)
        return EXIT_FAILED
    if args.write:
        cand, pred = res["best"]
        w: Workload = res["workload"]
        load = f"concurrency {w.concurrency}" if w.concurrency else f"rate {w.rate:g} req/s"
        header = [f"Written by `pdnode plan` for {res['host']}: {cand.label()}",
                  f"predicted {pred.request_s:.2f} req/s, TTFT {_secs(pred.ttft_s)}, ITL {_secs(pred.itl_s)} "
                  f"at input {w.input_len}, output {w.output_len}, {load}.",
                  "Put these in place of the inventory's pdnode_prefill_instances / pdnode_decode_instances."]
        try:
            write_atomic(args.write, group_vars_yaml(res["entries"], header))
        except OSError as exc:
            print(f"pdnode plan: cannot write --write {args.write}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        print(f"wrote {args.write}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def register(sub: Any) -> None:
    """Add `pdnode plan` to pdnode's subcommands (called by pdnode.commands.cli)."""
    p = sub.add_parser("plan", help="rank the host's prefill/decode layouts for a workload from bench measurements",
                       description=__doc__.splitlines()[0], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")
    p.add_argument("--measurements", action="append", required=True, metavar="BENCH.json",
                   help="a `pdnode bench --json` report (pdnode.bench/1); repeat for several runs")
    p.add_argument("--input-len", type=int, metavar="I", help="prompt tokens (default: the last run's)")
    p.add_argument("--output-len", type=int, metavar="O", help="output tokens (default: the last run's)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, metavar="C", help="closed loop: C clients, each sends on reply")
    load.add_argument("--rate", type=float, metavar="R", help="open loop: R requests/s")
    p.add_argument("--ttft-max", type=float, metavar="S", help="mean TTFT limit, seconds")
    p.add_argument("--itl-max", type=float, metavar="S", help="mean ITL limit, seconds")
    p.add_argument("--kv-bytes-per-token", type=int, metavar="N",
                   help="KV cache bytes per prompt token (default: from the model's config.json)")
    p.add_argument("--link-gb-s", type=float, metavar="X",
                   help="KV hand-off speed, GB/s (default: the plan's path, pdnode explain; the stand-in's "
                        "no faster than TCP's)")
    p.add_argument("--batch-limit-per-rank", type=int, metavar="N",
                   help="running requests per decode rank (default: not limiting)")
    p.add_argument("--top", type=int, default=12, help="deployable layouts to print (default 12)")
    p.add_argument("--write", metavar="FILE", help="write the best deployable layout as group_vars YAML")
    p.add_argument("--json", action="store_true", help=f"print the ranking as JSON (schema {SCHEMA})")
    p.add_argument("--plot", metavar="FILE", help="also draw the ranked layouts, throughput against TTFT with each "
                                                  "one's KV path, to FILE (.png or .svg; needs matplotlib: "
                                                  "pip install 'pdnode[plot]')")
    p.set_defaults(func=cmd_plan)
