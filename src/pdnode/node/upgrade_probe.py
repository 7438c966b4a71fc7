"""The upgrade's availability probe: one completion through the router every ~100 ms.

Stdlib only, Python >= 3.9, no import of the rest of pdnode but loadgen.py (the one load
generator, which judges every answer): playbooks/upgrade.yml copies this file and
loadgen.py side by side to the host (root-only) and runs it with the host's python3 as a
transient systemd unit, so it outlives the Ansible tasks between the start and the stop
of the upgrade and depends on neither release's virtualenv.

    python3 upgrade_probe.py --url URL --model NAME --out FILE [--key-file F] [--interval 0.1]
                             [--clients N] [--stream] [--max-tokens 4] [--prompt TEXT]
                             [--change-after S]

--clients N runs N such loops at once; with --stream every second one streams: the load
of the drain measurements (scripts/measure-drain, docs/measurements.md) and of the
molecule scenarios' changes under load. What counts as a failure, by kind: loadgen.KINDS
(a 200 carrying an error, in the body or in a stream's chunk, is one).

The API key is read from --key-file (never from argv). SIGTERM (systemctl stop) ends the
loops; once the requests in flight end, the result is written to FILE all-or-nothing as
one JSON object: schema, loadgen's counts (requests_started; requests, the finished ones:
ok, failed, failures per kind, codes per HTTP status with 0 for no answer; longest_gap_s,
the longest time without a success, the probe's start and stop counting as edges;
longest_request_s; pace: with --change-after S, the successes that ended in the first S
seconds, before the change under load began, and their median time), each outage (a stretch without a success of 1 s or more: when, how
long, how many requests failed in it), the first failures.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time

if __package__:  # imported, or python -m: the package's own copy
    from pdnode.node import loadgen
else:  # run as a file: loadgen.py lies beside it (its folder is sys.path[0]), copied with it
    try:
        loadgen = importlib.import_module("loadgen")
    except ImportError as exc:
        sys.exit(f"{exc}; fix: copy src/pdnode/node/loadgen.py beside {sys.argv[0]}")

SCHEMA = "pdnode.upgrade-probe/1"


def write_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


# The prober's pace when run alone (scripts/measure-drain); playbooks/upgrade.yml passes its
# upgrade_probe_interval_s, whose default is the same (tests/test_upgrade.py compares them).
DEFAULT_INTERVAL_S = 0.1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the router's base URL")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="where the result goes (written on stop)")
    ap.add_argument("--key-file", default="", help="file holding the API key (empty: no key)")
    ap.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between a loop's request starts")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds one request may take")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="stop by itself after this long")
    ap.add_argument("--clients", type=int, default=1, help="loops at once (each at --interval)")
    ap.add_argument("--stream", action="store_true", help="every second loop streams")
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens each completion generates")
    ap.add_argument("--prompt", default="upgrade probe", help="the completions' prompt")
    ap.add_argument("--change-after", type=float, default=None,
                    help="seconds from the start to the change under load: the requests before it give the pace")
    args = ap.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        print(f"--url {args.url!r}: must start with http:// or https://", file=sys.stderr)
        return 1
    for name in ("timeout", "clients", "max_tokens"):
        if getattr(args, name) <= 0:
            print(f"--{name.replace('_', '-')} {getattr(args, name)}: must be above 0", file=sys.stderr)
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
    load = loadgen.Load(args.url, args.model, key, clients=args.clients, stream=args.stream,
                        interval=args.interval, timeout=args.timeout, max_tokens=args.max_tokens,
                        prompt=args.prompt, change_after=args.change_after).start()
    deadline = time.monotonic() + args.max_seconds
    while not stop[0] and time.monotonic() < deadline:
        time.sleep(0.05)  # the signal handler only sets the flag: nothing to deadlock on
    result = load.stop()
    try:
        write_atomic(args.out, {"schema": SCHEMA, "interval_s": args.interval, **result})
    except OSError as exc:
        print(f"--out {args.out!r}: {exc.strerror}; the result was: {json.dumps(result)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
