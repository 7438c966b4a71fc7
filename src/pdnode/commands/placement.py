"""`pdnode placement INVENTORY --topo FILE`: the plan's GPUs against the host's
`nvidia-smi topo -m` (the judgement: pdnode.core.host.placement_advice; docs/placement.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..core.exits import EXIT_CANNOT_RUN
from ..core.host.facts import parse_topo_matrix
from ..core.plan.load import Unplannable, load_plan
from ..core.host.placement import SCHEMA

EPILOG = """\
FILE is the saved output of `nvidia-smi topo -m` on the host (docs/placement.md).
exit codes: 0 the plan's placement is the recommended one (or as good), 1 a better one
exists (or the plan does not fit this topology), 2 the inputs could not be read."""


def _cannot_run(args: argparse.Namespace, why: str) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"schema": SCHEMA, "exit_code": EXIT_CANNOT_RUN, "error": why}, indent=2))
    print(f"pdnode placement: could not run: {why}", file=sys.stderr)
    return EXIT_CANNOT_RUN


def cmd_placement(args: argparse.Namespace) -> int:
    try:
        plan = load_plan(args.inventory, args.host).plan
    except Unplannable as exc:  # an invalid inventory too: the placement is what this command judges
        return _cannot_run(args, str(exc))
    try:
        text = Path(args.topo).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return _cannot_run(args, f"cannot read {args.topo}: {exc.strerror or exc}")
    topo = parse_topo_matrix(text)
    if not any(d.startswith("GPU") for d in topo["devices"]) or not topo["links"]:
        return _cannot_run(args, f"{args.topo} is not `nvidia-smi topo -m` output (no GPU0 header row and matrix)")
    from ..core.host.placement_advice import advise  # the judgement

    try:
        advice = advise(topo, plan.services, plan.settings.get("pdnode_ib_devices") or None)
    except ValueError as exc:
        return _cannot_run(args, str(exc))
    gpu_count = plan.settings.get("pdnode_gpu_count")
    if args.json:
        print(json.dumps({"schema": SCHEMA, "host": plan.host, "inventory": str(args.inventory),
                          "topo_file": str(args.topo), "gpu_count": gpu_count, **advice.as_dict()}, indent=2))
    else:
        print(f"host {plan.host}: plan from {args.inventory} (pdnode_gpu_count={gpu_count}), "
              f"topology from {args.topo}")
        print("\n".join(advice.lines()))
    return advice.exit_code


def register(sub: Any) -> None:
    """Add `pdnode placement` to pdnode's subcommands (called by pdnode.commands.cli)."""
    p = sub.add_parser("placement", help="check GPU/NUMA/NIC placement against `nvidia-smi topo -m` "
                                         "(exit 0 best, 1 a better one exists, 2 cannot read)",
                       description="Check the GPUs of each engine instance of the plan, their NUMA locality and "
                                   "NICs against the host's `nvidia-smi topo -m`, and recommend a placement and CPU "
                                   "affinity per instance.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")
    p.add_argument("--topo", required=True, metavar="FILE", help="saved `nvidia-smi topo -m` output of the host")
    p.add_argument("--json", action="store_true", help=f"print the advice as JSON (schema {SCHEMA})")
    p.set_defaults(func=cmd_placement)
