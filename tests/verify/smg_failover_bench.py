"""A benchmark, not a test: smg 1.13.0 with cache_aware in front of 2P1D stand-ins (the
setup of test_router_smg_failover.py), more router arguments from the command line,
10 warm-up requests, kill -9 of one prefill, then 80 requests one after the other 0.1 s
apart. Prints the statuses and when the last one failed (docs/smg.md, docs/measurements.md).

    .venv/bin/python tests/verify/smg_failover_bench.py '{"health_check_interval_secs": 1}'
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "standin"), str(HERE.parent), str(HERE.parents[1] / "src")]

import test_router_smg_failover as failover  # noqa: E402
from node import request  # noqa: E402


def main() -> None:
    extra = json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")
    real_write = Path.write_text

    def write(self: Path, data: str, *args, **kwargs):  # the fixture's router.json, plus EXTRA
        if self.name == "router.json":
            data = json.dumps({**json.loads(data), **extra})
        return real_write(self, data, *args, **kwargs)

    Path.write_text = write  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as d, failover.smg_2p1d(Path(d), "cache_aware") as n:
        warm = failover._burst(n["base"], 10, "warm")
        failover._kill_prefill(n["a"])
        t0 = time.monotonic()
        out: collections.Counter[int] = collections.Counter()
        last = None
        for i in range(80):
            r = request("POST", n["base"] + "/v1/completions",
                        {"model": "fake-model", "prompt": f"hello after {i} " * (i % 5 + 1), "max_tokens": 2},
                        timeout=30)
            out[r.status] += 1
            if r.status != 200:
                last = round(time.monotonic() - t0, 1)
            time.sleep(0.1)
    print(json.dumps({"extra": extra, "warm": dict(warm), "after": dict(out), "last_failure_s": last}))


if __name__ == "__main__":
    main()
