"""Wait until HTTP endpoints answer 200 (systemd ExecStartPost readiness gate).

    python -m pdnode.node.ready --timeout 600 [--pid PID] URL [URL ...]

Exits 0 once every URL answered 200, 1 on timeout (with the last answer of each URL
that was not ready), so `systemctl start` returns only when the service can serve.

It also exits 1 the moment the service's main process is gone: systemd waits for
ExecStartPost to finish even after the main process died, so a gate that kept polling
would hold `systemctl start` for the whole timeout (30 minutes in production) on a
launcher that failed in its first second. The main PID comes from --pid or from
$MAINPID, which systemd sets for ExecStartPost. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request


def probe(url: str, timeout: float) -> str | None:
    """None when ready, else a short description of why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URLs from the plan
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc)) or type(exc).__name__


def process_alive(pid: int) -> bool:
    """True while pid runs; False once it exited (gone, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        # /proc hidden from us (hidepid): fall back to a signal-0 probe.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    # The state follows the command name in parentheses, which may itself contain ')'.
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state not in (["Z"], ["X"])


def _main_pid(arg: int | None) -> int | None:
    if arg is not None:
        return arg
    raw = os.environ.get("MAINPID", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.ready")
    ap.add_argument("urls", nargs="+")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait in all")
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--pid", type=int, default=None,
                    help="stop waiting when this process exits (default: $MAINPID, set by systemd)")
    args = ap.parse_args(argv)
    pid = _main_pid(args.pid)
    deadline = time.monotonic() + args.timeout
    pending = {u: "not tried" for u in args.urls}
    # Direct HTTP to loopback: a proxy variable in the unit's environment must not intercept it.
    urllib.request.install_opener(urllib.request.build_opener(urllib.request.ProxyHandler({})))
    while True:
        if pid is not None and not process_alive(pid):
            waited = args.timeout - max(0.0, deadline - time.monotonic())
            print(f"pdnode.ready: the main process (pid {pid}) exited after {waited:.1f} s, before "
                  f"{', '.join(pending)} answered; its error is in the lines above", file=sys.stderr)
            return 1
        for url in list(pending):
            # Never wait on one URL past the deadline.
            why = probe(url, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            if why is None:
                del pending[url]
            else:
                pending[url] = why
        if not pending:
            return 0
        if time.monotonic() >= deadline:
            for url, why in pending.items():
                print(f"pdnode.ready: {url} not ready after {args.timeout:.0f} s: {why}", file=sys.stderr)
            return 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
