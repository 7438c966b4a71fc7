"""The planner's performance model: measured runs -> engine rates -> any layout's
throughput and latency (docs/planner.md says why each assumption holds).

A layout is two pools of scheduler ranks (SGLang runs one scheduler per attention-DP
rank, or per DP replica without attention DP): prefill ranks of g GPUs, decode ranks.
Four rates describe the engine, all fitted from `pdnode bench --json` runs, never read
from a stand-in's settings:

    tau    prefill seconds per prompt token on ONE GPU; a rank of g GPUs takes tau/g
           (linear tensor parallelism); P = 1/tau tokens/s per GPU
    beta   decode step of a rank running one request (the lone request's ITL)
    gamma  what each further running request of the rank adds to a step
    delta  fixed time to first token (router, HTTP, bootstrap, scheduling)

plus the KV hand-off per prompt token (KV bytes per token / link speed), which is given.
For an offered load of X requests/s:

    prefill   s = I tau / g, utilisation rho = X s / R_p, latency s / (1 - rho)
    decode    n = X (O - 1) ITL / R_d requests per rank (Little), ITL = beta + gamma (n - 1)
    TTFT      delta + s / (1 - rho) + I kv + ITL/2 (joining the running batch)
    request   L = TTFT + (O - 1) ITL
    closed    concurrency C: X = C / L (solved by bisection); open: X = the rate

Colocated (non-PD) ranks do both on one pool: prefill passes stall the decode steps,
ITL = step / (1 - rho), and there is no hand-off. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BENCH_SCHEMA = "pdnode.bench/1"


class MeasurementError(ValueError):
    """A measurements file cannot be used; the message is one line naming file, field, fix."""


@dataclass(frozen=True)
class Pool:
    """One role's scheduler ranks in a layout (summed over its instances)."""

    ranks: int
    gpus: int
    batch_limit: int | None = None  # running requests per rank; None: not limiting

    @property
    def rank_gpus(self) -> float:
        return self.gpus / self.ranks


@dataclass(frozen=True)
class Shape:
    prefill: Pool | None  # None: colocated (every rank does both)
    decode: Pool

    @property
    def colocated(self) -> bool:
        return self.prefill is None


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    concurrency: int | None = None  # closed loop (each client sends its next request at once)
    rate: float | None = None  # open loop, requests/s


@dataclass(frozen=True)
class Params:
    tau: float  # prefill s per prompt token per GPU
    beta: float  # decode step at batch 1, s
    gamma: float  # decode step increase per further request, s
    delta: float  # fixed TTFT, s
    kv_s_per_token: float  # KV hand-off per prompt token, s

    def as_dict(self) -> dict[str, float]:
        return {"prefill_tokens_per_s_per_gpu": 1 / self.tau if self.tau > 0 else math.inf,
                "prefill_s_per_token_per_gpu": self.tau, "decode_step_base_s": self.beta,
                "decode_step_per_request_s": self.gamma, "fixed_ttft_s": self.delta,
                "kv_handoff_s_per_token": self.kv_s_per_token}


@dataclass(frozen=True)
class Prediction:
    request_s: float
    output_tok_s: float
    ttft_s: float
    itl_s: float
    decode_batch: float  # running requests per decode rank
    prefill_util: float
    bottleneck: str  # prefill | decode | decode batch limit | concurrency | rate

    def as_dict(self) -> dict[str, Any]:
        return {"request_throughput": self.request_s, "output_token_throughput": self.output_tok_s,
                "ttft_s": self.ttft_s, "itl_s": self.itl_s, "decode_batch_per_rank": self.decode_batch,
                "prefill_utilisation": self.prefill_util, "bottleneck": self.bottleneck}


@dataclass(frozen=True)
class Run:
    source: str
    workload: Workload
    shape: Shape
    request_s: float
    ttft_s: float
    itl_s: float


# --- layouts ------------------------------------------------------------------------------

def pool_of(instances: Sequence[Mapping[str, Any]], batch_limits: Sequence[int | None] | None = None) -> Pool:
    """Instances (plan/bench shape: tp_size, dp_size, attn_dp_size) -> their ranks and GPUs."""
    ranks = gpus = 0
    limits: list[int] = []
    for i, inst in enumerate(instances):
        tp = int(inst.get("tp_size") or 1)
        dp = int(inst.get("dp_size") or 1)
        adp = int(inst.get("attn_dp_size") or 1)
        if adp > 1:
            ranks += adp
            gpus += tp
        else:
            ranks += dp
            gpus += tp * dp
        limit = batch_limits[i] if batch_limits else None
        if limit is not None:
            limits.append(limit)
    return Pool(ranks=ranks, gpus=gpus, batch_limit=min(limits) if limits else None)


# --- the model ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _State:
    ttft: float
    itl: float
    n: float
    rho: float

    def latency(self, steps: int) -> float:
        return self.ttft + steps * self.itl


def _state(shape: Shape, p: Params, w: Workload, x: float) -> _State | None:
    """The steady state at x requests/s, or None when some pool cannot carry it."""
    steps = max(w.output_len - 1, 0)
    pre = shape.decode if shape.colocated else shape.prefill
    assert pre is not None
    s = w.input_len * p.tau / pre.rank_gpus
    rho = x * s / pre.ranks
    if rho >= 1:
        return None
    stretch = 1 / (1 - rho) if shape.colocated else 1.0
    a = x * steps / shape.decode.ranks * stretch  # requests per rank per second of step time
    if a * p.beta <= 1:
        n = a * p.beta
    elif a * p.gamma < 1:
        n = a * (p.beta - p.gamma) / (1 - a * p.gamma)
    else:
        return None
    limit = shape.decode.batch_limit
    if limit is not None and n > limit:
        return None
    itl = stretch * (p.beta + p.gamma * max(n - 1, 0))
    handoff = 0.0 if shape.colocated else w.input_len * p.kv_s_per_token
    ttft = p.delta + s / (1 - rho) + handoff + 0.5 * itl * min(1.0, n)
    return _State(ttft=ttft, itl=itl, n=n, rho=rho)


def _capacity(shape: Shape, p: Params, w: Workload, hi: float) -> float:
    """The largest feasible load below hi (feasibility is monotone in the load)."""
    if _state(shape, p, w, hi) is not None:
        return hi
    lo = 0.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _state(shape, p, w, mid) is None:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(hi, 1e-9):
            break
    return lo


def capacities(shape: Shape, p: Params, w: Workload) -> dict[str, float]:
    """Requests/s each pool could carry alone: prefill ranks / s; decode ranks over the
    steps' per-request cost (the step grows with the batch), or at the batch limit."""
    steps = max(w.output_len - 1, 1)
    pre = shape.decode if shape.colocated else shape.prefill
    assert pre is not None
    out = {"prefill": pre.ranks * pre.rank_gpus / (w.input_len * p.tau) if p.tau > 0 else math.inf,
           "decode": shape.decode.ranks / (steps * p.gamma) if p.gamma > 0 else math.inf}
    limit = shape.decode.batch_limit
    if limit is not None:
        out["decode batch limit"] = shape.decode.ranks * limit / (steps * (p.beta + p.gamma * (limit - 1)))
    return out


def _limiting(shape: Shape, p: Params, w: Workload, x: float, near: float = 0.95) -> str:
    """The pool whose capacity load x (nearly) reaches, else "concurrency" (the clients
    are too few to fill any pool)."""
    name, cap = min(capacities(shape, p, w).items(), key=lambda kv: kv[1])
    return name if x >= near * cap else "concurrency"


def predict(shape: Shape, p: Params, w: Workload) -> Prediction:
    steps = max(w.output_len - 1, 0)
    zero = _state(shape, p, w, 0.0)
    assert zero is not None
    if w.concurrency is not None:
        hi = w.concurrency / zero.latency(steps)  # L only grows with load
    else:
        assert w.rate is not None
        hi = w.rate * 2 + 1
    cap = _capacity(shape, p, w, hi)
    if w.concurrency is not None:
        lo, top = 0.0, cap
        top_state = _state(shape, p, w, top)
        assert top_state is not None
        if w.concurrency / top_state.latency(steps) >= top:
            # saturated: the clients queue at the bottleneck; Little's law gives the latency
            x, st = top, top_state
            latency = w.concurrency / x
            ttft = latency - steps * st.itl
            return Prediction(x, x * w.output_len, ttft, st.itl, st.n, st.rho, _limiting(shape, p, w, x, 0.0))
        for _ in range(80):  # 2^-80: far below any measurement's precision
            mid = (lo + top) / 2
            st = _state(shape, p, w, mid)
            if st is not None and w.concurrency / st.latency(steps) > mid:
                lo = mid
            else:
                top = mid
        x = lo
        st = _state(shape, p, w, x)
        assert st is not None
        return Prediction(x, x * w.output_len, st.ttft, st.itl, st.n, st.rho, _limiting(shape, p, w, x))
    assert w.rate is not None
    if w.rate < cap:
        st = _state(shape, p, w, w.rate)
        assert st is not None
        return Prediction(w.rate, w.rate * w.output_len, st.ttft, st.itl, st.n, st.rho, "rate")
    st = _state(shape, p, w, cap)
    assert st is not None
    # above capacity the queue (and TTFT) grows for as long as the load lasts
    return Prediction(cap, cap * w.output_len, math.inf, st.itl, st.n, st.rho, _limiting(shape, p, w, cap, 0.0))


# --- fitting the rates to measured runs ---------------------------------------------------

def fit(runs: Sequence[Run], kv_s_per_token: float) -> Params:
    """tau, beta, gamma, delta from PD runs (docs/planner.md, "Fitting")."""
    pd = [r for r in runs if not r.shape.colocated]
    if not pd:
        raise MeasurementError("--measurements: no run of a PD layout; measure the deployed node with `pdnode bench --json`")
    # decode: each run gives one point ITL = beta + gamma * (n - 1), n from Little's law
    points = []
    for r in pd:
        n = r.request_s * max(r.workload.output_len - 1, 0) * r.itl_s / r.shape.decode.ranks
        points.append((max(n - 1.0, 0.0), r.itl_s))
    xs = [x for x, _ in points]
    if len(points) < 2 or max(xs) - min(xs) < 0.5:
        shown = ", ".join(f"{x + 1:.2f}" for x in xs)
        raise MeasurementError(
            f"--measurements: the decode batch per rank is {shown} across the runs; two runs with "
            f"different batches are needed to separate a decode step's base from its per-request cost. "
            f"Fix: add a run at another concurrency (e.g. 8 and 32)")
    mx = sum(xs) / len(xs)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x in xs)
    gamma = sum((x - mx) * (y - my) for x, y in points) / var
    if gamma < 0:  # noise around a flat line: no per-request cost measured
        gamma = 0.0
    beta = max(my - gamma * mx, 1e-9)
    # prefill and the fixed TTFT: the (tau, delta) whose predictions of the measured runs
    # (the closed-loop solution, not the utilisation formula at the measured load, which
    # explodes near saturation) best match their throughput and TTFT, in log terms.
    closed = [r for r in pd if r.workload.concurrency is not None or r.workload.rate is not None]
    if not closed:
        raise MeasurementError("--measurements: no run names its concurrency or rate (workload.concurrency / "
                               "workload.rate); Fix: use `pdnode bench --json` reports")

    def cost(tau: float, delta: float) -> float:
        params = Params(tau=tau, beta=beta, gamma=gamma, delta=delta, kv_s_per_token=kv_s_per_token)
        total = 0.0
        for r in closed:
            pr = predict(r.shape, params, r.workload)
            if not (math.isfinite(pr.ttft_s) and pr.ttft_s > 0 and pr.request_s > 0):
                return math.inf
            total += math.log(pr.request_s / r.request_s) ** 2 + math.log(pr.ttft_s / r.ttft_s) ** 2
        return total

    # tau: at most what makes the fastest-measured run's prefill the whole request time
    tau_hi = min(r.ttft_s * r.shape.prefill.rank_gpus / r.workload.input_len for r in closed
                 if r.shape.prefill is not None)
    delta_hi = min(r.ttft_s for r in closed)
    best = (math.inf, tau_hi / 10, 0.0)
    for i in range(25):
        tau = tau_hi * 10 ** (-4 * i / 24)
        for j in range(13):
            delta = delta_hi * j / 12
            c = cost(tau, delta)
            if c < best[0]:
                best = (c, tau, delta)
    _, tau, delta = best
    step_t, step_d = 10 ** (4 / 24), delta_hi / 12
    for _ in range(40):  # pattern search around the grid's best point
        moved = False
        for t, d in ((tau * step_t, delta), (tau / step_t, delta), (tau, delta + step_d), (tau, delta - step_d)):
            if 0 < t <= tau_hi and 0 <= d <= delta_hi:
                c = cost(t, d)
                if c < best[0]:
                    best, tau, delta, moved = (c, t, d), t, d, True
        if not moved:
            step_t, step_d = step_t ** 0.5, step_d / 2
            if step_t < 1.001:
                break
    return Params(tau=tau, beta=beta, gamma=gamma, delta=delta, kv_s_per_token=kv_s_per_token)


# --- reading pdnode.bench/1 ---------------------------------------------------------------

def _num(doc: Mapping[str, Any], path: str, src: str, minimum: float = 0.0, strict: bool = True) -> float:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise MeasurementError(f"{src}: {path} is missing; Fix: use a `pdnode bench --json` report ({BENCH_SCHEMA})")
        cur = cur[part]
    if isinstance(cur, bool) or not isinstance(cur, (int, float)) or not math.isfinite(cur) or (
            cur <= minimum if strict else cur < minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise MeasurementError(f"{src}: {path}={cur!r} must be a number {bound}; Fix: measure again with `pdnode bench --json`")
    return float(cur)


def _instances(doc: Mapping[str, Any], role: str, src: str) -> list[Mapping[str, Any]]:
    layout = doc.get("layout")
    items = layout.get(role) if isinstance(layout, Mapping) else None
    if not isinstance(items, list) or not items:
        raise MeasurementError(f"{src}: layout.{role} must be a non-empty list of instances; "
                               f"Fix: use a `pdnode bench --json` report of a PD node ({BENCH_SCHEMA})")
    for i, inst in enumerate(items):
        if not isinstance(inst, Mapping):
            raise MeasurementError(f"{src}: layout.{role}[{i}] must be a mapping; Fix: use a `pdnode bench --json` report")
        for key in ("tp_size", "dp_size", "attn_dp_size"):
            value = inst.get(key, 1)
            if value is None:
                value = 1
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MeasurementError(f"{src}: layout.{role}[{i}].{key}={value!r} must be an integer >= 1; "
                                       f"Fix: use a `pdnode bench --json` report")
    return items


def run_from_bench(doc: Any, src: str) -> Run:
    if not isinstance(doc, Mapping):
        raise MeasurementError(f"{src}: the top level must be a JSON object ({BENCH_SCHEMA}); Fix: use `pdnode bench --json` output")
    if doc.get("schema") != BENCH_SCHEMA:
        raise MeasurementError(f"{src}: schema={doc.get('schema')!r} is not {BENCH_SCHEMA!r}; "
                               f"Fix: use `pdnode bench --json` output")
    spec = doc.get("workload") if isinstance(doc.get("workload"), Mapping) else {}
    conc, rate = spec.get("concurrency"), spec.get("rate")
    # lengths drawn uniformly from range_ratio x len to len (bench's random dataset): the mean
    ratio = spec.get("range_ratio", 1.0)
    ratio = float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 1 else 1.0
    mean = (1 + ratio) / 2
    wl = Workload(input_len=max(round(_num(doc, "workload.input_len", src, 1, strict=False) * mean), 1),
                  output_len=max(round(_num(doc, "workload.output_len", src, 2, strict=False) * mean), 2),
                  concurrency=conc if isinstance(conc, int) and not isinstance(conc, bool) and conc > 0 else None,
                  rate=float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool)
                  and math.isfinite(rate) and rate > 0 else None)
    completed = _num(doc, "results.completed", src)
    failed = _num(doc, "results.failed", src, 0, strict=False)
    if failed > 0.01 * completed:
        raise MeasurementError(f"{src}: results.failed={failed:g} of {completed + failed:g} requests; a run with "
                               f"failures does not measure capacity. Fix: find why they failed, then measure again")
    shape = Shape(prefill=pool_of(_instances(doc, "prefill", src)), decode=pool_of(_instances(doc, "decode", src)))
    return Run(source=src, workload=wl, shape=shape,
               request_s=_num(doc, "results.request_throughput", src),
               ttft_s=_num(doc, "results.ttft_s.mean", src),
               itl_s=_num(doc, "results.itl_s.mean", src))
