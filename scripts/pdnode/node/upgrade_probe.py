"""The upgrade's availability probe: one completion through the router every ~100 ms.

Stdlib only, Python >= 3.9, no import of the rest of pdnode: playbooks/upgrade.yml copies
this file to the host (root-only) and runs it with the host's python3 as a transient
systemd unit, so it outlives the Ansible tasks between the start and the stop of the
upgrade and does not depend on either release's virtualenv.

    python3 upgrade_probe.py --url URL --model NAME --out FILE [--key-file F] [--interval 0.1]
                             [--clients N] [--stream]

--clients N runs N such loops at once; with --stream every second one streams, and a
stream that ends without its `data: [DONE]` counts as failed (code -1, "stream cut"): the
load of the drain measurements (docs/measurements.md).

The API key is read from --key-file (never from argv). SIGTERM (systemctl stop) ends the
loop; the result is written to FILE all-or-nothing as one JSON object:
requests, ok, failed, codes, longest_gap_s (the longest time without a 200, the probe's
start and stop counting as edges), each outage (a stretch without a 200 of 1 s or more:
when, how long, how many requests failed in it), the first failures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

SCHEMA = "pdnode.upgrade-probe/1"
MAX_SAMPLES = 10
MAX_OUTAGES = 20
# A stretch without a 200 this long is listed as an outage (normal spacing is ~0.1 s).
OUTAGE_MIN_S = 1.0


class Tally:
    """Requests as they end, in time order; what the report says about them."""

    def __init__(self, started: float, wall: float = 0.0) -> None:
        self.started = started
        self.wall = wall  # epoch seconds at `started`: places outages beside the upgrade's steps
        self.outages: list[dict] = []
        self._failed_since_ok = 0
        self.requests = 0
        self.ok = 0
        self.codes: dict[str, int] = {}
        self.samples: list[dict] = []
        self._last_ok = started
        self._gap = (0.0, started)  # (length, start) of the longest stretch without a 200
        self._lock = threading.Lock()  # --clients: several loops record

    def record(self, ended: float, code: int, error: str = "") -> None:
        with self._lock:
            self._record(ended, code, error)

    def _record(self, ended: float, code: int, error: str) -> None:
        self.requests += 1
        self.codes[str(code)] = self.codes.get(str(code), 0) + 1
        if code == 200:
            self.ok += 1
            self._close_gap(ended)
            self._last_ok = ended
            self._failed_since_ok = 0
            return
        self._failed_since_ok += 1
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append({"t_s": round(ended - self.started, 3), "code": code, "error": error[:200]})

    def _close_gap(self, now: float) -> None:
        if now - self._last_ok >= OUTAGE_MIN_S and len(self.outages) < MAX_OUTAGES:
            self.outages.append({"at_s": round(self._last_ok - self.started, 3),
                                 "at": round(self.wall + self._last_ok - self.started, 3),
                                 "length_s": round(now - self._last_ok, 3), "failed": self._failed_since_ok})
        if now - self._last_ok > self._gap[0]:
            self._gap = (now - self._last_ok, self._last_ok)

    def result(self, stopped: float) -> dict:
        self._close_gap(stopped)
        return {
            "schema": SCHEMA, "duration_s": round(stopped - self.started, 3), "requests": self.requests,
            "ok": self.ok, "failed": self.requests - self.ok, "codes": dict(sorted(self.codes.items())),
            "longest_gap_s": round(self._gap[0], 3), "longest_gap_at_s": round(self._gap[1] - self.started, 3),
            "started_at": round(self.wall, 3), "outages": self.outages, "first_failures": self.samples,
        }


def one_request(url: str, model: str, key: str, timeout: float, stream: bool = False) -> tuple[int, str]:
    payload = {"model": model, "prompt": "upgrade probe", "max_tokens": 4 if stream else 1, "temperature": 0}
    if stream:
        payload["stream"] = True
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions", body, headers)  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - main() allows http(s) only
            text = resp.read()
            if stream and b"data: [DONE]" not in text:
                return -1, "stream cut: " + text[-120:].decode(errors="replace")
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, str(exc.reason)
    except Exception as exc:  # connection refused/reset, timeout: the node did not answer
        return 0, f"{type(exc).__name__}: {exc}"


def write_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the router's base URL")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="where the result goes (written on stop)")
    ap.add_argument("--key-file", default="", help="file holding the API key (empty: no key)")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between request starts")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds one request may take")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="stop by itself after this long")
    ap.add_argument("--clients", type=int, default=1, help="loops at once (each at --interval)")
    ap.add_argument("--stream", action="store_true", help="every second loop streams (a cut stream fails)")
    args = ap.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        print(f"--url {args.url!r}: must start with http:// or https://", file=sys.stderr)
        return 1
    key = ""
    if args.key_file:
        try:
            with open(args.key_file, encoding="utf-8") as fh:
                key = fh.read().strip()
        except OSError as exc:
            print(f"--key-file {args.key_file!r}: {exc.strerror}; fix: give the node's API key file", file=sys.stderr)
            return 1
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__(0, True))
    tally = Tally(time.monotonic(), time.time())
    deadline = tally.started + args.max_seconds

    def loop(stream: bool) -> None:
        while not stop[0] and time.monotonic() < deadline:
            began = time.monotonic()
            code, error = one_request(args.url, args.model, key, args.timeout, stream)
            tally.record(time.monotonic(), code, error)
            pause = args.interval - (time.monotonic() - began)
            if pause > 0 and not stop[0]:
                time.sleep(pause)

    threads = [threading.Thread(target=loop, args=(args.stream and k % 2 == 1,), daemon=True)
               for k in range(1, max(args.clients, 1))]
    for t in threads:
        t.start()
    loop(False)
    for t in threads:
        t.join(args.timeout + 5)
    write_atomic(args.out, tally.result(time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
