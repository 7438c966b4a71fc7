"""Feed systemd's watchdog from the engine's /health (a sidecar of the launcher).

    python -m pdnode.node.watchdog --pid ENGINE_PID --url http://127.0.0.1:30001/health

A stopped (SIGSTOP) or wedged engine keeps its process and its port, so systemd and the
router see it as up while client requests hang. The engine units set `WatchdogSec=` and
`NotifyAccess=all`; the launcher starts this sidecar in the service's cgroup just before
it execs the engine, and the sidecar sends `WATCHDOG=1` to $NOTIFY_SOCKET only while the
engine is demonstrably alive:

- before the first 200 from /health (the model is loading, which can take longer than
  the watchdog interval): while the engine process exists and is not stopped (state T).
  For Type=exec systemd arms the watchdog when the process starts, not at readiness;
  a load that never finishes is bounded by the unit's start timeout instead.
- after the first 200: only when /health answered 200 within the probe timeout. A
  stopped or hung engine answers nothing, the pings stop, and systemd kills and restarts
  the service once WatchdogSec passed without one.

It exits as soon as the engine process is gone. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import urllib.request

from .ready import probe as health  # None when /health answered 200 in time, else why not

# SGLang's /health answers 503 by itself after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without
# scheduler progress: wait a little longer, so that a slow but working engine (a long
# prefill in front of the health request) gets its 200 and a stuck one its own 503.
PROBE_TIMEOUT_S = 25.0


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, D, T, t, Z, ...); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may contain ')'
    return fields[0] if fields else None


def notify(address: str, message: str) -> None:
    """One sd_notify datagram ('@' starts an abstract socket name)."""
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(address)
        s.sendall(message.encode())


def decide(state: str | None, why_not: str | None, seen_healthy: bool) -> str | None:
    """Ping or not: None to ping, else the reason to hold the pings back."""
    if state in ("T", "t"):
        return "the engine process is stopped"
    if why_not is None:
        return None
    if not seen_healthy:
        return None  # still loading: alive and running is all we can ask
    return f"/health: {why_not}"


def run(pid: int, url: str, watchdog_s: float, address: str, probe_timeout: float = PROBE_TIMEOUT_S) -> int:
    # Ping four times per watchdog interval; a probe can take probe_timeout, which stays
    # under a third of the interval, so a healthy engine is never late (1/4 + 1/3 < 1).
    interval = watchdog_s / 4
    probe_timeout = min(probe_timeout, watchdog_s / 3)
    urllib.request.install_opener(urllib.request.build_opener(urllib.request.ProxyHandler({})))
    seen_healthy = False
    held: str | None = None
    while True:
        state = process_state(pid)
        if state in (None, "Z", "X"):
            return 0  # the engine is gone: the sidecar goes with it
        # A stopped engine cannot answer: do not wait probe_timeout to learn that.
        why_not = "not probed" if state in ("T", "t") else health(url, probe_timeout)
        state = process_state(pid)  # again: the probe may have taken probe_timeout
        if state in (None, "Z", "X"):
            return 0
        if not seen_healthy and why_not is None:
            seen_healthy = True
            # One line: from here on a failed /health holds the pings (the journal shows when).
            print("pdnode.watchdog: /health answered 200; from now on the pings follow /health",
                  file=sys.stderr, flush=True)
        reason = decide(state, why_not, seen_healthy)
        if reason is None:
            try:
                notify(address, "WATCHDOG=1")
            except OSError as exc:  # systemd gone or re-executing: try again next round
                reason = f"cannot reach {address}: {exc.strerror or exc}"
            if held is not None and reason is None:
                print("pdnode.watchdog: pinging again", file=sys.stderr, flush=True)
        if reason is not None and reason != held:
            # One line per change, not per probe: the journal shows why systemd killed it.
            print(f"pdnode.watchdog: not pinging systemd's watchdog ({watchdog_s:.0f} s): {reason}",
                  file=sys.stderr, flush=True)
        held = reason
        # Sleep in short steps: exit promptly when the engine exits.
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline:
            if process_state(pid) in (None, "Z", "X"):
                return 0
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.watchdog")
    ap.add_argument("--pid", type=int, required=True, help="the engine's process id")
    ap.add_argument("--url", required=True, help="the engine's /health URL")
    ap.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT_S)
    args = ap.parse_args(argv)
    address = os.environ.get("NOTIFY_SOCKET", "")
    usec = os.environ.get("WATCHDOG_USEC", "")
    if not address or not usec.isdigit() or int(usec) <= 0:
        print("pdnode.watchdog: no NOTIFY_SOCKET/WATCHDOG_USEC (WatchdogSec= unset): nothing to feed",
              file=sys.stderr)
        return 0
    return run(args.pid, args.url, int(usec) / 1e6, address, args.probe_timeout)


if __name__ == "__main__":
    sys.exit(main())
