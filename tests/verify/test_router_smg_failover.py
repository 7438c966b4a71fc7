"""What smg 1.13.0 does when one of two prefills dies (docs/smg.md, "Failures"): 2P1D
stand-ins on loopback, smg started by pdnode.node.router_launch, kill -9 of one prefill,
then requests. sglang-router 0.3.2 loses no request here.

- a policy that moves a retry to another prefill (power_of_two): no failed request;
- cache_aware with the prefill first taken out of the router (DELETE /workers/{id}
  with the admin key, what a rolling upgrade does before it stops an instance): none;
- cache_aware without that: the retries stay on the dead prefill, so requests fail while
  the other prefill is alive (2 x 502 in every run); in some runs the decode's breaker
  opens too and the node answers 503 past the circuit-open time (docs/smg.md). This one
  asserts the defect: when it fails, smg fixed it, and docs/smg.md and the plan's
  refusal (router-smg-cache-aware) can go.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from routerproc import key_file, router_process
from test_router_smg import ADMIN, SMG_PYTHON, _require_smg

pytestmark = pytest.mark.integration
CIRCUIT_OPEN_S = 5


@contextlib.contextmanager
def smg_2p1d(d: Path, policy: str) -> Iterator[dict[str, Any]]:
    """Two prefills and one decode (of two stand-in pairs, the second decode unused)."""
    from node import free_ports, standin_node

    _require_smg()
    with standin_node(d / "a", router=False) as a, standin_node(d / "b", router=False) as b:
        rp, mp = free_ports(2)
        router = {"pd_disaggregation": True, "prefill": [[a.prefill_url, a.ports["bootstrap"]],
                                                         [b.prefill_url, b.ports["bootstrap"]]],
                  "decode": [a.decode_url], "host": "127.0.0.1", "port": rp, "prometheus_host": "127.0.0.1",
                  "prometheus_port": mp, "policy": policy, "cb_timeout_duration_secs": CIRCUIT_OPEN_S,
                  "worker_startup_check_interval": 1, "shutdown_grace_period_secs": 1, "log_json": True}
        (d / "router.json").write_text(json.dumps(router))
        argv = [SMG_PYTHON, "-m", "pdnode.node.router_launch", str(d / "router.json"), "--router-package", "smg",
                "--admin-key-file", key_file(d, "admin", ADMIN)]
        base = f"http://127.0.0.1:{rp}"
        with router_process(argv, d, base + "/readiness", ready=lambda r: r.json().get("healthy_workers") == 3):
            yield {"base": base, "a": a, "b": b}


def _burst(base: str, n: int, tag: str) -> collections.Counter[int]:
    from node import request

    out: collections.Counter[int] = collections.Counter()
    for i in range(n):
        r = request("POST", base + "/v1/completions",
                    {"model": "fake-model", "prompt": f"hello {tag} {i} " * (i % 5 + 1), "max_tokens": 2}, timeout=30)
        out[r.status] += 1
    return out


def _statuses(base: str, n: int, tag: str) -> list[int]:
    """_burst's requests, each one's status in order."""
    from node import request

    return [request("POST", base + "/v1/completions", {"model": "fake-model", "prompt": f"hello {tag} {i} " * (i % 5 + 1),
                                                       "max_tokens": 2}, timeout=30).status for i in range(n)]


def _kill_prefill(node: Any) -> None:
    proc = node.procs["prefill"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(120)


def _remove_worker(base: str, url: str) -> None:
    from node import request

    auth = {"Authorization": f"Bearer {ADMIN}"}
    wid = [w["id"] for w in request("GET", base + "/workers", headers=auth).json()["workers"] if w["url"] == url][0]
    assert request("DELETE", f"{base}/workers/{wid}", headers=auth).status in (200, 202)
    end = time.monotonic() + 120  # ends once the router dropped it (a moment on a quiet machine)
    while any(w["url"] == url for w in request("GET", base + "/workers", headers=auth).json()["workers"]):
        assert time.monotonic() < end
        time.sleep(0.1)


def test_power_of_two_loses_only_the_first_requests_when_a_prefill_dies_then_keeps_away(tmp_path):
    """A few requests right after the kill may still reach the dead prefill (measured: 0 in
    most runs, 1 and 2 in two CI runs on a loaded machine: how many depends on when smg's
    checks see it); then the router keeps away from it (cache_aware kept going back:
    below). Asserted: only 502s, at most 3, none in the last 20 of 30."""
    with smg_2p1d(tmp_path, "power_of_two") as n:
        assert _burst(n["base"], 10, "warm") == {200: 10}
        _kill_prefill(n["a"])
        statuses = _statuses(n["base"], 30, "after")
        assert set(statuses) <= {200, 502} and statuses.count(502) <= 3, statuses
        assert statuses[-20:] == [200] * 20, statuses


def test_cache_aware_loses_no_request_when_the_prefill_leaves_the_router_first(tmp_path):
    with smg_2p1d(tmp_path, "cache_aware") as n:
        assert _burst(n["base"], 10, "warm") == {200: 10}
        _remove_worker(n["base"], n["a"].prefill_url)
        _kill_prefill(n["a"])
        assert _burst(n["base"], 30, "after") == {200: 30}


def test_cache_aware_retries_stay_on_the_dead_prefill(tmp_path):
    with smg_2p1d(tmp_path, "cache_aware") as n:
        assert _burst(n["base"], 10, "warm") == {200: 10}
        _kill_prefill(n["a"])
        right_after = _burst(n["base"], 20, "after")
        failed = sum(count for status, count in right_after.items() if status != 200)
        # power_of_two moves the retry to prefill B (at most the one request A held fails);
        # cache_aware sends it back to A. Whether the decode's breaker opens as well (then
        # 503 for the open time or, measured, 180 s) differs from run to run: printed only.
        print(f"smg cache_aware, 2P1D, 20 requests after a kill -9 of one prefill: {dict(right_after)}")
        assert failed >= 2, (
            f"smg now moves cache_aware retries off a dead prefill ({dict(right_after)}): update docs/smg.md and "
            "drop the plan's router-smg-cache-aware refusal")
