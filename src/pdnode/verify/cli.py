"""Command lines of the verifier (both end in the same engine, with the same options).

    pdnode verify INVENTORY [--host H] [options]          (controller or node; parses the inventory)
    python -m pdnode.verify --plan PLAN.json [options]    (the node; PLAN.json = `pdnode render --role plan`)

Where the verifier runs is said, never guessed from an address (127.0.0.1 may be a
tunnel from the controller): `python -m pdnode.verify --plan` is the node's entry point
(playbooks/verify.yml runs it there with --on-node); `pdnode verify INVENTORY` runs as a
remote client unless --on-node is given or the inventory host has ansible_connection:
local. --remote / --on-node override both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

from ..core.exits import EXIT_CANNOT_RUN
from ..node.plan_file import PlanFileError, read_plan
from . import SCHEMA

EPILOG = """\
checks, in order: services, bootstrap.<prefill>, <instance> (prefill-0, decode-0, ...), router, proxy,
access, completion, correctness, disaggregation, disaggregation.<instance>, metrics, burst, threshold.*
(docs/verification.md).
exit codes: 0 no check failed, 1 a check failed, 2 could not run.
URLs default to the plan: router http://<node>:<router port>; every engine instance and its bootstrap
server on the node's loopback (not applicable when run elsewhere: pass --instance-url ID=URL and
--bootstrap-url ID=URL through a tunnel, or run on the node).
on the node: `python -m pdnode.verify --plan` (or --on-node); elsewhere: `pdnode verify` (or --remote).
/workers is read with --admin-key-file (the router's control-plane key); the client key
never reaches it."""


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help=f"print the report as JSON (schema {SCHEMA})")
    p.add_argument("--skip-burst", action="store_true", help="skip the load burst and the thresholds")
    g = p.add_argument_group("where the node is (defaults come from the plan)")
    g.add_argument("--node-address", help="address of the node (default: ansible_host, else 127.0.0.1); "
                                          "says nothing about where the verifier runs (see --on-node)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--on-node", dest="on_node", action="store_true", default=None,
                       help="the verifier runs on the node: read systemd and the loopback-only services here "
                            "(default for `python -m pdnode.verify --plan`)")
    where.add_argument("--remote", dest="on_node", action="store_false",
                       help="the verifier runs elsewhere (default for `pdnode verify INVENTORY` unless the host "
                            "has ansible_connection: local)")
    g.add_argument("--base-url", help="OpenAI-compatible server root clients use, e.g. http://HOST:8000 or a "
                                      "gateway (default: the router); /v1/chat/completions is appended")
    g.add_argument("--router-url", help="router root for /readiness and /workers (default from the plan)")
    g.add_argument("--instance-url", action="append", metavar="ID=URL",
                   help="HTTP root of one engine instance, e.g. prefill-1=http://127.0.0.1:30010 (repeat per "
                        "instance; ids as in the plan's services)")
    g.add_argument("--bootstrap-url", action="append", metavar="ID=URL",
                   help="bootstrap server root of one prefill instance, e.g. prefill-0=http://127.0.0.1:8998 "
                        "(a bare URL when the plan has one prefill)")
    g.add_argument("--prefill-url", help="HTTP root of the plan's only prefill instance (several: --instance-url)")
    g.add_argument("--decode-url", help="HTTP root of the plan's only decode instance (several: --instance-url)")
    g.add_argument("--router-metrics-url", help="router Prometheus listener, e.g. http://127.0.0.1:29000/metrics")
    g = p.add_argument_group("client")
    g.add_argument("--api-key-file", help="file holding the API key (read like the services read it: one "
                                          "trailing newline dropped); never pass a key on the command line")
    g.add_argument("--admin-key-file", help="file holding the router's control-plane admin key (on the node "
                                            "<config_dir>/router-admin-key); used for /workers only")
    g.add_argument("--auth-template", default=None,
                   help="Authorization value a client sends, with {key}; default 'Bearer {key}' "
                        "(e.g. '{key}' reproduces a client that omits the word Bearer)")
    g.add_argument("--max-tokens", type=int, help="tokens per request (default pdnode_verify_max_tokens)")
    g = p.add_argument_group("time bounds")
    g.add_argument("--timeout", type=float, help="seconds per request (default pdnode_verify_timeout_s)")
    g.add_argument("--overall-timeout", type=float,
                   help="seconds for the whole run (default: request timeout x (8 + max(prefill, decode "
                        "instances) + burst rounds))")


def run_with_plan(plan: Mapping[str, Any], args: argparse.Namespace, *, node_address: str | None = None,
                  api_key_file: str | None = None, env: Mapping[str, str] | None = None,
                  on_node: bool = False) -> int:
    from .config import ConfigError, build_run
    from .engine import verify
    from .report import to_json, to_table

    try:
        run = build_run(
            plan, node_address=args.node_address or node_address, base_url=args.base_url,
            router_url=args.router_url, prefill_url=args.prefill_url, decode_url=args.decode_url,
            instance_urls=args.instance_url, bootstrap_urls=args.bootstrap_url,
            router_metrics_url=args.router_metrics_url,
            api_key_file=args.api_key_file or api_key_file, admin_key_file=args.admin_key_file,
            auth_template=args.auth_template, timeout_s=args.timeout, overall_s=args.overall_timeout,
            max_tokens=args.max_tokens, skip_burst=args.skip_burst, env=os.environ if env is None else env,
            on_node=on_node if args.on_node is None else bool(args.on_node),
        )
    except ConfigError as exc:
        return _cannot_run(args, str(exc))
    except (TypeError, ValueError) as exc:  # a plan with values of the wrong type
        return _cannot_run(args, f"the plan is not usable: {exc}")
    report = verify(run)
    print(to_json(report) if args.json else to_table(report))
    sys.stdout.flush()
    return report.exit_code


def _cannot_run(args: argparse.Namespace, why: str) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"schema": SCHEMA, "ok": False, "exit_code": EXIT_CANNOT_RUN, "error": why,
                          "checks": [], "failures": [f"could not run: {why}"], "warnings": [],
                          "measurements": {}}, indent=2))
    print(f"pdnode verify: could not run: {why}", file=sys.stderr)
    return EXIT_CANNOT_RUN


def cmd_verify(args: argparse.Namespace) -> int:
    from ..core.plan.cluster import layout_view
    from ..core.plan.load import Unplannable, load_plan

    try:
        loaded = load_plan(args.inventory, args.host)
        conn = str(loaded.variables.get("ansible_connection") or "")
        # On the node, its record of the layout it runs names the instances as the deploy
        # did (an instance that stayed keeps its name whatever its index); elsewhere the
        # instances are not reached (the router is), and their names do not matter.
        on_node = conn == "local" if args.on_node is None else bool(args.on_node)
        record = _node_record(loaded.plan.change["record_file"]) if on_node else None
        if record:
            loaded = load_plan(args.inventory, args.host, record)
        plan, host = loaded.plan, loaded.plan.host
        if plan.cluster["multi_host"] and "router" not in plan.services:
            return _cannot_run(args, f"{host} does not run the router of its layout: verify from "
                                     f"{plan.cluster['router']['host']} (--host {plan.cluster['router']['host']})")
        # the layout's every engine, as each host plans it (from the same record: the hosts'
        # records of one layout are the same)
        plans = {h: load_plan(args.inventory, h, record).plan.as_dict() for h in plan.cluster["hosts"]}
    except Unplannable as exc:  # an invalid inventory too: the node is what this command judges
        return _cannot_run(args, "\n".join([str(exc), *exc.lines[1:]]))
    address = None if conn == "local" else loaded.variables.get("ansible_host")
    # The inventory, not an address, says whether this machine is the node.
    return run_with_plan(layout_view(plans, host), args, node_address=str(address) if address else None,
                         api_key_file=plan.settings.get("pdnode_api_key_file"), on_node=conn == "local")


def _node_record(path: str) -> str | None:
    """The node's record of the layout it runs (root-only); None where there is none or it
    cannot be read here (then instances are named by their index, as the inventory says)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        print(f"pdnode verify: cannot read the node's record {path} ({why}): instances are named by their "
              "index (run as root, or give them name: in the inventory)", file=sys.stderr)
        return None


def register(sub: Any) -> None:
    """Add `pdnode verify` to pdnode's subcommands (called by pdnode.commands.cli)."""
    p = sub.add_parser("verify", help="verify a running node (exit 0 ok, 1 a check failed, 2 could not run)",
                       description="Verify a deployed PD node through its public surface.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")
    add_options(p)
    p.set_defaults(func=cmd_verify)


def main_plan(argv: Sequence[str] | None = None) -> int:
    """python -m pdnode.verify --plan PLAN.json: no inventory parsing (runs on the host)."""
    p = argparse.ArgumentParser(prog="python -m pdnode.verify", description="Verify a deployed PD node.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, help="the plan as JSON (`pdnode render INVENTORY --role plan`); "
                                                 "- reads it from standard input")
    add_options(p)
    args = p.parse_args(argv)
    try:
        plan = read_plan(args.plan)
    except PlanFileError as exc:
        return _cannot_run(args, str(exc))
    return run_with_plan(plan, args, on_node=True)  # the node's entry point
