"""Runs SGLang's bench_serving (`sglang.benchmark.serving`) as `python -m` would, and
also writes what it measured for each request: when it started, its TTFT and its
end-to-end latency.

bench_serving measures these per request (RequestFuncOutput.start_time, .ttft,
.latency) and computes its summary from them in calculate_metrics(), but its JSONL
record keeps only the TTFTs and inter-token gaps, not the start times or the latencies.
This wrapper hands calculate_metrics' own `outputs` (the measured requests, warm-ups
excluded, in the order they were sent) to a JSON file, unchanged in meaning.

It runs in the client's environment (scripts/sglang-validator's Python 3.11), not in
pdnode's: pdnode bench copies this file next to the client's `datasets` stub and runs
`python -m pdnode_bench_client ARGS`; the file named by PDNODE_BENCH_REQUESTS_FILE
receives [{start_s, ttft_s, e2e_s, ok}, ...], start_s counted from the first request's
start. Standard library only, besides the client itself.
"""

from __future__ import annotations

import json
import os

REQUESTS_FILE_ENV = "PDNODE_BENCH_REQUESTS_FILE"


def _records(outputs: list) -> list[dict]:
    first = min((o.start_time for o in outputs), default=0.0)
    return [{"start_s": round(o.start_time - first, 6),
             "ttft_s": round(o.ttft, 6) if o.success else None,
             "e2e_s": round(o.latency, 6) if o.success else None,
             "ok": bool(o.success)} for o in outputs]


def main() -> None:
    from sglang.benchmark import serving  # here, so that pdnode can import REQUESTS_FILE_ENV without sglang

    target = os.environ[REQUESTS_FILE_ENV]
    measure = serving.calculate_metrics

    def calculate_metrics(input_requests, outputs, *args, **kwargs):
        with open(target, "w", encoding="utf-8") as fh:
            json.dump(_records(list(outputs)), fh)
        return measure(input_requests, outputs, *args, **kwargs)

    serving.calculate_metrics = calculate_metrics  # benchmark() looks it up in its module at call time
    serving.cli_main()


if __name__ == "__main__":
    main()
