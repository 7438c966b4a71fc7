"""Proof that prefill and decode both did their part.

disaggregation: over the router's traffic (the access probe and the completions), the
  counters summed over the instances of each role: prefill prompt tokens, decode generated
  tokens and KV transfers moved; no instance counted a failed bootstrap or transfer. How
  the router spread those requests over the instances is shown, never judged: its policy
  (cache_aware by default) may rightly send a handful of requests to one prefill.

disaggregation.<instance id>: the same proof for ONE instance, which the router's choice
  cannot give. The verifier does what the router does for one request -- the same
  /generate body, with bootstrap_host/port/room of one prefill, to that prefill and to one
  decode at once -- so that every instance serves a request whatever the policy: each
  prefill with a decode, each decode with a prefill (partners whose own checks passed).
  The instance's own counters must rise: num_requests_total on both; prompt_tokens_total
  and a KV transfer on a prefill; generation_tokens_total on a decode; and no failed
  bootstrap or transfer. Deterministic: a FAIL means the instance did not serve a request
  sent to it, never that the router happened to pick another one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import metrics as pm
from .base import FAIL, PASS, RUNBOOK, SKIP, WARN, Ctx, Result, make_prompt, num, unit_hint
from .config import Instance
from .http import Response, request
from ..core.inventory.thresholds import M_BOOT_FAIL, M_GEN, M_KV_MB, M_PROMPT, M_REQS, M_XFER_FAIL

FAILURES = (("bootstrap", M_BOOT_FAIL), ("transfer", M_XFER_FAIL))
SETTLE_S = 2.0  # the engines count a request a moment after answering it


def kv_moved(before: pm.Snapshot, after: pm.Snapshot) -> tuple[float | None, float | None, str]:
    """(transfers, MB) moved between snapshots; histograms in 0.5.23, gauges in older."""
    kind = after.kind(M_KV_MB)
    if kind == "histogram":
        d = pm.histogram_delta(before, after, M_KV_MB)
        return (d.count, d.sum, "histogram") if d else (0.0, 0.0, "histogram")
    if kind == "gauge":
        b, a = before.total(M_KV_MB), after.total(M_KV_MB)
        moved = None if a is None else (1.0 if a != (b or 0.0) else 0.0)
        return moved, a, "gauge"
    return None, None, "absent"


@dataclass
class Deltas:
    """What one instance counted between two snapshots."""

    requests: float | None
    tokens: float | None  # prompt tokens on a prefill, generated tokens on a decode
    kv_transfers: float | None = None  # prefill only
    kv_mb: float | None = None
    kv_kind: str = ""
    failed: dict[str, float | None] = field(default_factory=dict)  # "bootstrap"/"transfer" -> delta

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests, "tokens": self.tokens,
                               **{f"{k}_failed": v for k, v in self.failed.items()}}
        if self.kv_kind:
            out.update(kv_transfers=self.kv_transfers, kv_transfer_mb=self.kv_mb, kv_metric_kind=self.kv_kind)
        return out


def deltas(inst: Instance, before: pm.Snapshot, after: pm.Snapshot) -> Deltas:
    d = Deltas(requests=pm.counter_rise(before, after, M_REQS),
               tokens=pm.counter_rise(before, after, M_PROMPT if inst.role == "prefill" else M_GEN),
               failed={k: pm.counter_rise(before, after, name) for k, name in FAILURES})
    if inst.role == "prefill":
        d.kv_transfers, d.kv_mb, d.kv_kind = kv_moved(before, after)
    return d


def _pair_snaps(ctx: Ctx, label: str) -> tuple[dict[str, pm.Snapshot], list[str]]:
    """(instance id -> snapshot) of ctx.snaps[label], and why each unreadable one is."""
    got, bad = {}, []
    for iid, snap in ctx.snaps.get(label, {}).items():
        if isinstance(snap, pm.Snapshot):
            got[iid] = snap
        else:
            bad.append(str(snap))
    return got, bad


# --- over the router's traffic ---------------------------------------------------------------
def check_disaggregation(ctx: Ctx) -> Result:
    before, bad_b = _pair_snaps(ctx, "completion_before")
    after, bad_a = _pair_snaps(ctx, "completion_after")
    if bad_b or bad_a:
        return Result(FAIL, f"cannot read metrics: {(bad_b + bad_a)[0]}",
                      "the proof of disaggregation needs every prefill's and decode's /metrics")
    per = {i.id: deltas(i, before[i.id], after[i.id]) for i in ctx.t.instances if i.id in before and i.id in after}
    prefills = [i for i in ctx.t.role("prefill") if i.id in per]
    decodes = [i for i in ctx.t.role("decode") if i.id in per]
    prompt = _sum(per[i.id].tokens for i in prefills)
    gen = _sum(per[i.id].tokens for i in decodes)
    kv_n = _sum(per[i.id].kv_transfers for i in prefills)
    kv_mb = _sum(per[i.id].kv_mb for i in prefills)
    failed = {f"{iid} {k}": v for iid, d in per.items() for k, v in d.failed.items() if v}
    ctx.measurements["disaggregation"] = {
        "prefill_prompt_tokens": prompt, "decode_generation_tokens": gen, "kv_transfers": kv_n,
        "kv_transfer_mb": kv_mb, "failed_requests": failed,
        "router_traffic": {iid: d.as_dict() for iid, d in per.items()}}
    spread = "; ".join(f"{i.id} +{num(per[i.id].requests)} requests" for i in prefills + decodes)
    evidence = (f"prefills: prompt tokens +{num(prompt)}, KV transfers +{num(kv_n)} ({num(kv_mb, '.3f')} MB); "
                f"decodes: generated tokens +{num(gen)}; the router's spread: {spread}; failed requests: "
                + (", ".join(f"{k} +{v:g}" for k, v in failed.items()) or "none"))
    problems, hint = [], ""
    if any(k.endswith("transfer") for k in failed):
        problems.append("KV transfers failed on " + ", ".join(k.split()[0] for k in failed if k.endswith("transfer")))
        hint = ("the KV cache did not reach decode: decode gave up after SGLANG_DISAGGREGATION_WAITING_TIMEOUT or the "
                "transfer engine failed; check the transfer backend (RDMA devices per GPU, memlock, Mooncake TCP "
                f"ports) and the prefills' logs; {RUNBOOK}#disaggregation")
    if any(k.endswith("bootstrap") for k in failed):
        problems.append("bootstrap failed on " + ", ".join(k.split()[0] for k in failed if k.endswith("bootstrap")))
        hint = hint or ("decode could not bootstrap with a prefill (bootstrap server, rank registration, advertised "
                        f"IP): see bootstrap.*; {RUNBOOK}#disaggregation")
    if prompt is None or gen is None:
        problems.append(f"metric(s) missing: {', '.join(_missing(per, prefills, decodes))}")
        hint = hint or "see metrics (a renamed metric)"
    else:
        if not prompt:
            problems.append("no prefill processed a prompt token")
            hint = hint or "requests do not reach the prefills: is the router in PD mode with these prefills?"
        if not gen:
            problems.append("no decode generated a token")
            hint = hint or "decode did not generate: see completion and the decodes' logs"
    if kv_n is not None and not kv_n and not failed:
        problems.append("no prefill recorded a KV transfer")
        hint = hint or "no KV moved from prefill to decode: is a real transfer backend configured (not 'fake')?"
    if kv_n is None and not problems:
        problems.append(f"{M_KV_MB} missing on the prefills")
        hint = "see metrics (a renamed metric)"
    if problems:
        return Result(FAIL, "; ".join(problems) + ": " + evidence, hint)
    return Result(PASS, evidence)


def _sum(values: Any) -> float | None:
    vals = list(values)
    return None if not vals or any(v is None for v in vals) else float(sum(vals))


def _missing(per: dict[str, Deltas], prefills: list[Instance], decodes: list[Instance]) -> list[str]:
    return ([f"{M_PROMPT} on {i.id}" for i in prefills if per[i.id].tokens is None]
            + [f"{M_GEN} on {i.id}" for i in decodes if per[i.id].tokens is None])


# --- one instance at a time --------------------------------------------------------------------
@dataclass
class Handoff:
    """One request the verifier sent to a (prefill, decode) pair, as the router would."""

    prefill: str
    decode: str
    prefill_resp: Response | None = None
    decode_resp: Response | None = None
    text: str = ""
    deltas: dict[str, Deltas] = field(default_factory=dict)  # instance id -> its counters' rise
    unreadable: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def answered(self) -> bool:
        return bool(self.prefill_resp and self.prefill_resp.ok and self.decode_resp and self.decode_resp.ok
                    and self.text)

    def shown(self) -> str:
        def one(resp: Response | None) -> str:
            return "not sent" if resp is None else ("HTTP 200" if resp.ok else resp.short(160))
        return (f"{self.prefill} + {self.decode} hand-off in {self.wall_s:.2f} s: {self.prefill} {one(self.prefill_resp)}"
                f", {self.decode} {one(self.decode_resp)}" + (f" ({len(self.text)} characters)" if self.text else ""))


def instance_check(iid: str) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        return check_instance(ctx, iid)
    return run


def own_checks(inst: Instance) -> list[str]:
    """The checks that say an instance is up (its partner must have passed them)."""
    return [inst.id] + ([f"bootstrap.{inst.id}"] if inst.role == "prefill" else [])


def partner_for(ctx: Ctx, inst: Instance) -> tuple[Instance | None, list[str]]:
    """A partner of the other role whose own checks passed: the same index first (so N
    prefills and M decodes need max(N, M) hand-offs), then a pair already made, then any."""
    mine = ctx.t.role(inst.role)
    others = ctx.t.role("decode" if inst.role == "prefill" else "prefill")
    ok = [o for o in others if all(ctx.results.get(c) is not None and ctx.results[c].status in (PASS, WARN)
                                   for c in own_checks(o))]
    down = [o.id for o in others if o not in ok]
    if not ok:
        return None, down
    first = others[mine.index(inst) % len(others)]
    if first in ok:
        return first, down
    for o in ok:
        if _key(inst, o) in ctx.handoffs:
            return o, down
    return ok[0], down


def _key(a: Instance, b: Instance) -> tuple[str, str]:
    return (a.id, b.id) if a.role == "prefill" else (b.id, a.id)


def handoff(ctx: Ctx, prefill: Instance, decode: Instance) -> Handoff:
    """One PD request to this pair (made once per run; both instances' checks read it)."""
    key = (prefill.id, decode.id)
    if key in ctx.handoffs:
        return ctx.handoffs[key]
    h = Handoff(prefill.id, decode.id)
    ctx.handoffs[key] = h
    if not (prefill.url and decode.url):  # both passed their checks, which need the URL: not expected
        h.unreadable = [f"{i.id} is not reachable from here" for i in (prefill, decode) if not i.url]
        return h
    p_url, d_url = prefill.url, decode.url
    before = {i.id: ctx.scrape(i) for i in (prefill, decode)}
    # A random room: the bootstrap server pairs prefill's and decode's halves by it.
    body = {"text": f"[{prefill.id} {decode.id}] " + make_prompt(ctx.s.prompt_words),
            "sampling_params": {"max_new_tokens": max(ctx.s.max_tokens, 1), "temperature": 0},
            "bootstrap_host": prefill.bootstrap_host, "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": int.from_bytes(os.urandom(8), "big") >> 1}
    resps: dict[str, Response] = {}

    def send(iid: str, url: str) -> None:
        resps[iid] = request("POST", url + "/generate", body=body, headers=ctx.node_headers(), timeout_s=ctx.limit())

    t0 = time.monotonic()
    threads = [threading.Thread(target=send, args=(prefill.id, p_url), daemon=True),
               threading.Thread(target=send, args=(decode.id, d_url), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    h.wall_s = time.monotonic() - t0
    h.prefill_resp, h.decode_resp = resps.get(prefill.id), resps.get(decode.id)
    data = h.decode_resp.json() if h.decode_resp is not None and h.decode_resp.ok else None
    if isinstance(data, list):  # /generate answers a list for a batch
        data = data[0] if data else None
    h.text = str(data.get("text") or "") if isinstance(data, dict) else ""
    end = time.monotonic() + min(SETTLE_S, max(ctx.deadline.left(), 0))
    while True:
        after = {i.id: ctx.scrape(i) for i in (prefill, decode)}
        h.unreadable = [str(s) for s in (*before.values(), *after.values()) if not isinstance(s, pm.Snapshot)]
        if h.unreadable:
            break
        h.deltas = {i.id: deltas(i, b, a) for i in (prefill, decode)
                    if isinstance(b := before[i.id], pm.Snapshot) and isinstance(a := after[i.id], pm.Snapshot)}
        if not h.answered or all(not _short(i, h.deltas[i.id]) for i in (prefill, decode)) \
                or time.monotonic() >= end:
            break
        time.sleep(0.05)
    return h


def _short(inst: Instance, d: Deltas) -> list[str]:
    """What an instance's counters lack to prove it did its part of one request."""
    out = []
    if not d.requests:
        out.append(f"{M_REQS} +{num(d.requests)}")
    if not d.tokens:
        out.append(f"{M_PROMPT if inst.role == 'prefill' else M_GEN} +{num(d.tokens)}")
    if inst.role == "prefill" and d.kv_kind != "gauge" and not d.kv_transfers:
        out.append(f"KV transfers ({M_KV_MB} count) +{num(d.kv_transfers)}")
    return out


def check_instance(ctx: Ctx, iid: str) -> Result:
    inst = ctx.t.instance(iid)
    partner, down = partner_for(ctx, inst)
    if partner is None:
        other = "decode" if inst.role == "prefill" else "prefill"
        why = f"no {other} instance passed its checks ({', '.join(down)})"
        return Result(SKIP, f"skipped: because {why}", "see the failed checks above", cause=why)
    send_all(ctx)  # every instance's hand-off first: a failure is then judged knowing the others
    p, d = (inst, partner) if inst.role == "prefill" else (partner, inst)
    h = handoff(ctx, p, d)
    ctx.measurements.setdefault("instances", {})[iid] = {
        "partner": partner.id, "handoff_s": round(h.wall_s, 4),
        **({"counters": h.deltas[iid].as_dict()} if iid in h.deltas else {})}
    if h.unreadable:
        return Result(FAIL, f"{h.shown()}; cannot read metrics: {h.unreadable[0]}",
                      f"the proof needs {iid}'s /metrics (enable_metrics: true)")
    mine = h.deltas[iid]
    counted = (f"{iid} counted +{num(mine.requests)} requests, +{num(mine.tokens)} "
               + ("prompt tokens" if inst.role == "prefill" else "generated tokens")
               + (f", +{num(mine.kv_transfers)} KV transfers ({num(mine.kv_mb, '.3f')} MB)"
                  if inst.role == "prefill" else ""))
    evidence = f"{h.shown()}; {counted}"
    failed = [f"{k} +{v:g}" for k, v in mine.failed.items() if v]
    if failed:
        what = "transfer" if mine.failed.get("transfer") else "bootstrap"
        return Result(FAIL, f"{iid} counted failed requests ({', '.join(failed)}): {evidence}",
                      f"the {what} between {p.id} and {d.id} failed: {unit_hint(ctx, iid)}; "
                      f"{RUNBOOK}#disaggregation")
    if not h.answered:
        return Result(FAIL, f"{iid} did not serve its part: {evidence}", _blame(ctx, inst, partner, h))
    short = _short(inst, mine)
    if short:
        return Result(FAIL, f"{iid}'s counters did not rise ({', '.join(short)}): {evidence}",
                      f"the request was answered but {iid} did not count it: it went elsewhere (is "
                      f"{inst.url} the instance the plan runs?) or a metric was renamed (see metrics)")
    return Result(PASS, evidence)


def send_all(ctx: Ctx) -> None:
    """The hand-off of every instance whose own checks passed (each sent once)."""
    for inst in ctx.t.instances:
        if all(ctx.results.get(c) is not None and ctx.results[c].status in (PASS, WARN) for c in own_checks(inst)):
            partner, _ = partner_for(ctx, inst)
            if partner is not None:
                handoff(ctx, *((inst, partner) if inst.role == "prefill" else (partner, inst)))


def _failed_with(ctx: Ctx, iid: str) -> tuple[list[str], list[str]]:
    """(partners an instance failed with, partners it served with) over every hand-off sent."""
    failed, served = [], []
    for (p, d), h in ctx.handoffs.items():
        if iid in (p, d):
            (served if h.answered else failed).append(d if iid == p else p)
    return failed, served


def _blame(ctx: Ctx, inst: Instance, partner: Instance, h: Handoff) -> str:
    """Which side of a failed hand-off is at fault, from every hand-off sent: the one that
    served with another instance is fine; the one that failed with several is not."""
    p_failed, p_served = _failed_with(ctx, partner.id)
    mine_failed, _ = _failed_with(ctx, inst.id)
    if p_served or (len(mine_failed) > 1 and len(p_failed) <= 1):
        why = (f"{partner.id} serves with {', '.join(p_served)}" if p_served
               else f"{inst.id} failed with every partner tried ({', '.join(mine_failed)})")
        return f"the fault is {inst.id}'s: {why}; {unit_hint(ctx, inst.id)}; {RUNBOOK}#disaggregation"
    if len(p_failed) > 1:
        return (f"the fault is likely {partner.id}'s: it failed with every partner tried ({', '.join(p_failed)}); "
                f"see disaggregation.{partner.id}; {RUNBOOK}#disaggregation")
    return (f"the pair {h.prefill} + {h.decode} failed and neither served with another instance: read both logs; "
            f"timeouts mean the KV cache never arrived (transfer backend); {RUNBOOK}#disaggregation")
