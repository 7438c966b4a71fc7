"""The numbers of `pdnode bench` (pure functions, no I/O): the load client's record ->
results, two counter readings -> per-instance work, the plan -> layout; table and JSON.

The client is SGLang's own `sglang.benchmark.serving` (bench_serving); its JSONL record
(--output-file, --output-details) holds the summary it printed: throughputs over the
benchmark's wall time, and mean / median / p99 of TTFT, inter-token latency and
end-to-end latency over the successful requests, in milliseconds (numpy's linear
percentiles). They are reported here in seconds, and as null when no request completed
(bench_serving reports 0 then, which would read as "fast").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..core.rules.instances import gpus_text
from ..verify.metrics import MetricsParseError, Snapshot, counter_delta, parse

SCHEMA = "pdnode.bench/1"
ENGINE_ROLES = ("prefill", "decode")
_INSTANCE_KEYS = {"sglang:num_requests_total": "requests", "sglang:prompt_tokens_total": "prompt_tokens",
                  "sglang:generation_tokens_total": "generation_tokens"}


class ClientOutputError(ValueError):
    """The client's output file is not what bench_serving writes."""


# --- the plan -----------------------------------------------------------------------------
def layout(plan: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Prefill and decode instances as the planner reads them (from the plan's normalised
    settings, so every number is there whether or not the inventory spelled it)."""
    settings = plan.get("settings") or {}
    out: dict[str, list[dict[str, Any]]] = {}
    for role in ENGINE_ROLES:
        rows = []
        for inst in settings.get(f"pdnode_{role}_instances") or []:
            rows.append({
                "id": f"{role}-{inst['name']}", "gpus": list(inst["gpus"]),
                "tp_size": int(inst["tp_size"]), "dp_size": int(inst.get("dp_size") or 1),
                "attn_dp_size": int(inst.get("attn_dp_size") or 1), "ep_size": int(inst.get("ep_size") or 1),
            })
        out[role] = rows
    return out


# --- the client's record ------------------------------------------------------------------
def parse_client_output(text: str) -> dict[str, Any]:
    """The last record of bench_serving's JSONL output file (it appends one per run)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ClientOutputError("the client wrote no result (its output file is empty)")
    try:
        record = json.loads(lines[-1])
    except ValueError as exc:
        raise ClientOutputError(f"the client's result is not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise ClientOutputError("the client's result is not a JSON object")
    missing = [k for k in ("completed", "duration", "request_throughput", "input_throughput", "output_throughput",
                           "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms",
                           "p99_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms")
               if k not in record]
    if missing:
        raise ClientOutputError(f"the client's result lacks {', '.join(missing)} (another bench_serving version?)")
    return record


def parse_request_records(path: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Each measured request as the client timed it (pdnode.bench_client's file):
    [{start_s, ttft_s, e2e_s, ok}], start_s from the first request's start, latencies
    null for a failed request; (None, why) when the file is missing or not that."""
    from pathlib import Path

    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError:
        return None, "the client wrote none"
    except ValueError as exc:
        return None, f"not JSON ({exc})"

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("ok"), bool) and number(r.get("start_s"))
            and all(number(r.get(k)) if r["ok"] else r.get(k) is None for k in ("ttft_s", "e2e_s")) for r in rows):
        return None, "not a list of {start_s, ttft_s, e2e_s, ok}"
    return [{k: r[k] for k in ("start_s", "ttft_s", "e2e_s", "ok")} for r in rows], None


def _seconds(ms: Any) -> float | None:
    if ms is None:
        return None
    value = float(ms)
    return value / 1000.0 if math.isfinite(value) else None


def _triple(record: Mapping[str, Any], name: str, completed: int) -> dict[str, float | None]:
    if completed == 0:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": _seconds(record[f"mean_{name}_ms"]), "p50": _seconds(record[f"median_{name}_ms"]),
            "p99": _seconds(record[f"p99_{name}_ms"])}


def results(record: Mapping[str, Any], requests: int) -> dict[str, Any]:
    """The report's "results" from the client's record; REQUESTS is how many were sent."""
    completed = int(record["completed"])
    return {
        "duration_s": float(record["duration"]),
        "completed": completed,
        "failed": requests - completed,
        "request_throughput": float(record["request_throughput"]),
        "input_token_throughput": float(record["input_throughput"]),
        "output_token_throughput": float(record["output_throughput"]),
        "input_tokens": int(record.get("total_input_tokens") or 0),
        "output_tokens": int(record.get("total_output_tokens") or 0),
        "ttft_s": _triple(record, "ttft", completed),
        "itl_s": _triple(record, "itl", completed),
        "e2e_s": _triple(record, "e2e_latency", completed),
    }


def client_errors(record: Mapping[str, Any], limit: int = 3) -> list[str]:
    """The distinct errors of failed requests (first line each; --output-details has them)."""
    seen: list[str] = []
    for err in record.get("errors") or []:
        line = str(err).strip().splitlines()[-1] if str(err).strip() else ""
        if line and line not in seen:
            seen.append(line[:300])
    return seen[:limit]


# --- the engines' counters ----------------------------------------------------------------
def snapshot_of(reading: Mapping[str, Any]) -> Snapshot:
    """One instance's counters (the lines of its /metrics that pdnode.node.bench_counters
    kept) read by the Prometheus parser (MetricsParseError when they do not parse)."""
    return parse(str(reading.get("metrics") or ""))


def instance_work(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per engine instance: requests, prompt and generation tokens it counted between the two
    readings (pdnode.node.bench_counters reports). A counter that is absent (an engine that did
    not answer, or has served nothing yet) is null, with the reason in "error"."""
    b_all, a_all = before.get("instances") or {}, after.get("instances") or {}
    out: dict[str, dict[str, Any]] = {}
    for iid in a_all.keys() | b_all.keys():
        b, a = b_all.get(iid) or {}, a_all.get(iid) or {}
        row: dict[str, Any] = {"role": a.get("role") or b.get("role")}
        error = a.get("error") or b.get("error")
        snap_b = snap_a = Snapshot()
        if not error:
            try:
                snap_b, snap_a = snapshot_of(b), snapshot_of(a)
            except MetricsParseError as exc:
                error = f"{a.get('url') or b.get('url')}: {exc}"
        for name in _INSTANCE_KEYS:
            key = _INSTANCE_KEYS[name]
            if error:
                row[key] = None
                continue
            delta = counter_delta(snap_b, snap_a, name)
            # A counter SGLang has not created yet (no request finished since start) is 0.
            row[key] = int(round(delta)) if delta is not None else 0
        handoff = _handoff(snap_b, snap_a) if not error and row["role"] == "prefill" else None
        if handoff is not None:
            row["kv_handoff"] = handoff
        if error:
            row["error"] = error
        out[iid] = row
    return dict(sorted(out.items(), key=lambda kv: (ENGINE_ROLES.index(kv[1]["role"])
                                                    if kv[1]["role"] in ENGINE_ROLES else 9, kv[0])))


def _handoff(before: Snapshot, after: Snapshot) -> dict[str, Any] | None:
    """The KV hand-offs a prefill measured during the run (SGLang's kv_transfer_*
    histograms): how many, their mean time and the speed over all of them; None when
    it made none (or does not export them)."""
    count = counter_delta(before, after, "sglang:kv_transfer_latency_ms_count")
    latency_ms = counter_delta(before, after, "sglang:kv_transfer_latency_ms_sum")
    total_mb = counter_delta(before, after, "sglang:kv_transfer_total_mb_sum")
    if not count or latency_ms is None:
        return None
    return {"transfers": int(round(count)), "mean_ms": round(latency_ms / count, 3),
            "gb_s": round(total_mb / latency_ms, 3) if total_mb is not None and latency_ms > 0 else None}


def consistency(res: Mapping[str, Any], instances: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Where the engines' counts disagree with what the client measured, one line each.

    Every request passes one prefill and one decode instance: the prefill instances
    together count each prompt once, the decode instances count each generated token.
    A difference means other traffic during the run, failed requests, or an engine that
    restarted or could not be read."""
    notes: list[str] = []
    if any(r.get("error") for r in instances.values()):
        notes.append("per-instance work is incomplete: " + "; ".join(
            f"{i}: {r['error']}" for i, r in instances.items() if r.get("error")))
        return notes
    checks = [
        ("prefill", "requests", res["completed"], "requests completed"),
        ("decode", "requests", res["completed"], "requests completed"),
        ("prefill", "prompt_tokens", res["input_tokens"], "prompt tokens sent"),
        ("decode", "generation_tokens", res["output_tokens"], "tokens received"),
    ]
    for role, key, expected, what in checks:
        rows = [r for r in instances.values() if r["role"] == role]
        if not rows:
            continue
        got = sum(r[key] or 0 for r in rows)
        if got != expected:
            notes.append(f"the {role} instances counted {got} {key.replace('_', ' ')}, the client {expected} "
                         f"{what} (other traffic during the run, failed requests, or a restarted engine)")
    return notes


def build_report(*, host: str, client: Mapping[str, str], plan: Mapping[str, Any], workload: Mapping[str, Any],
                 record: Mapping[str, Any], before: Mapping[str, Any] | None,
                 after: Mapping[str, Any] | None, notes: list[str] | None = None,
                 requests: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    res = results(record, int(workload["requests"]))
    instances = instance_work(before, after) if before is not None and after is not None else {}
    out_notes = list(notes or [])
    if instances:
        out_notes += consistency(res, instances)
    elif before is None or after is None:
        out_notes.append("per-instance work unknown: the engines' counters could not be read")
    errors = client_errors(record)
    if res["failed"] and errors:
        out_notes.append(f"{res['failed']} requests failed: " + " | ".join(errors))
    if requests is not None and len(requests) != int(workload["requests"]):
        out_notes.append(f"the client timed {len(requests)} requests, {workload['requests']} were sent")
    # "requests" (each request's start and latencies, null when unknown) came after the
    # first reports; readers of pdnode.bench/1 that do not know it ignore it.
    return {"schema": SCHEMA, "host": host, "client": dict(client), "layout": layout(plan),
            "workload": dict(workload), "results": res, "instances": instances, "notes": out_notes,
            "requests": requests}


# --- rendering ------------------------------------------------------------------------------
def to_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2)


def shape_text(inst: Mapping[str, Any]) -> str:
    parts = [f"TP {inst['tp_size']}"]
    if inst["dp_size"] > 1:
        parts.append(f"DP {inst['dp_size']}")
    if inst["attn_dp_size"] > 1:
        parts.append(f"attn-DP {inst['attn_dp_size']}")
    if inst["ep_size"] > 1:
        parts.append(f"EP {inst['ep_size']}")
    return " ".join(parts)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[tuple[str, ...]], right_from: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i < right_from else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def to_table(report: Mapping[str, Any]) -> str:
    w, r = report["workload"], report["results"]
    load = f"concurrency {w['concurrency']}" if w.get("concurrency") else f"rate {w['rate']} req/s (Poisson)"
    spread = "fixed" if w["range_ratio"] >= 1 else f"uniform from {w['range_ratio']:g} x"
    lines = [
        f"pdnode bench {report['host']}: {w['requests']} requests, {load}, input {w['input_len']} / output "
        f"{w['output_len']} tokens ({spread}); client {report['client']['name']} {report['client']['version']}",
        "layout: " + "; ".join(f"{i['id']} GPUs {gpus_text(i['gpus'])} {shape_text(i)}"
                               for role in ENGINE_ROLES for i in report["layout"].get(role, [])),
        "",
        f"completed {r['completed']} of {w['requests']} ({r['failed']} failed) in {r['duration_s']:.2f} s",
        f"throughput: {r['request_throughput']:.2f} req/s, {r['input_token_throughput']:.1f} input tok/s, "
        f"{r['output_token_throughput']:.1f} output tok/s",
        "",
    ]
    lines += _table([("latency (ms)", "mean", "p50", "p99")] + [
        (name, _ms(r[key]["mean"]), _ms(r[key]["p50"]), _ms(r[key]["p99"]))
        for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))])
    if report["instances"]:
        lines.append("")
        lines += _table([("instance", "role", "requests", "prompt tokens", "generation tokens")] + [
            (iid, row["role"], _num(row["requests"]), _num(row["prompt_tokens"]), _num(row["generation_tokens"]))
            for iid, row in report["instances"].items()], right_from=2)
    handoffs = [(iid, row["kv_handoff"]) for iid, row in report["instances"].items() if row.get("kv_handoff")]
    if handoffs:
        lines.append("")
        lines += [f"KV hand-off ({iid}): {h['transfers']} transfers, mean {h['mean_ms']:.2f} ms"
                  + (f", {h['gb_s']:g} GB/s" if h["gb_s"] is not None else "") for iid, h in handoffs]
    if report["notes"]:
        lines.append("")
        lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
