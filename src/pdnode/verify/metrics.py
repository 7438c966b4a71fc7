"""Prometheus text -> snapshots; deltas, histogram quantiles, throughput (pure functions).

Parsing uses prometheus_client's text parser (the maintained one), never regexes. A
``Snapshot`` keeps every sample of one scrape; the math works on two snapshots taken
before and after a piece of work, summed over all label sets (every reporting rank,
streaming or not), like ``sum by (le) (increase(x_bucket[...]))`` in PromQL.

Quantiles follow Prometheus's ``histogram_quantile``: find the bucket holding the rank
``q * count`` and interpolate linearly inside it, assuming observations are spread
evenly between its lower and upper bound; a rank in the +Inf bucket answers the highest
finite bound; the first bucket's lower bound is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


class MetricsParseError(ValueError):
    """The text is not Prometheus exposition format."""


@dataclass
class Snapshot:
    """One scrape: family name -> type, sample name -> {labels: value}."""

    types: dict[str, str] = field(default_factory=dict)
    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)

    def has(self, metric: str) -> bool:
        """Does the scrape know ``metric`` (a sample name such as x_total, or a family)?"""
        if metric in self.samples or metric in self.types:
            return True
        # counters: the parser names the family without _total
        if metric.endswith("_total") and metric[: -len("_total")] in self.types:
            return True
        return any(f"{metric}{suffix}" in self.samples for suffix in ("_bucket", "_count", "_sum"))

    def kind(self, metric: str) -> str | None:
        if metric in self.types:
            return self.types[metric]
        if metric.endswith("_total"):
            return self.types.get(metric[: -len("_total")])
        return None

    def names(self) -> set[str]:
        out = set(self.samples)
        for family, kind in self.types.items():
            out.add(family + "_total" if kind == "counter" else family)
        return out

    def series(self, sample: str, match: Mapping[str, str] | None = None) -> dict[Labels, float]:
        rows = self.samples.get(sample, {})
        if not match:
            return dict(rows)
        return {lab: v for lab, v in rows.items() if all(dict(lab).get(k) == val for k, val in match.items())}

    def total(self, sample: str, match: Mapping[str, str] | None = None) -> float | None:
        """Sum over label sets; None when the sample does not exist."""
        rows = self.series(sample, match)
        return sum(rows.values()) if rows else None


def parse(text: str) -> Snapshot:
    snap = Snapshot()
    try:
        for family in text_string_to_metric_families(text):
            snap.types[family.name] = family.type
            for s in family.samples:
                labels: Labels = tuple(sorted(s.labels.items()))
                snap.samples.setdefault(s.name, {})[labels] = float(s.value)
    except ValueError as exc:  # the parser raises ValueError on malformed lines
        raise MetricsParseError(f"not Prometheus text format: {exc}") from None
    return snap


INSTANCE_LABEL = "pdnode_instance"


def merge(snaps: Mapping[str, Snapshot]) -> Snapshot:
    """Several instances' scrapes as one, each series labelled with its instance
    (``pdnode_instance``): deltas and quantiles then sum over the instances, per series,
    like ``sum by (le) (increase(...))`` across Prometheus targets."""
    out = Snapshot()
    for iid, snap in snaps.items():
        for family, kind in snap.types.items():
            out.types.setdefault(family, kind)
        for sample, rows in snap.samples.items():
            dest = out.samples.setdefault(sample, {})
            for labels, value in rows.items():
                dest[tuple(sorted((*labels, (INSTANCE_LABEL, iid))))] = value
    return out


# --- deltas ---------------------------------------------------------------------------
def counter_delta(before: Snapshot, after: Snapshot, sample: str,
                  match: Mapping[str, str] | None = None) -> float | None:
    """Increase of a counter summed over label sets; a series that went down was reset
    (process restart), so its whole value after counts, like PromQL's increase().
    None when the sample is absent after."""
    rows_after = after.series(sample, match)
    if not rows_after:
        return None
    rows_before = before.series(sample, match)
    total = 0.0
    for labels, value in rows_after.items():
        old = rows_before.get(labels, 0.0)
        total += value - old if value >= old else value
    return total


def counter_rise(before: Snapshot, after: Snapshot, sample: str) -> float | None:
    """counter_delta, with 0 for a counter the scrape declares (# TYPE) without a series:
    an engine that served nothing yet has no labelled series, they appear with the first
    request. None only when the scrape does not have the metric at all."""
    d = counter_delta(before, after, sample)
    return 0.0 if d is None and after.has(sample) else d


def histogram_delta(before: Snapshot, after: Snapshot, name: str,
                    match: Mapping[str, str] | None = None) -> HistogramDelta | None:
    """Per-series difference of a histogram's buckets, _sum and _count, then summed."""
    if not after.series(f"{name}_bucket", match) and not after.series(f"{name}_count", match):
        return None
    buckets: dict[float, float] = {}
    b_rows = before.series(f"{name}_bucket", match)
    reset_series: set[Labels] = set()
    count_before = before.series(f"{name}_count", match)
    for labels, value in after.series(f"{name}_count", match).items():
        if value < count_before.get(labels, 0.0):
            reset_series.add(labels)
    for labels, value in after.series(f"{name}_bucket", match).items():
        d = dict(labels)
        le = d.pop("le", None)
        if le is None:
            continue
        base = tuple(sorted(d.items()))
        old = 0.0 if base in reset_series else b_rows.get(labels, 0.0)
        bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + (value - old)

    def _delta(suffix: str) -> float:
        rows_before = before.series(f"{name}{suffix}", match)
        total = 0.0
        for labels, value in after.series(f"{name}{suffix}", match).items():
            total += value - (0.0 if labels in reset_series else rows_before.get(labels, 0.0))
        return total

    return HistogramDelta(buckets=buckets, count=_delta("_count"), sum=_delta("_sum"))


@dataclass(frozen=True)
class HistogramDelta:
    buckets: dict[float, float]  # upper bound -> cumulative count (may lack +Inf)
    count: float
    sum: float

    def quantile(self, q: float) -> float:
        return histogram_quantile(q, self.buckets)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan


def histogram_quantile(q: float, buckets: Mapping[float, float] | Iterable[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) pairs.

    NaN when there are no observations or no +Inf bucket (as in Prometheus)."""
    pairs = sorted((buckets.items() if isinstance(buckets, Mapping) else buckets), key=lambda p: p[0])
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if len(pairs) < 2 or not math.isinf(pairs[-1][0]):
        return math.nan
    # Cumulative counts must not decrease (float noise or a partial scrape): repair like
    # Prometheus does, by carrying the maximum forward.
    fixed: list[tuple[float, float]] = []
    running = 0.0
    for bound, count in pairs:
        running = max(running, count)
        fixed.append((bound, running))
    observations = fixed[-1][1]
    if observations <= 0:
        return math.nan
    rank = q * observations
    b = next(i for i, (_, count) in enumerate(fixed) if count >= rank)
    if b == len(fixed) - 1:
        return fixed[-2][0]
    if b == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start, end, count = 0.0, fixed[b][0], fixed[b][1]
    if b > 0:
        start = fixed[b - 1][0]
        count -= fixed[b - 1][1]
        rank -= fixed[b - 1][1]
    if count <= 0:
        return end
    return start + (end - start) * (rank / count)


def throughput(tokens: float | None, seconds: float) -> float | None:
    """Tokens per second over an interval; None when not computable."""
    if tokens is None or seconds <= 0:
        return None
    return tokens / seconds


def close_names(name: str, available: Iterable[str], n: int = 3) -> list[str]:
    """Metric names that look like ``name`` (for 'was it renamed?' hints)."""
    import difflib

    pool = sorted(set(available))
    found = difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
    if not found:
        # a renamed metric often keeps its distinctive words: e2e, latency, ...
        words = {w for w in name.replace("sglang:", "").split("_") if len(w) > 2 and w not in ("seconds", "total")}
        scored = sorted(((sum(w in p for w in words), p) for p in pool), reverse=True)
        found = [p for score, p in scored[:n] if score >= max(2, len(words) - 1)]
    return found
