"""pdnode: the command line over the plan core.

Exit codes everywhere: 0 ok, 1 the inventory (or the node) is wrong, 2 could not run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence

from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from ..core.inventory.read import InventoryError, inventory_dirs, inventory_variables, load_inventory
from ..core.plan.load import Unplannable, load_plan, problem_lines, source_of
from ..core.rules.instances import gpus_text
from ..core.plan.build import Plan, PlanError, Problem, build_plan


def _hosts_to_plan(args: argparse.Namespace) -> tuple[list[str], dict[str, dict]]:
    """The hosts a command plans (--host, or every host of the inventory) and every
    host's variables (a layout spanning hosts reads its peers'); Unplannable if unreadable."""
    try:
        peers = inventory_variables(args.inventory)
    except InventoryError as exc:
        raise Unplannable(str(exc), EXIT_CANNOT_RUN) from None
    if args.host is not None and args.host not in peers:
        raise Unplannable(f"{args.inventory}: no host {args.host!r} (hosts: {', '.join(peers)})", EXIT_CANNOT_RUN)
    return ([args.host] if args.host else list(peers)), peers


def _plan(args: argparse.Namespace, host: str | None = None) -> Plan:
    """The host's plan, its warnings on stderr (Unplannable: main() says why and exits)."""
    plan = load_plan(args.inventory, host or args.host).plan
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return plan


def _problem_json(problem: Problem, sources: dict[str, str]) -> dict[str, object]:
    value = problem.value
    if isinstance(value, str) and len(value) > 120:  # as the text line shows it: a 2 MB value is not echoed
        value = f"{value[:100]}... ({len(value)} characters)"
    return {"rule": problem.rule_id, "field": problem.field, "value": value, "message": problem.rule,
            "fix": problem.fix, "severity": problem.severity,
            "source": source_of(problem, sources)}


def _sglang_verdicts(plan: Plan) -> tuple[list[Problem], list[Problem]]:
    """SGLang's own validation of every engine's ServerArgs on this host (problems,
    warnings); where it cannot run, one warning says so and pdnode's rules stand alone."""
    from ..core.rules import sglang_judge  # controller only: runs the validator environment

    engines = plan.engines()
    want = plan.settings["pdnode_sglang_version"]
    if not engines:  # (the stand-in reads the same ServerArgs: a demo layout is judged too)
        return [], []
    python = sglang_judge.find_validator()
    have = sglang_judge.validator_version(python) if python else None
    if python is None or have != want:
        why = ("switched off: PDNODE_SGLANG_VALIDATOR=off" if os.environ.get("PDNODE_SGLANG_VALIDATOR") == "off"
               else "no validator environment on this machine" if python is None
               else f"the validator at {python} has SGLang {have or 'missing'}, the plan deploys {want}")
        return [], [Problem("sglang-validation-not-run", "pdnode_sglang_version", want,
                            f"SGLang's own validation did not run ({why}); only pdnode's rules were applied",
                            "run scripts/sglang-validator once (or set PDNODE_SGLANG_VALIDATOR to a Python with "
                            f"sglang {want})", "warning")]
    problems, warnings = [], []
    for svc, verdict in zip(engines, sglang_judge.judge(engines, plan.settings, python)):
        where, key = sglang_judge.instance_field(svc, plan.settings, verdict.reason)
        if verdict.reason.startswith("CANNOT CHECK") or (
                not verdict.accepted and sglang_judge.depends_on_the_machine(verdict.reason)):
            warnings.append(Problem("sglang-could-not-judge", where, svc["id"],
                                    f"SGLang {want} could not judge {svc['id']}'s ServerArgs on this machine "
                                    f"({verdict.reason.removeprefix('CANNOT CHECK: ')})",
                                    "run scripts/sglang-validator --rebuild, or check on the host with "
                                    "`pdnode.node.launcher --check`", "warning"))
        elif not verdict.accepted:
            shown = svc["args"].get(key) if key else svc["id"]
            problems.append(Problem("sglang-rejects", where, shown,
                                    f"SGLang {want} refuses {svc['id']}'s ServerArgs: {verdict.reason}",
                                    f"change it so SGLang accepts it (`pdnode render INVENTORY --role {svc['id']}` "
                                    "shows the ServerArgs it judged)"))
    return problems, warnings


def _host_verdict(args: argparse.Namespace, host: str, peers: dict) -> tuple[Plan | None, list, list]:
    """(plan or None, problems, warnings) of one host: pdnode's rules, then SGLang's."""
    try:
        plan = build_plan(peers[host], host, peers, inventory_dirs(args.inventory).get(host))
    except PlanError as exc:
        return None, exc.problems, []
    problems, warnings = _sglang_verdicts(plan)
    return plan, problems, list(plan.warnings) + warnings


def cmd_check(args: argparse.Namespace) -> int:
    hosts, peers = _hosts_to_plan(args)
    verdicts = {host: _host_verdict(args, host, peers) for host in hosts}
    if args.json:
        # For scripts: the same verdict and exit code, every problem with its rule id
        # (pdnode.core.rules.catalogue; docs/inventory.md lists them). An unreadable inventory stays a
        # line on stderr, exit 2: there is no plan to report on. One host: its report;
        # several: {ok, hosts: [report, ...]}.
        reports = []
        for host in hosts:
            sources = load_inventory(args.inventory, host).sources
            _, problems, warnings = verdicts[host]
            reports.append({"ok": not problems, "host": host,
                            "problems": [_problem_json(p, sources) for p in problems],
                            "warnings": [_problem_json(w, sources) for w in warnings]})
        ok = all(r["ok"] for r in reports)
        print(json.dumps(reports[0] if len(reports) == 1 else {"ok": ok, "hosts": reports}, indent=2, default=str))
        return EXIT_OK if ok else EXIT_FAILED
    failed = 0
    for host in hosts:
        plan, problems, warnings = verdicts[host]
        sources = load_inventory(args.inventory, host).sources
        if problems:
            print("\n".join(problem_lines(args.inventory, host, problems, sources)), file=sys.stderr)
            failed += 1
            continue
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        layout = ", ".join(f"{s['id']} GPUs {gpus_text(s['gpus'])}" for s in plan.engines())
        runs = layout + ("; " if layout and "router" in plan.services else "") + (
            f"the router at {plan.cluster['router']['url']}" if "router" in plan.services else "")
        print(f"{args.inventory}: host {plan.host} OK ({runs}; {len(plan.ports)} ports)")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    plan = _plan(args)
    if args.role == "router-argv" and "router" not in plan.services:
        print(f"pdnode: {plan.host} does not run the router of its layout ({plan.cluster['router']['host']} does: "
              f"--host {plan.cluster['router']['host']})", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if args.role == "router-argv":
        print(json.dumps(plan.router_argv(), indent=2))
    elif args.role == "plan":
        print(json.dumps(plan.as_dict(), indent=2, sort_keys=True))
    elif args.role == "alerts":
        from ..core.plan.monitoring import render_alert_rules  # controller-only: reads templates/
        print(render_alert_rules(plan.as_dict()), end="")
    elif args.role in plan.services:
        print(json.dumps(plan.services[args.role]["args"], indent=2, sort_keys=True))
    else:
        print(f"pdnode: no service {args.role!r} in this plan (services: {', '.join(plan.services)})", file=sys.stderr)
        return EXIT_CANNOT_RUN
    return EXIT_OK


def _parallelism(a: dict) -> str:
    text = f"TP {a['tp_size']}"
    if a.get("dp_size", 1) > 1:
        text += f" x {a['dp_size']} replicas"
    if a.get("attn_dp_size", 1) > 1:
        text += f", attn-DP {a['attn_dp_size']} (attn-TP {a['tp_size'] // a['attn_dp_size']})"
    if "ep_size" in a:
        text += f", EP {a['ep_size']}"
    return text


def cmd_explain(args: argparse.Namespace) -> int:
    hosts, _ = _hosts_to_plan(args)
    plans = [_plan(args, host) for host in hosts]
    for i, plan in enumerate(plans):
        if plan.cluster["multi_host"]:
            print(("\n" if i else "") + f"host {plan.host} ({plan.cluster['hosts'][plan.host]['address']}):")
        _explain_host(plan)
    _explain_layout(plans[-1])
    return EXIT_OK


def _explain_host(plan: Plan) -> None:
    rows = [("service", "unit", "GPUs", "parallelism", "listens on")]
    for s in plan.engines():
        a = s["args"]
        if s["url"] is None:
            listens = f"{a['host']}:{a['port']} (health; node rank {a['node_rank']} of {a['nnodes']}, joins " \
                      f"{a['dist_init_addr']})"
        else:
            listens = f"{a['host']}:{a['port']} (HTTP)"
        if s["role"] == "prefill" and s["url"] is not None:
            listens += f", :{s['bootstrap_port']} (bootstrap)"
        if a.get("attn_dp_size", 1) > 1 and "dist_init_addr" not in a:
            listens += f", :{a['port'] + 233}-{a['port'] + 239} (internal)"
        if a.get("node_rank") == 0:
            port = int(a["dist_init_addr"].rsplit(":", 1)[1])
            listens += f", :{port} (rendezvous of {a['nnodes']} hosts; SGLang derives +1..+6 and +13)"
        if "nccl_port" in a:
            listens += f", :{a['nccl_port']} (NCCL)"
        rows.append((s["id"], s["unit"], gpus_text(s["gpus"]), _parallelism(a), listens))
    if "router" in plan.services:
        r = plan.services["router"]
        ra = r["args"]
        rows.append(("router", r["unit"], "-", f"PD, policy {ra['policy']}",
                     f"{ra['host']}:{ra['port']} (HTTP), {ra['prometheus_host']}:{ra['prometheus_port']} (metrics)"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    bound = [s["id"] for s in plan.engines("decode") if s["bound_to"]]
    if bound:
        print(f"{', '.join(bound)} restart{'s' * (len(bound) == 1)} with the one prefill (docs/decisions.md).")
    probe = plan.services.get("router", {}).get("pair_probe")
    if probe:
        pairs = len([e for e in plan.cluster["engines"].values() if e["role"] == "prefill"]) * \
            len([e for e in plan.cluster["engines"].values() if e["role"] == "decode"])
        print(f"{probe['timer']} sends one request to each prefill-decode pair ({pairs}) every "
              f"{probe['interval_s']} s (the per-pair probe; alert PdPairFailing; docs/monitoring.md).")
    fw = plan.firewall
    if fw["enabled"]:
        print(f"firewall: only {', '.join(fw['peers'])} reach{'es' * (len(fw['peers']) == 1)} these engines' ports"
              + (f"; port {', '.join(map(str, fw['public_tcp_ports']))} is open to all" if fw["public_tcp_ports"]
                 else "") + " (docs/firewall.md).")


def _explain_layout(plan: Plan) -> None:
    engines = plan.cluster["engines"]
    settings = plan.settings
    kv = plan.cluster["kv"]
    print(f"\nmodel {settings['pdnode_model_served_name']} from {settings['pdnode_model_path']}.")
    adds = (f"; a {kv['prompt_tokens']}-token prompt adds {_seconds(kv['handoff_s'])} to TTFT "
            f"({kv['bytes_per_token']} KV bytes per token)" if kv["handoff_s"] is not None
            else f"; what it adds to TTFT: KV bytes per token {kv['bytes_source']}")
    print(f"KV hand-off: {kv['path']}, about {kv['gb_s']:g} GB/s ({kv['why']}){adds}.")
    if kv["bytes_per_token"]:
        from ..core.plan.kv_path import SPEEDS, handoff_seconds
        others = ", ".join(f"{path} {_seconds(handoff_seconds(kv['bytes_per_token'], kv['prompt_tokens'], gb_s))}"
                           for path, (gb_s, _) in SPEEDS.items() if path not in (kv["path"], "nixl"))
        print(f"  the same prompt over the other paths: {others}.")
    prefills = [e for e in engines.values() if e["role"] == "prefill"]
    decodes = [e for e in engines.values() if e["role"] == "decode"]
    for p in prefills:
        for d in decodes:
            where = (f"{p['hosts'][0]} -> {d['hosts'][0]}" if plan.cluster["multi_host"] else "on this host")
            print(f"  {p['id']} -> {d['id']}: {kv['path']} ({where}), ~{kv['gb_s']:g} GB/s")
    floor = (settings.get("pdnode_verify_thresholds") or {}).get("kv_transfer_speed_min_gb_s")
    if floor is not None:
        why = (f"the {kv['path']} path's: {kv['floor_source']}" if kv.get("floor_from_path")
               else "pdnode_verify_thresholds")
        print(f"  verify's KV-speed floor: {floor:g} GB/s ({why}).")
    for check in kv["checks"]:
        print(f"  verify measures {check['pair']} (GPU {check['src_gpu']} -> {check['dst_gpu']}) with the Mooncake "
              f"check: {' '.join(check['args'])}")
    if plan.cluster["multi_host"]:
        router = plan.cluster["router"]
        regs = ", ".join(f"{e['id']} {e['url']}" for e in engines.values())
        print(f"router on {router['host']} at {router['url']} registers {regs} (API key required).")


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _add_inventory(p: argparse.ArgumentParser) -> None:
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` (the first argument) picks the optional module to load."""
    parser = argparse.ArgumentParser(prog="pdnode", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="validate an inventory (exit 0 valid, 1 invalid, 2 unreadable)")
    _add_inventory(p)
    p.add_argument("--json", action="store_true",
                   help="print {ok, host, problems, warnings} on stdout, each problem with its rule id")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("render", help="print the JSON that will be written on the host")
    _add_inventory(p)
    p.add_argument("--role", required=True, metavar="WHAT",
                   help="a service id (prefill-0, decode-0, router: its JSON), router-argv, plan or alerts")
    p.set_defaults(func=cmd_render)
    p = sub.add_parser("explain", help="who runs where: role, GPUs, parallelism, ports")
    _add_inventory(p)
    p.set_defaults(func=cmd_explain)
    _register_optional(sub, command)
    return parser


# Subcommands that live in their own modules, imported only when that command runs, so
# that `pdnode check` stays fast (it never loads the verifier's HTTP and metrics code or
# the bench client). The other commands are listed in --help by a one-line stub;
# tests/test_cli.py checks each stub's help against its module's.
OPTIONAL = {
    "verify": "pdnode.verify.cli",
    "placement": "pdnode.commands.placement",
    "collect": "pdnode.commands.collect",
    "plan": "pdnode.commands.planner",
    "bench": "pdnode.commands.bench",
    "runbooks": "pdnode.commands.runbooks",
    "model": "pdnode.commands.model",
    "diff": "pdnode.commands.diff",
    "status": "pdnode.commands.status",
}
OPTIONAL_HELP = {
    "verify": "verify a running node (exit 0 ok, 1 a check failed, 2 could not run)",
    "placement": "check GPU/NUMA/NIC placement against `nvidia-smi topo -m` (exit 0 best, 1 a better one exists, "
                 "2 cannot read)",
    "collect": "the incident bundle: every host's state, logs and files in one tar.gz (runs playbooks/collect.yml)",
    "plan": "rank the host's prefill/decode layouts for a workload from bench measurements",
    "bench": "load through the router; throughput, TTFT/ITL/E2E and per-instance work (exit 0 all completed, "
             "1 bad input or failures, 2 could not run)",
    "runbooks": "write this inventory's per-host runbooks (its units, ports, paths, commands) to "
                ".cache/runbooks/<host>/",
    "model": "pin the inventory's hf:// model to a commit (.model.lock.json beside it) and cache its config files "
             "for `pdnode check`",
    "diff": "a change as steps: what starts, restarts and stops, in which order, how many of each role "
            "serve after each step (exit 1: a role reaches 0)",
    "status": "what the node runs, read from its hosts: each instance's unit, router membership and health, "
              "release, model, last start (exit 1: one is not serving)",
}


def _register_optional(sub: argparse._SubParsersAction, command: str | None) -> None:
    for name, module in OPTIONAL.items():
        if name == command:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=OPTIONAL_HELP[name], add_help=False)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Unplannable as exc:  # no plan for a command that needs one: why, once
        print("\n".join(exc.lines or [f"pdnode {args.command}: {exc}"]), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_CANNOT_RUN
    except BrokenPipeError:  # `pdnode explain ... | head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
