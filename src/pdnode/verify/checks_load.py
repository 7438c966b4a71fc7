"""burst and threshold.<key>: streaming requests at the planned concurrency, then each
threshold of thresholds.py judged on the burst's metrics summed over the instances of its
role."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import access as acc
from . import metrics as pm
from .base import (FAIL, NA, PASS, RUNBOOK, SKIP, Ctx, Result, Snaps, chat_body, fmt, fold_stream, make_prompt,
                   num)
from .http import stream_sse
from ..core.inventory.thresholds import M_E2E, M_REQS, THRESHOLDS, metrics_needed


def check_burst(ctx: Ctx) -> Result:
    if ctx.s.skip_burst:
        return Result(SKIP, "skipped: because --skip-burst was given", cause="--skip-burst was given")
    n, c = ctx.s.burst_requests, ctx.s.burst_concurrency
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    header = ctx.client_header()
    hdrs = {"Authorization": header} if header else {}
    prompt = make_prompt(ctx.s.prompt_words)
    ctx.snapshot("burst_before")
    lock = threading.Lock()
    outcomes: list[dict[str, Any]] = []

    def one(i: int) -> None:
        if ctx.deadline.expired():
            with lock:
                outcomes.append({"ok": False, "error": "overall time bound reached"})
            return
        # vary the prompt a little so a prefix cache does not turn the burst into no work
        resp, events = stream_sse(url, body=chat_body(ctx, f"[{i}] " + prompt, ctx.s.max_tokens, stream=True),
                                  headers=hdrs, timeout_s=ctx.limit())
        text, finish, usage, ttft, errors = fold_stream(events) if resp.ok else ("", None, None, None, [])
        ok = resp.ok and not errors and bool(text)
        with lock:
            outcomes.append({"ok": ok, "ttft": ttft, "e2e": resp.elapsed_s, "error": None if ok else (
                json.dumps(errors[0])[:200] if errors else resp.short())})

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=c) as pool:
        list(pool.map(one, range(n)))
    wall = time.monotonic() - t0
    good = [o for o in outcomes if o["ok"]]
    ctx.wait_settled(ctx.snaps["burst_before"], len(good))
    ctx.snapshot("burst_after")
    ttfts = sorted(o["ttft"] for o in good if o["ttft"] is not None)
    e2es = sorted(o["e2e"] for o in good)
    ctx.measurements["burst"] = {
        "requests": n, "concurrency": c, "ok": len(good), "failed": n - len(good), "wall_s": round(wall, 4),
        "client_ttft_p50_s": _exact_q(ttfts, 0.5), "client_ttft_p99_s": _exact_q(ttfts, 0.99),
        "client_e2e_p50_s": _exact_q(e2es, 0.5), "client_e2e_p99_s": _exact_q(e2es, 0.99),
    }
    spread = _spread(ctx)
    ctx.measurements["burst"]["router_spread"] = spread
    evidence = (f"{len(good)}/{n} streaming requests ok at concurrency {c} in {wall:.2f} s; client-side TTFT p50 "
                f"{fmt(_exact_q(ttfts, 0.5), 's')}, e2e p99 {fmt(_exact_q(e2es, 0.99), 's')}; the router's spread "
                "(requests): " + ", ".join(f"{k} +{num(v)}" for k, v in spread.items()))
    if len(good) < n:
        first = next(o["error"] for o in outcomes if not o["ok"])
        return Result(FAIL, f"{n - len(good)} of {n} failed (first: {first}); " + evidence,
                      "requests fail under load only: queue limits, KV pool size, WAITING_TIMEOUT under load; "
                      f"{RUNBOOK}#burst")
    return Result(PASS, evidence)


def _spread(ctx: Ctx) -> dict[str, float | None]:
    """Requests each instance counted during the burst: shown, never judged (the router's
    policy decides it; each instance's own proof is disaggregation.<id>)."""
    b, a = ctx.snaps.get("burst_before", {}), ctx.snaps.get("burst_after", {})
    out: dict[str, float | None] = {}
    for inst in ctx.t.instances:
        sb, sa = b.get(inst.id), a.get(inst.id)
        out[inst.id] = pm.counter_rise(sb, sa, M_REQS) if isinstance(sb, pm.Snapshot) and \
            isinstance(sa, pm.Snapshot) else None
    return out


def _exact_q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    k = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return round(values[k], 4)


def threshold_value(key: str, before: Snaps, after: Snaps, concurrency: int,
                    roles: Mapping[str, str]) -> tuple[float | None, str]:
    """(measured value, how) of one threshold from the burst's before/after snapshots
    (instance id -> snapshot), summed over the instances of the threshold's role
    (``roles``: instance id -> role): histograms bucket by bucket, counters series by
    series, so a p99 is the p99 of every request the role served. A rate is over the
    engines' own time: the seconds the role timed its requests (e2e sum) over the burst's
    ``concurrency`` (requests in flight at once), which is the burst's length on a node
    that keeps them busy, timed by the engines and not by the client (on a stand-in the
    client's clock measures the machine's CPU)."""
    t = THRESHOLDS[key]
    ids = [iid for iid, role in roles.items() if role == t.role]
    if not ids:
        return None, f"no {t.role} instance in the plan"
    got_b = {iid: s for iid in ids if isinstance(s := before.get(iid), pm.Snapshot)}
    got_a = {iid: s for iid in ids if isinstance(s := after.get(iid), pm.Snapshot)}
    unreadable = [iid for iid in ids if iid not in got_b or iid not in got_a]
    if unreadable:
        return None, f"{unreadable[0]} metrics unreadable"
    b, a = pm.merge(got_b), pm.merge(got_a)
    who = t.role if len(ids) == 1 else f"{t.role} ({', '.join(ids)} summed)"
    if t.stat == "rate":
        delta = pm.counter_delta(b, a, t.metric)
        e2e = pm.histogram_delta(b, a, M_E2E)
        if e2e is None or e2e.count <= 0 or e2e.sum <= 0:
            return None, f"no {M_E2E} observations on {who} during the burst"
        engine_s = e2e.sum / max(concurrency, 1)
        return pm.throughput(delta, engine_s), (
            f"{who} {t.metric} +{num(delta)} over {engine_s:.3g} s of engine time ({M_E2E} sum "
            f"{e2e.sum:.3g} s of {e2e.count:g} requests / concurrency {concurrency})")
    if t.stat == "mean":
        if a.kind(t.metric) == "gauge":
            vals = list(a.series(t.metric).values())
            return (max(vals) if vals else None), f"{who} gauge {t.metric} (highest)"
        d = pm.histogram_delta(b, a, t.metric)
        if d is None or d.count <= 0:
            return None, f"no {t.metric} observations on {who} during the burst"
        return d.mean, f"{who} {t.metric}: mean of {d.count:g} transfers (sum/count of the histogram delta)"
    d = pm.histogram_delta(b, a, t.metric)
    if d is None or d.count <= 0:
        return None, f"no {t.metric} observations on {who} during the burst"
    q = float(t.stat)
    return d.quantile(q), f"{who} {t.metric}: p{int(q * 100)} of {d.count:g} observations (histogram delta)"


def make_threshold_check(key: str) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        t = THRESHOLDS[key]
        unit, cmp = t.unit, t.comparison
        limit = ctx.s.thresholds.get(key)
        before, after = ctx.snaps.get("burst_before", {}), ctx.snaps.get("burst_after", {})
        for inst in ctx.t.role(t.role):
            snap = after.get(inst.id)
            for metric in metrics_needed(t):
                if isinstance(snap, pm.Snapshot) and not snap.has(metric):
                    return Result(SKIP, f"skipped: because metrics failed: {inst.id} lacks {metric}", "see metrics",
                                  cause="metrics failed")
        roles = {i.id: i.role for i in ctx.t.instances}
        in_flight = min(ctx.s.burst_concurrency, ctx.s.burst_requests)
        value, how = threshold_value(key, before, after, in_flight, roles)
        shown = fmt(value, "s") if unit == "s" else f"{num(value, '.4g')} {unit}"
        entry = {"value": value, "limit": limit, "unit": unit, "comparison": cmp, "source": how}
        ctx.measurements.setdefault("thresholds", {})[key] = entry
        if limit is None:
            return Result(NA, f"{shown} ({how}); no threshold set",
                          f"set pdnode_verify_thresholds.{key} to judge it")
        lim = fmt(limit, "s") if unit == "s" else f"{limit:g} {unit}"
        if value is None or math.isnan(value):
            return Result(FAIL, f"not measurable: {how} (limit {lim})", "the burst produced no observations")
        ok = value <= limit if cmp == "max" else value >= limit
        entry["ok"] = ok
        evidence = f"{shown} {'<=' if cmp == 'max' else '>='} {lim}" if ok else \
            f"{shown} {'>' if cmp == 'max' else '<'} {lim} (limit)"
        if ok:
            return Result(PASS, f"{evidence}; {how}")
        return Result(FAIL, f"{evidence}; {how}", _threshold_hint(key, ctx))
    return run


def _threshold_hint(key: str, ctx: Ctx) -> str:
    if key.startswith("itl") or key.startswith("decode_throughput"):
        return ("decode is slow: check decode's GPU utilisation and batch (num_running_reqs), attention-DP/EP layout, "
                f"and whether another process shares its GPUs; {RUNBOOK}#thresholds")
    if key.startswith("ttft"):
        return ("first tokens are slow: prefill queueing (num_queue_reqs), long prompts, or slow KV transfer "
                f"(kv_transfer_latency_ms); {RUNBOOK}#thresholds")
    if key.startswith("kv_transfer"):
        return ("KV moves slower than the floor: RDMA not in use (fell back to TCP), wrong NIC per GPU "
                f"(nvidia-smi topo -m), or congestion; {RUNBOOK}#thresholds")
    return f"end-to-end latency too high: see TTFT and ITL; {RUNBOOK}#thresholds"
