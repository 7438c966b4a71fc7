"""The threshold table and the metric names the verifier relies on: the ONE place they are written.

No imports: pdnode.core.inventory.fields (inventory validation, docs/inventory.md) reads
THRESHOLD_KEYS and the verifier (pdnode.verify) the table and the metric names; it sits
in core, below both. Metric names are SGLang 0.5.23's.
"""

from __future__ import annotations

from typing import NamedTuple

M_PROMPT = "sglang:prompt_tokens_total"
M_GEN = "sglang:generation_tokens_total"
M_REQS = "sglang:num_requests_total"
M_TTFT = "sglang:time_to_first_token_seconds"
M_ITL = "sglang:inter_token_latency_seconds"
M_E2E = "sglang:e2e_request_latency_seconds"
M_KV_MB = "sglang:kv_transfer_total_mb"
M_KV_SPEED = "sglang:kv_transfer_speed_gb_s"
M_BOOT_FAIL = "sglang:num_bootstrap_failed_reqs_total"
M_XFER_FAIL = "sglang:num_transfer_failed_reqs_total"


class Threshold(NamedTuple):
    description: str  # what docs/inventory.md says about the key
    role: str  # the engine role whose /metrics has the metric (summed over its instances)
    metric: str
    # a quantile, "mean" (per observation) or "rate": the counter's delta over the burst as
    # the engines timed it (the role's M_E2E sum delta / the burst's concurrency), not the
    # client's wall clock, which on a stand-in is the machine's CPU (issue 27)
    stat: float | str
    unit: str
    comparison: str  # "max": the value must not exceed the limit; "min": must reach it


THRESHOLDS: dict[str, Threshold] = {
    "ttft_p50_max_s": Threshold("time to first token, median", "decode", M_TTFT, 0.50, "s", "max"),
    "ttft_p99_max_s": Threshold("time to first token, 99th percentile", "decode", M_TTFT, 0.99, "s", "max"),
    "itl_p50_max_s": Threshold("inter-token latency, median", "decode", M_ITL, 0.50, "s", "max"),
    "itl_p99_max_s": Threshold("inter-token latency, 99th percentile", "decode", M_ITL, 0.99, "s", "max"),
    "e2e_p99_max_s": Threshold("end-to-end request latency, 99th percentile", "decode", M_E2E, 0.99, "s", "max"),
    "decode_throughput_min_tok_s": Threshold("decode generation throughput floor", "decode", M_GEN, "rate",
                                             "tok/s", "min"),
    "kv_transfer_speed_min_gb_s": Threshold("KV transfer speed floor (catches a fall-back to TCP)", "prefill",
                                            M_KV_SPEED, "mean", "GB/s", "min"),
}


def metrics_needed(t: Threshold) -> tuple[str, ...]:
    """The metrics a threshold is computed from: a rate also needs the role's e2e histogram
    (its time base)."""
    return (t.metric, M_E2E) if t.stat == "rate" else (t.metric,)


# key -> description: what the inventory may set under pdnode_verify_thresholds.
THRESHOLD_KEYS: dict[str, str] = {k: t.description for k, t in THRESHOLDS.items()}

# role -> metric -> what needs it (the metrics check names the need when one is missing).
REQUIRED_METRICS: dict[str, dict[str, str]] = {
    "prefill": {M_REQS: "disaggregation", M_PROMPT: "disaggregation", M_KV_MB: "disaggregation",
                M_BOOT_FAIL: "disaggregation", M_XFER_FAIL: "disaggregation"},
    "decode": {M_REQS: "disaggregation", M_GEN: "disaggregation", M_BOOT_FAIL: "disaggregation",
               M_XFER_FAIL: "disaggregation"},
}
for _key, _t in THRESHOLDS.items():
    _need = REQUIRED_METRICS[_t.role]
    for _metric in metrics_needed(_t):
        _need[_metric] = ", ".join(x for x in (_need.get(_metric), f"threshold {_key}") if x)
del _key, _t, _need, _metric
