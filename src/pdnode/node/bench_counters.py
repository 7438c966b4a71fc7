"""On the node: every engine's work counters, read once (`pdnode bench` reads them before
and after its load and reports the difference per instance).

    python -m pdnode.node.bench_counters --plan - < PLAN.json    (playbooks/bench.yml runs it)

Prints one JSON object (schema pdnode.bench_counters/2):

    {"schema": ..., "instances": {"prefill-0": {"role": "prefill", "url": ...,
        "metrics": "<the counters' lines of its /metrics>", "error": null}, ...}}

Runs on the node because the engines listen on its loopback only. Every series of each
counter is kept (the controller parses them: pdnode.commands.bench_report) so it can tell
a counter that went down (an engine restarted during the run) from one that grew, per
series, like PromQL's increase(). /metrics needs no API key (SGLang exempts it, as do the
stand-in's routes). Exit 0 with a report even when an engine does not answer (its
"error" says why); 2 when the plan cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from .plan_file import PlanFileError, read_plan

SCHEMA = "pdnode.bench_counters/2"
COUNTERS = ("sglang:num_requests_total", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
            # the prefill's KV hand-offs (histograms: their _sum and _count are counters)
            "sglang:kv_transfer_latency_ms_sum", "sglang:kv_transfer_latency_ms_count",
            "sglang:kv_transfer_total_mb_sum")
TIMEOUT_S = 10.0


def engine_services(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plan's prefill and decode services, in plan order."""
    services = plan.get("services")
    if not isinstance(services, Mapping):
        raise ValueError("the plan has no services (is it Plan.as_dict() of pdnode >= the N+M shape?)")
    # A node rank >= 1 of an instance spanning hosts (url None) serves no API: its node
    # rank 0 counts the instance's work.
    return [s for s in services.values() if isinstance(s, Mapping) and s.get("role") in ("prefill", "decode")
            and s.get("url")]


def counter_lines(text: str) -> str:
    """The lines of ``text`` (Prometheus text) that belong to the counters: their samples
    and their families' # TYPE / # HELP lines, chosen by name only (the controller parses)."""
    names = set(COUNTERS) | {name.rsplit("_", 1)[0] for name in COUNTERS}
    return "".join(f"{line}\n" for line in text.splitlines()
                   if (line.split() + ["", "", ""])[2 if line.startswith("#") else 0].split("{")[0] in names)


def read_instance(service: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    url = str(service.get("url") or "").rstrip("/") + "/metrics"
    out: dict[str, Any] = {"role": service.get("role"), "url": url, "metrics": "", "error": None}
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - the engines' URLs from the plan
            out["metrics"] = counter_lines(resp.read().decode("utf-8", errors="replace"))
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        out["error"] = f"GET {url}: {getattr(exc, 'reason', None) or exc}"
    return out


def snapshot(plan: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    t0 = time.time()
    instances = {str(s["id"]): read_instance(s, timeout_s) for s in engine_services(plan)}
    return {"schema": SCHEMA, "host": plan.get("host"), "taken_unix_s": round(t0, 3), "instances": instances}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdnode.node.bench_counters", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True, help="the plan as JSON (`pdnode render INVENTORY --role plan`); - reads stdin")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per engine")
    args = p.parse_args(argv)
    try:
        report = snapshot(read_plan(args.plan), args.timeout)
    except PlanFileError as exc:
        print(f"pdnode.bench_counters: {exc}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:
        print(f"pdnode.bench_counters: cannot use the plan {args.plan}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
