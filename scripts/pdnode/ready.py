"""Wait until HTTP endpoints answer 200 (systemd ExecStartPost readiness gate).

    python -m pdnode.ready --timeout 600 URL [URL ...]

Exits 0 once every URL answered 200, 1 on timeout (with the last answer of each URL
that was not ready), so `systemctl start` returns only when the service can serve.
Standard library only.
"""

from __future__ import annotations

import argparse
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
        return str(getattr(exc, "reason", exc))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.ready")
    ap.add_argument("urls", nargs="+")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait in all")
    ap.add_argument("--interval", type=float, default=0.2)
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    pending = {u: "not tried" for u in args.urls}
    # Direct HTTP to loopback: a proxy variable in the unit's environment must not intercept it.
    urllib.request.install_opener(urllib.request.build_opener(urllib.request.ProxyHandler({})))
    while True:
        for url in list(pending):
            why = probe(url, timeout=min(5.0, args.timeout))
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
