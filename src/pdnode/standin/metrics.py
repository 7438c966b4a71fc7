"""Prometheus metrics with SGLang 0.5.23's names, types, labels and bucket boundaries.

Two label sets, as in SGLang (sglang/srt/observability/metrics_collector.py):
- tokenizer-level (one per process): model_name, engine_type, plus is_streaming on
  prompt/generation token counters, num_requests_total, TTFT and e2e latency;
- scheduler-level (one per reporting scheduler = attention-TP rank 0 of every DP group):
  model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, and dp_rank when DP is on.
The KV-transfer metrics are histograms in 0.5.23 (not gauges), and the prefill queue
gauge is num_prefill_bootstrap_queue_reqs.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

# SGLang serves its metrics from multiprocess mode, which has no *_created series.
disable_created_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
    1800, 2400,
)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)
QUEUE_TIME_BUCKETS = (
    0.000, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30,
    40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400,
    1600, 1800, 2000, 2500, 3000,
)
KV_SPEED_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
KV_LATENCY_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
KV_BOOTSTRAP_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
KV_TOTAL_MB_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)

SCHEDULER_GAUGES = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "token_usage": "The token usage.",
    "gen_throughput": "The generation throughput (token/s).",
    "cache_hit_rate": "The prefix cache hit rate.",
    "num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
    "num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
}
SCHEDULER_COUNTERS = {
    "num_bootstrap_failed_reqs": "The number of bootstrap failed requests.",
    "num_transfer_failed_reqs": "The number of transfer failed requests.",
    "num_prefill_retries": "Total number of prefill retries.",
}


def scheduler_labels(
    *, model_name: str, engine_type: str, tp_size: int, attn_dp_size: int, dp_size: int,
    ep_size: int,
) -> list[dict[str, str]]:
    """One label set per reporting scheduler (attention-TP rank 0 of each DP group)."""
    groups = attn_dp_size if attn_dp_size > 1 else dp_size
    attn_tp = tp_size // attn_dp_size if attn_dp_size > 1 else tp_size
    tp_per_ep = max(tp_size // ep_size, 1)
    out = []
    for dp_rank in range(groups):
        tp_rank = dp_rank * attn_tp if attn_dp_size > 1 else 0
        labels = {
            "model_name": model_name,
            "engine_type": engine_type,
            "tp_rank": str(tp_rank),
            "pp_rank": "0",
            "moe_ep_rank": str(tp_rank // tp_per_ep),
        }
        if groups > 1:
            labels["dp_rank"] = str(dp_rank)
        out.append(labels)
    return out


class Metrics:
    def __init__(self, *, model_name: str, engine_type: str, ranks: Sequence[Mapping[str, str]]) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name, "engine_type": engine_type}
        self.ranks = [dict(r) for r in ranks]
        tok = list(self.labels)
        stream = tok + ["is_streaming"]
        sched = list(self.ranks[0])
        reg = self.registry

        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", stream, registry=reg)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.", stream, registry=reg)
        self.num_requests = Counter("sglang:num_requests_total", "Number of requests processed.", stream, registry=reg)
        self.num_aborted = Counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tok, registry=reg)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", stream, buckets=TTFT_BUCKETS, registry=reg)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tok, buckets=ITL_BUCKETS, registry=reg)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", stream, buckets=E2E_BUCKETS, registry=reg)

        self.queue_time = Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", sched, buckets=QUEUE_TIME_BUCKETS, registry=reg)
        self.kv_speed = Histogram("sglang:kv_transfer_speed_gb_s", "Histogram of KV cache transfer speed in GB/s.", sched, buckets=KV_SPEED_BUCKETS, registry=reg)
        self.kv_latency = Histogram("sglang:kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.", sched, buckets=KV_LATENCY_BUCKETS, registry=reg)
        self.kv_bootstrap = Histogram("sglang:kv_transfer_bootstrap_ms", "Histogram of KV transfer bootstrap time in ms.", sched, buckets=KV_BOOTSTRAP_BUCKETS, registry=reg)
        self.kv_alloc = Histogram("sglang:kv_transfer_alloc_ms", "Histogram of KV transfer allocation waiting time in ms.", sched, buckets=KV_BOOTSTRAP_BUCKETS, registry=reg)
        self.kv_total_mb = Histogram("sglang:kv_transfer_total_mb", "Histogram of KV cache transfer size in MB.", sched, buckets=KV_TOTAL_MB_BUCKETS, registry=reg)
        self.gauges = {
            name: Gauge(f"sglang:{name}", doc, sched, registry=reg) for name, doc in SCHEDULER_GAUGES.items()
        }
        self.counters = {
            name: Counter(f"sglang:{name}_total", doc, sched, registry=reg) for name, doc in SCHEDULER_COUNTERS.items()
        }
        # a process-wide counter without labels in SGLang too (mooncake/conn.py)
        self.failed_session_recoveries = Counter("sglang:failed_session_recoveries",
                                                 "Number of mooncake_session_ids un-blacklisted via probe.",
                                                 registry=reg)
        # Scheduler gauges and counters exist from the start (value 0), like SGLang's
        # periodic stats; histograms and tokenizer series appear with the first request.
        for labels in self.ranks:
            for gauge in self.gauges.values():
                gauge.labels(**labels).set(0)
            for counter in self.counters.values():
                counter.labels(**labels)

    # --- tokenizer level -------------------------------------------------------------
    def _stream(self, stream: bool) -> dict[str, str]:
        return {**self.labels, "is_streaming": "true" if stream else "false"}

    def observe_ttft(self, seconds: float, stream: bool) -> None:
        self.ttft.labels(**self._stream(stream)).observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        self.itl.labels(**self.labels).observe(seconds)

    def observe_finished(self, *, prompt_tokens: int, generation_tokens: int, e2e_s: float, stream: bool) -> None:
        labels = self._stream(stream)
        self.prompt_tokens.labels(**labels).inc(prompt_tokens)
        self.generation_tokens.labels(**labels).inc(generation_tokens)
        self.num_requests.labels(**labels).inc()
        self.e2e.labels(**labels).observe(e2e_s)

    def observe_aborted(self) -> None:
        self.num_aborted.labels(**self.labels).inc()

    # --- scheduler level -------------------------------------------------------------
    def observe_queue_time(self, rank: int, seconds: float) -> None:
        self.queue_time.labels(**self.ranks[rank]).observe(seconds)

    def observe_kv_transfer(self, rank: int, *, latency_ms: float, total_mb: float, speed_gb_s: float) -> None:
        labels = self.ranks[rank]
        self.kv_latency.labels(**labels).observe(latency_ms)
        self.kv_total_mb.labels(**labels).observe(total_mb)
        self.kv_speed.labels(**labels).observe(speed_gb_s)

    def observe_kv_bootstrap(self, rank: int, *, bootstrap_ms: float, alloc_ms: float) -> None:
        labels = self.ranks[rank]
        self.kv_bootstrap.labels(**labels).observe(bootstrap_ms)
        self.kv_alloc.labels(**labels).observe(alloc_ms)

    def inc(self, rank: int, counter: str) -> None:
        self.counters[counter].labels(**self.ranks[rank]).inc()

    def set_gauge(self, rank: int, gauge: str, value: float) -> None:
        self.gauges[gauge].labels(**self.ranks[rank]).set(value)

    # --- exposition ------------------------------------------------------------------
    def render(self, renames: Mapping[str, str] | None = None) -> bytes:
        if not renames:
            return generate_latest(self.registry)
        return generate_latest(_Renamed(self.registry, renames))


class _Renamed:
    """A collector view of a registry with some metric families exposed under other names."""

    def __init__(self, registry: CollectorRegistry, renames: Mapping[str, str]) -> None:
        self.registry = registry
        self.renames = dict(renames)

    def _target(self, family: Metric) -> str | None:
        for old, new in self.renames.items():
            if family.name == old:
                return new
            if family.type == "counter" and family.name + "_total" == old:
                return new[: -len("_total")] if new.endswith("_total") else new
        return None

    def collect(self) -> Any:
        for family in self.registry.collect():
            new = self._target(family)
            if new is None:
                yield family
                continue
            renamed = Metric(new, family.documentation, family.type, family.unit)
            for s in family.samples:
                renamed.add_sample(new + s.name[len(family.name):], s.labels, s.value, s.timestamp, s.exemplar)
            yield renamed
