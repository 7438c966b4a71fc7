"""Start sglang-router from the router JSON the plan rendered (runs on the host).

    python -m pdnode.router_launch ROUTER.json [--api-key-file PATH] [--dry-run]

The JSON holds sglang-router argument names (underscored). The optional worker API key
is read from a file and added to the router's arguments in memory, so it never shows in
/proc/<pid>/cmdline or in `ps`.
"""

from __future__ import annotations

import argparse
import json
import sys

from .plan import router_argv
from .secrets import SecretError, read_secret_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.router_launch", description=__doc__.splitlines()[0])
    ap.add_argument("router_json")
    ap.add_argument("--api-key-file")
    ap.add_argument("--dry-run", action="store_true", help="print the router's arguments and exit")
    args = ap.parse_args(argv)
    try:
        with open(args.router_json, encoding="utf-8") as fh:
            router = json.load(fh)
        key = read_secret_file(args.api_key_file) if args.api_key_file else None
    except (OSError, ValueError, SecretError) as exc:
        print(f"pdnode.router_launch: {args.router_json}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(router, dict):
        print(f"pdnode.router_launch: {args.router_json}: expected a JSON object", file=sys.stderr)
        return 2
    cli = router_argv(router)
    if args.dry_run:
        print(" ".join(cli + (["--api-key", "<redacted>"] if key else [])))
        return 0
    from sglang_router.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args(cli + (["--api-key", key] if key else [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
