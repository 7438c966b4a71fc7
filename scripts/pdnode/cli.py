"""pdnode: the command line over the plan core.

Exit codes everywhere: 0 ok, 1 the inventory (or the node) is wrong, 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .inventory import InventoryError, load_inventory
from .plan import Plan, PlanError, build_plan

EXIT_OK, EXIT_INVALID, EXIT_CANNOT_RUN = 0, 1, 2


def _plan_or_exit(args: argparse.Namespace) -> Plan:
    try:
        hv = load_inventory(args.inventory, args.host)
    except InventoryError as exc:
        print(f"pdnode: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CANNOT_RUN) from None
    try:
        plan = build_plan(hv.variables, hv.host)
    except PlanError as exc:
        n = len(exc.problems)
        print(f"{args.inventory}: {n} problem{'s' * (n != 1)} in host {hv.host}:", file=sys.stderr)
        for problem in exc.problems:
            where = hv.sources.get(problem.field.split(".")[0], "")
            print(f"  {problem}" + (f"  [{where}]" if where else ""), file=sys.stderr)
        raise SystemExit(EXIT_INVALID) from None
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return plan


def cmd_check(args: argparse.Namespace) -> int:
    plan = _plan_or_exit(args)
    print(f"{args.inventory}: host {plan.host} OK (prefill GPUs {_gpus(plan.gpus['prefill'])}, "
          f"decode GPUs {_gpus(plan.gpus['decode'])}, {len(plan.ports)} ports)")
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    plan = _plan_or_exit(args)
    if args.role == "router-argv":
        print(json.dumps(plan.router_argv(), indent=2))
    elif args.role == "plan":
        print(json.dumps(plan.as_dict(), indent=2, sort_keys=True))
    elif args.role == "alerts":
        from .monitoring import render_alert_rules  # controller-only: reads templates/
        print(render_alert_rules(plan.as_dict()), end="")
    else:
        print(json.dumps(getattr(plan, args.role), indent=2, sort_keys=True))
    return EXIT_OK


def _gpus(ids: list[int]) -> str:
    return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])


def cmd_explain(args: argparse.Namespace) -> int:
    plan = _plan_or_exit(args)
    p, d, r = plan.prefill, plan.decode, plan.router
    rows = [
        ("role", "GPUs", "parallelism", "listens on"),
        ("prefill", _gpus(plan.gpus["prefill"]),
         f"TP {p['tp_size']}" + (f", attn-DP {p['attn_dp_size']}" if "attn_dp_size" in p else ""),
         f"{p['host']}:{p['port']} (HTTP), :{p['disaggregation_bootstrap_port']} (bootstrap), "
         f":{p['nccl_port']} (NCCL)"),
        ("decode", _gpus(plan.gpus["decode"]),
         f"TP {d['tp_size']}" + (f", attn-DP {d['attn_dp_size']} (attn-TP {d['tp_size'] // d['attn_dp_size']})"
                                 if "attn_dp_size" in d else "") + (f", EP {d['ep_size']}" if "ep_size" in d else ""),
         f"{d['host']}:{d['port']} (HTTP)"
         + (f", :{d['port'] + 233}-{d['port'] + 239} (internal)" if "attn_dp_size" in d else "")
         + f", :{d['nccl_port']} (NCCL)"),
        ("router", "-", f"PD, policy {r['policy']}",
         f"{r['host']}:{r['port']} (HTTP), {r['prometheus_host']}:{r['prometheus_port']} (metrics)"),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    backend = p["disaggregation_transfer_backend"]
    nics = "RDMA devices per GPU" if "disaggregation_ib_device" in p else "auto-discovered devices"
    print(f"\nmodel {p['served_model_name']} from {p['model_path']}; KV moves prefill -> decode over "
          f"{backend}" + (f" ({nics})" if backend != "mooncake_tcp" else " (TCP)") + ".")
    return EXIT_OK


def _add_inventory(p: argparse.ArgumentParser) -> None:
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdnode", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="validate an inventory (exit 0 valid, 1 invalid, 2 unreadable)")
    _add_inventory(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("render", help="print the JSON that will be written on the host")
    _add_inventory(p)
    p.add_argument("--role", required=True, choices=["prefill", "decode", "router", "router-argv", "plan", "alerts"])
    p.set_defaults(func=cmd_render)
    p = sub.add_parser("explain", help="who runs where: role, GPUs, parallelism, ports")
    _add_inventory(p)
    p.set_defaults(func=cmd_explain)
    _register_optional(sub)
    return parser


def _register_optional(sub: argparse._SubParsersAction) -> None:
    """Subcommands that live in their own modules (imported here, not at the top, so that
    `pdnode check` stays fast: it never loads the verifier's HTTP and metrics code)."""
    from . import collect, placement
    from .verify import cli as verify_cli

    verify_cli.register(sub)
    placement.register(sub)
    collect.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
