"""python -m pdnode.standin SERVERARGS.json [--api-key-file PATH]

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 could not serve (port taken, Mooncake failed),
2 bad ServerArgs file, API key file or PDNODE_SIM_* environment.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from . import __doc__ as PACKAGE_DOC
from .config import ConfigError, Settings, load_server_args, load_sim_settings, read_api_key


def _one_line(record: logging.LogRecord) -> bool:
    """Tracebacks become one line (journald: one line per event). aiohttp logs one for
    every non-HTTP/1 connection, e.g. the router's HTTP/2 probe when it registers a worker."""
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        detail = " ".join(str(exc).split())[:80]
        record.msg = f"{record.getMessage()}: {type(exc).__name__}: {detail}"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


def _knobs_help() -> str:
    doc = PACKAGE_DOC or ""
    _, sep, rest = doc.partition("Simulation knobs")
    return sep + rest if sep else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pdnode.standin",
        description="SGLang 0.5.23 stand-in engine (PD protocol, real Mooncake KV hand-off).",
        epilog=_knobs_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("server_args", metavar="SERVERARGS.json", help="JSON file of SGLang ServerArgs fields")
    parser.add_argument("--api-key-file", metavar="PATH", help="file holding the API key (never pass the key itself)")
    args = parser.parse_args(argv)

    try:
        api_key = read_api_key(args.api_key_file) if args.api_key_file else None
        server = load_server_args(args.server_args, api_key)
        sim = load_sim_settings()
    except ConfigError as exc:
        print(f"pdnode.standin: error: {exc}", file=sys.stderr)
        return 2

    role = {"prefill": "prefill", "decode": "decode"}.get(server.mode, "unified")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"[%(asctime)s {role}] %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.server").addFilter(_one_line)
    from .app import serve  # imports aiohttp, prometheus_client; mooncake later

    launch_command = f"python -m pdnode.standin {args.server_args}"
    try:
        return asyncio.run(serve(Settings(server=server, sim=sim), launch_command))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
