"""`pdnode status INVENTORY`: what the node runs, read from its hosts (issue 45), read-only.

The same read as `pdnode diff INVENTORY` (playbooks/read.yml): each engine instance the
last deploy recorded (pdnode.core.change.identity), with its unit's state on each of its
hosts and since when, how long its last start took (systemd's record), the release and the
model commit its process runs (its interpreter, its PDNODE_MODEL_COMMIT), and whether the
router lists it and reports it healthy.

Exit 0: every instance runs, in the router and healthy; 1: one does not (each named);
2: the node could not be read, or it has no record (a new node, or one deployed before
records: deploy it once).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import PurePosixPath
from typing import Any

from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from .diff import Unplannable, read_node


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="what the node runs, read from its hosts: each instance's unit, router "
                                      "membership and health, release, model, last start (exit 1: one is not serving)")
    p.add_argument("inventory", help="the node's inventory (e.g. inventories/gpu01)")
    p.add_argument("--json", action="store_true", help="the instances as JSON (schema pdnode.status/1)")
    p.set_defaults(func=cmd_status)


def instances(answers: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every recorded instance with what its hosts and the router say of it."""
    first = next(iter(answers.values()))
    record = (first["change"].get("record") or {}).get("engines") or {}
    listed = next((a["router"] for a in answers.values() if a["router_host"]), None)
    health = {w["url"]: w["healthy"] for w in listed} if listed is not None else None
    out = []
    for iid, e in record.items():
        hosts = sorted({h for h, _ in e["gpus"]})
        states = {h: (answers.get(h) or {}).get("units", {}).get(e["unit"]) for h in hosts}
        first_host = states.get(hosts[0]) or {}
        python = first_host.get("python")
        problems = [f"{e['unit']} is {(s or {}).get('active') or 'not read'} on {h}"
                    for h, s in states.items() if (s or {}).get("active") != "active"]
        url = e["worker"]["url"]
        if health is None:
            problems.append("the router's worker list could not be read")
        elif url not in health:
            problems.append(f"the router does not list {url}")
        elif not health[url]:
            problems.append(f"the router lists {url} unhealthy")
        out.append({
            "instance": iid, "role": e["role"], "unit": e["unit"],
            "gpus": ", ".join(f"{h}:{','.join(str(g) for hh, g in e['gpus'] if hh == h)}" for h in hosts),
            "active": {h: (s or {}).get("active") for h, s in states.items()},
            "since": first_host.get("since"), "last_start_s": first_host.get("started_s"),
            "release": PurePosixPath(python).parent.parent.name if python else None,
            "model_commit": first_host.get("model_commit"),
            "in_router": None if health is None else url in health,
            "healthy": None if health is None else health.get(url),
            "problems": problems,
        })
    return out


def text(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'instance':<12} {'state':<8} {'router':<9} {'last start':>10}  {'since':<29} {'release / model':<s}"]
    for r in rows:
        state = "active" if all(v == "active" for v in r["active"].values()) else "/".join(
            str(v) for v in r["active"].values())
        router = "?" if r["in_router"] is None else ("healthy" if r["healthy"] else "unhealthy") if r["in_router"] \
            else "absent"
        start = f"{r['last_start_s']:.1f} s" if r["last_start_s"] is not None else "-"
        model = f" / {r['model_commit'][:12]}" if r["model_commit"] else ""
        lines.append(f"{r['instance']:<12} {state:<8} {router:<9} {start:>10}  {r['since'] or '-':<29} "
                     f"{r['release'] or '-'}{model}   ({r['gpus']})")
    lines += [f"  {r['instance']}: {p}" for r in rows for p in r["problems"]]
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        answers = read_node(args.inventory, "status")
    except Unplannable as exc:
        print(f"pdnode status: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if next(iter(answers.values()))["change"].get("by") != "record":
        print(f"pdnode status: {args.inventory}: the node has no record of what it runs (a new node, or one deployed "
              "before records): deploy it once (playbooks/deploy.yml)", file=sys.stderr)
        return EXIT_CANNOT_RUN
    rows = instances(answers)
    print(json.dumps({"schema": "pdnode.status/1", "instances": rows}, indent=2) if args.json else text(rows))
    return EXIT_OK if not any(r["problems"] for r in rows) else EXIT_FAILED
