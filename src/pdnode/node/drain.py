"""Take engines out of the router before a planned stop, and put them back (issue 18).

    python -m pdnode.node.drain out        < spec.json   # remove from the router, wait until idle
    python -m pdnode.node.drain in         < spec.json   # add back (the engine is ready)
    python -m pdnode.node.drain reconcile  < spec.json   # the router's list to the plan's (out, then in)
    python -m pdnode.node.drain reconcile --check < spec.json  # whether reconcile has anything to do
    python -m pdnode.node.drain reconcile --spec FILE      # the spec from a file (the router unit, at start)
    python -m pdnode.node.drain out-unplanned < spec.json  # `out` for every worker the plan lacks
    python -m pdnode.node.drain hold UNIT SECONDS       # until UNIT has been stopped SECONDS

Runs on the router's host (the router's admin API and the engines' metrics are reached
there; the Ansible tasks run it with the release's python, as the readiness gate runs).
The spec (JSON on stdin, never argv: it names key files, never keys):

    {"router": "http://127.0.0.1:8000", "admin_key_file": ".../router-admin-key",
     "api_key_file": ".../api-key" | null, "timeout_s": 300,
     "workers": [{"id": "prefill-0", "role": "prefill", "url": "http://127.0.0.1:30000",
                  "bootstrap_port": 8998}, ...]}

`out`: each worker is removed with `DELETE /workers/{id}` (admin key) and awaited until
the router no longer lists it (sglang-router 0.3.2 drops it at once, smg 1.13.0 within
~5 s: docs/smg.md); only then no new request can reach it. Then its own scheduler
gauges (SGLang 0.5.23's /metrics: running, waiting, and the PD hand-off queues, summed
over every DP rank) must read 0 twice in a row: what it had in flight has finished.
Bounded by timeout_s (the plan's pdnode_drain_timeout_s): past it the stop goes ahead
and the line says how many requests were still there.
`in`: `POST /workers` with the worker's URL, type, bootstrap port and the engines' API
key (the same body for both router packages; measured), awaited until listed healthy.
`reconcile`: the router's list made the plan's: a worker it lists that the plan lacks is
taken out as `out-unplanned` does (a layout change; a run interrupted after it stopped an
instance), then a planned worker it lacks is added when its engine answers /health (a new
instance; an interrupted drain left it out). This is how a layout change reaches the
running router: its restart decision ignores the worker list (docs/decisions.md, "The
router's worker list changes without a restart"). Exit 0 unless the router refused a
call or a wait ran out.
`reconcile --check` changes nothing: it names the workers the router lists that the plan
lacks ("unplanned") and the planned ones it lacks ("missing"), and its last line says
"needed": true when there is either (the deploy's one read of the host runs it, and runs
reconcile only then or when it started something). A router that does not answer, or a
node whose admin key is not made yet, needs nothing (the deploy starts the router, or
makes the key, and then reconciles anyway); one that refuses the admin key needs it.

Every line of output says what happened to which instance and when (UTC), and how long
it took; the last line is one JSON object for the caller (`{"changed": ..., ...}`).
When the router does not answer at all (not started yet, or stopped), there is nothing
to take out or put back: said so, exit 0 (a router that starts reads the plan's workers
from its own file). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

# SGLang 0.5.23's scheduler gauges of requests an engine holds (sglang/srt/observability/
# metrics_collector.py): running, waiting, and the PD queues of a hand-off in progress.
# The stand-in exports the same names (src/pdnode/standin/metrics.py).
BUSY_GAUGES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
)
POLL_S = 0.25
HTTP_TIMEOUT_S = 10.0


class DrainError(RuntimeError):
    pass


class KeyRefused(DrainError):
    """The router runs with another admin key than the file's (a new key: the router
    restarts with it later in the same run)."""


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S', time.gmtime())}Z {msg}", flush=True)


def read_key(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        key = f.read().strip()
    if not key:
        raise DrainError(f"{path} is empty")
    return key


def http(method: str, url: str, key: str | None, body: Any = None) -> tuple[int, str]:
    """(status, body text); status 0 with the reason when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 - URLs from the plan
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310 - URLs from the plan
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


class Router:
    def __init__(self, url: str, admin_key: str | None) -> None:
        self.url = url.rstrip("/")
        self.key = admin_key

    def workers(self) -> list[dict[str, Any]] | None:
        """The router's workers; None when the router does not answer."""
        status, text = http("GET", f"{self.url}/workers", self.key)
        if status == 0:
            return None
        if status in (401, 403):
            raise KeyRefused(f"GET {self.url}/workers answered {status}")
        if status != 200:
            raise DrainError(f"GET {self.url}/workers answered {status}: {text[:200]}")
        return list(json.loads(text).get("workers", []))

    def find(self, url: str) -> dict[str, Any] | None:
        listed = self.workers()
        return next((w for w in listed or [] if w.get("url") == url), None)

    def delete(self, worker_id: str) -> None:
        status, text = http("DELETE", f"{self.url}/workers/{worker_id}", self.key)
        if status not in (200, 202, 204):
            raise DrainError(f"DELETE /workers/{worker_id} answered {status}: {text[:200]}")

    def add(self, worker: dict[str, Any], api_key: str | None) -> None:
        body: dict[str, Any] = {"url": worker["url"], "worker_type": worker["role"]}
        if worker["role"] == "prefill":
            body["bootstrap_port"] = worker.get("bootstrap_port")
        if api_key:
            body["api_key"] = api_key
        status, text = http("POST", f"{self.url}/workers", self.key, body)
        # smg answers 409 for a URL it already lists (a re-run): that is the goal reached
        if status not in (200, 201, 202, 409):
            raise DrainError(f"POST /workers {worker['id']} answered {status}: {text[:200]}")


def busy(worker: dict[str, Any], api_key: str | None) -> dict[str, float] | None:
    """The engine's busy gauges (summed over its ranks); None when /metrics does not answer."""
    status, text = http("GET", worker["url"].rstrip("/") + "/metrics", api_key)
    if status != 200:
        return None
    out = dict.fromkeys(BUSY_GAUGES, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            try:
                out[name] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


def _short(gauges: dict[str, float]) -> str:
    return ", ".join(f"{k.split(':', 1)[1]} {v:g}" for k, v in gauges.items() if v) or "none"


def take_out(router: Router, workers: list[dict[str, Any]], deadline: float) -> list[str]:
    """Remove WORKERS from the router (every DELETE first: smg takes seconds to drop each,
    so they overlap) and wait until the router lists none of them; the ids removed."""
    t0 = time.monotonic()
    pending = {}
    for worker in workers:
        listed = router.find(worker["url"])
        if listed is None:
            log(f"{worker['id']} is not in the router's list: nothing to take out")
            continue
        router.delete(listed["id"])
        pending[worker["url"]] = worker
    removed = []
    while pending:
        urls = {w.get("url") for w in router.workers() or []}
        for url in [u for u in pending if u not in urls]:
            worker = pending.pop(url)
            removed.append(worker["id"])
            log(f"{worker['id']} left the router ({url}; gone from /workers after {time.monotonic() - t0:.1f} s)")
        if pending and time.monotonic() > deadline:
            raise DrainError(f"{', '.join(w['id'] for w in pending.values())}: the router still lists it after DELETE")
        if pending:
            time.sleep(POLL_S)
    return [w["id"] for w in workers if w["id"] in removed]


def take_out_unplanned(router: Router, planned: list[dict[str, Any]], api_key: str | None,
                       deadline: float) -> list[str]:
    """Take every worker the router lists that PLANNED lacks out, and wait until what it
    holds is done (an engine that no longer runs holds nothing); their URLs."""
    urls = {w["url"] for w in planned}
    gone = [{"id": w.get("url", "?"), "role": w.get("worker_type", "?"), "url": w.get("url", "")}
            for w in router.workers() or [] if w.get("url") not in urls]
    for w in gone:
        log(f"the router lists {w['url']}, which the plan does not have: taking it out")
    removed = take_out(router, gone, deadline)
    for w in gone:
        wait_idle(w, api_key, deadline)
    return removed


def wait_idle(worker: dict[str, Any], api_key: str | None, deadline: float) -> None:
    """Wait until the engine's busy gauges read 0 twice in a row, or the deadline."""
    t0 = time.monotonic()
    zero_reads, last = 0, None
    while True:
        gauges = busy(worker, api_key)
        if gauges is None:
            log(f"{worker['id']} answers no /metrics: not running, nothing in flight")
            return
        last = gauges
        zero_reads = zero_reads + 1 if not any(gauges.values()) else 0
        if zero_reads >= 2:
            log(f"{worker['id']} drained: no request in flight or queued after {time.monotonic() - t0:.1f} s")
            return
        if time.monotonic() > deadline:
            log(f"{worker['id']} drain timeout after {time.monotonic() - t0:.1f} s, still holding: {_short(last)};"
                " stopping it anyway (pdnode_drain_timeout_s)")
            return
        time.sleep(POLL_S)


def put_back(router: Router, worker: dict[str, Any], api_key: str | None, deadline: float) -> bool:
    """Add WORKER to the router and wait until it is listed healthy."""
    t0 = time.monotonic()
    listed = router.find(worker["url"])
    if listed is not None and listed.get("is_healthy", True):
        log(f"{worker['id']} is in the router's list already")
        return False
    while not engine_ready(worker, api_key):  # a decode bound to a prefill starts after it
        if time.monotonic() > deadline:
            raise DrainError(f"{worker['id']}: its /health did not answer 200 in time; not added to the router")
        time.sleep(POLL_S)
    if listed is None:
        router.add(worker, api_key)
    while True:
        listed = router.find(worker["url"])
        if listed is not None and listed.get("is_healthy", True):
            log(f"{worker['id']} returned to the router ({worker['url']}; listed healthy after "
                f"{time.monotonic() - t0:.1f} s)")
            return True
        if time.monotonic() > deadline:
            raise DrainError(f"{worker['id']}: not listed healthy by the router {time.monotonic() - t0:.0f} s after "
                             "POST /workers")
        time.sleep(POLL_S)


def engine_ready(worker: dict[str, Any], api_key: str | None) -> bool:
    return http("GET", worker["url"].rstrip("/") + "/health", api_key)[0] == 200


def differences(listed: list[dict[str, Any]], workers: list[dict[str, Any]]) -> dict[str, Any]:
    """What `reconcile` would do to the router's list LISTED, without doing it."""
    urls = {w.get("url") for w in listed}
    planned = {w["url"] for w in workers}
    unplanned = sorted(u for u in urls if u not in planned)
    missing = [w["id"] for w in workers if w["url"] not in urls]
    for url in unplanned:
        log(f"the router lists {url}, which the plan does not have (reconcile takes it out)")
    for wid in missing:
        log(f"{wid} is planned but not in the router's list (reconcile puts it back once its engine is ready)")
    return {"unplanned": unplanned, "missing": missing, "needed": bool(unplanned or missing)}


def run(command: str, spec: dict[str, Any], check: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"changed": False, "removed": [], "added": [], "missing": [], "unplanned": []}
    if check:
        result["needed"] = False
    admin_file = spec.get("admin_key_file")
    if admin_file and not os.path.exists(admin_file):
        # made by the deploy before the router first starts: no router has run with it yet
        log(f"no {admin_file} yet: the router has not run, no worker to {command}")
        return result
    router = Router(spec["router"], read_key(admin_file))
    api_key = read_key(spec.get("api_key_file"))
    workers = list(spec.get("workers", []))
    deadline = time.monotonic() + float(spec.get("timeout_s", 300))
    t0 = time.monotonic()
    try:
        listed = router.workers()
    except KeyRefused:
        # a new admin key is written before the router restarts with it (the deploy's
        # handlers restart the router last): this run restarts the router anyway
        log(f"the router at {router.url} refuses {admin_file}: it still runs with an earlier admin key and "
            f"restarts with this one in this run; no worker to {command}")
        if check:
            result["needed"] = True
        return result
    if listed is None:
        log(f"the router at {router.url} does not answer: no worker to {'take out' if command == 'out' else 'add'}")
        return result
    if check:  # and what the router lists, each worker's URL and health (pdnode status)
        return {**result, **differences(listed, workers),
                "listed": [{"url": w.get("url"), "healthy": bool(w.get("is_healthy", True))} for w in listed]}
    if command == "out":
        result["removed"] = take_out(router, workers, deadline)
        for w in workers:
            wait_idle(w, api_key, deadline)
    elif command == "out-unplanned":
        result["removed"] = take_out_unplanned(router, workers, api_key, deadline)
    elif command == "in":
        for w in workers:
            if put_back(router, w, api_key, deadline):
                result["added"].append(w["id"])
    else:
        result["removed"] = take_out_unplanned(router, workers, api_key, deadline)
        result["unplanned"] = result["removed"]
        urls = {w.get("url") for w in router.workers() or []}
        for w in workers:
            if w["url"] in urls:
                continue
            if engine_ready(w, api_key):
                log(f"{w['id']} is planned but not in the router's list (an interrupted change left it out): "
                    "putting it back")
                put_back(router, w, api_key, deadline)
                result["added"].append(w["id"])
            else:
                log(f"{w['id']} is planned but not in the router's list, and its engine is not ready: left out")
                result["missing"].append(w["id"])
    result["changed"] = bool(result["removed"] or result["added"])
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def hold_down(unit: str, seconds: float) -> dict[str, Any]:
    """Wait until UNIT has been stopped for SECONDS (a prefill, until every decode dropped
    it): counted from systemd's InactiveEnterTimestampMonotonic (CLOCK_MONOTONIC, as
    time.monotonic here), so a run interrupted after the stop and run again waits only
    what is left; a unit that never ran (0) or runs is not waited for."""
    import subprocess

    show = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "InactiveEnterTimestampMonotonic", unit],
                          capture_output=True, text=True, check=True, timeout=60).stdout
    props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    since_us = int(props.get("InactiveEnterTimestampMonotonic", "0") or 0)
    if props.get("ActiveState") not in ("inactive", "failed") or since_us == 0:
        log(f"{unit} is {props.get('ActiveState')}, not stopped: no wait")
        return {"changed": False, "waited_s": 0}
    left = seconds - (time.monotonic() - since_us / 1e6)
    if left > 0:
        time.sleep(left)
    log(f"{unit} stopped {seconds:g} s ago: every decode has dropped it (waited {max(left, 0):.1f} s)")
    return {"changed": False, "waited_s": round(max(left, 0), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdnode.node.drain", description=__doc__.split("\n", 1)[0])
    ap.add_argument("command", choices=["out", "out-unplanned", "in", "reconcile", "hold"])
    ap.add_argument("unit", nargs="?", help="hold: the stopped unit")
    ap.add_argument("seconds", nargs="?", type=float, help="hold: how long it must have been stopped")
    ap.add_argument("--check", action="store_true",
                    help="reconcile only: say whether the router's list differs from the plan's, change nothing")
    ap.add_argument("--spec", metavar="FILE",
                    help="read the spec from FILE instead of standard input (the router unit's reconcile at start)")
    args = ap.parse_args(argv)
    if args.check and args.command != "reconcile":
        ap.error(f"--check is for reconcile, not {args.command}")
    if args.command == "hold":
        if not args.unit or args.seconds is None:
            ap.error("hold needs UNIT SECONDS")
        print(json.dumps(hold_down(args.unit, args.seconds)))
        return 0
    try:
        if args.spec:
            with open(args.spec, encoding="utf-8") as f:
                spec = json.load(f)
        else:
            spec = json.load(sys.stdin)
        result = run(args.command, spec, check=args.check)
    except (DrainError, OSError, ValueError, KeyError) as exc:
        print(f"pdnode.drain {args.command}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
