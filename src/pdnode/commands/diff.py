"""`pdnode diff INVENTORY` and `pdnode diff --from OLD NEW`: a change previewed before it
runs (issue 45), computed as the deploy computes it (pdnode.core.change.identity).

`pdnode diff INVENTORY` reads what the node runs from its hosts: playbooks/read.yml
computes each host's plan from the record the last deploy left there (read-only), as the
deploy's plan does. `--from OLD NEW` does the same offline, for a node that runs OLD as a
deploy from scratch would have named it. Either way: the instances that keep running
(named after the running ones they are), then the steps in the deploy's order with how
many prefills and decodes serve after each, and the expected window of any step that
leaves a role with none serving (the stand-in's start time, or for a real engine an
estimate from the model's size: pdnode.core.change.window).

Exit 0: no step leaves a role without an instance; 1: some step does (the deploy refuses
it unless pdnode_allow_unavailable: docs/decisions.md, "A layout change, in order");
2: an inventory could not be read or planned, or a host not read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..core.change import layout_change as lc
from ..core.change.cost import ACCEPT_WINDOW
from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from ..core.inventory.read import InventoryError, inventory_dirs, inventory_variables
from ..core.plan.build import PlanError, build_plan
from ..core.resources import playbook as find_playbook


class Unplannable(Exception):
    pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="a change as steps: what starts, restarts and stops, in which order, how many "
                                    "of each role serve after each step (exit 1: a role reaches 0)")
    p.add_argument("inventory", help="the inventory as it will be (e.g. inventories/gpu01)")
    p.add_argument("--from", dest="old", metavar="OLD_INVENTORY",
                   help="compare with this inventory instead of what the node runs (no host is read)")
    p.add_argument("--json", action="store_true", help="the steps as JSON (schema pdnode.diff/1)")
    p.set_defaults(func=cmd_diff)


def _plans(inventory: str, running: dict[str, str] | None = None) -> dict[str, Any]:
    """Every host's plan of INVENTORY (RUNNING: each host's record text), a change that
    leaves a role at zero reported rather than refused."""
    try:
        peers, dirs = inventory_variables(inventory), inventory_dirs(inventory)
    except InventoryError as exc:
        raise Unplannable(str(exc)) from None
    plans = {}
    for host in peers:
        try:
            plans[host] = build_plan({**peers[host], "pdnode_allow_unavailable": True}, host, peers, dirs.get(host),
                                     running=running)
        except PlanError as exc:
            raise Unplannable(f"{inventory}: host {host} has {len(exc.problems)} problem(s), the first: "
                              f"{exc.problems[0]}; `pdnode check {inventory}` lists them") from None
    return plans


def from_inventories(old_inv: str, new_inv: str) -> dict[str, Any]:
    """The change from a node that runs OLD_INV (as a deploy from scratch named it) to NEW_INV."""
    old = _plans(old_inv)
    record = json.dumps(next(iter(old.values())).change["converged"])
    new = _plans(new_inv, {host: record for host in old})
    return next(iter(new.values())).change


def read_node(inventory_path: str, command: str) -> dict[str, dict[str, Any]]:
    """Each host's answer (pdnode.core.change.identity.node_answer) through playbooks/read.yml,
    read-only; Unplannable with one line when a host could not be read."""
    playbook, playbook_env = find_playbook("read")
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    if not os.access(ansible_playbook, os.X_OK):
        raise Unplannable(f"ansible-playbook is not installed next to {sys.executable} (scripts/setup installs it)")
    inventory = Path(inventory_path).resolve()
    if not inventory.exists():
        raise Unplannable(f"inventory {inventory_path} not found")
    with tempfile.TemporaryDirectory(prefix=f"pdnode-{command}-") as tmp:
        extra = {"pdnode_allow_unavailable": True, "read_out_dir": tmp}
        env = dict(os.environ, **playbook_env)
        env["PATH"] = f"{ansible_playbook.parent}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.run([str(ansible_playbook), playbook, "-i", str(inventory), "-e", json.dumps(extra)],
                              env=env, capture_output=True, text=True, check=False)
        answers = {p.stem: json.loads(p.read_text()) for p in sorted(Path(tmp).glob("*.json"))}
    if proc.returncode != 0 or not answers:
        failed = [line.strip() for line in proc.stdout.splitlines() if line.lstrip().startswith(("fatal:", "failed:"))]
        said = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith(("ERROR", "[ERROR]"))]
        why = (failed or said or [f"ansible-playbook exit {proc.returncode}"])[0]
        raise Unplannable(f"could not read what the node runs: {why[:400]}")
    return answers


def from_node(new_inv: str) -> dict[str, Any]:
    """The change from what the node runs (its hosts' records) to NEW_INV."""
    return next(iter(read_node(new_inv, "diff").values()))["change"]


def report(change: dict[str, Any], source: str, target: str) -> tuple[dict[str, Any], bool]:
    record = change["record"]["engines"] if change["by"] == "record" else {}
    stepped = {s["id"] for s in change["steps"]} | {s["was"] for s in change["steps"] if s["was"]}
    before = {r: sum(1 for e in record.values() if e["role"] == r) for r in lc.ROLES}
    doc = {
        "schema": "pdnode.diff/1", "from": source, "to": target, "by": change["by"], "notes": change["notes"],
        "serving_before": before,
        "kept": [{"instance": iid, "gpus": _gpus(e["gpus"])} for iid, e in record.items() if iid not in stepped],
        "steps": [{"step": i + 1, "action": s["kind"], "instance": s["id"], "was": s["was"], "label": s["label"],
                   "serving_after": s["serving"], "at_zero": s["at_zero"]} for i, s in enumerate(change["steps"])],
        "windows": change["windows"],
        # roles the hosts' steps, taken side by side, may leave with none serving
        "side_by_side": change.get("side_by_side") or [],
        # what the deploy refuses this change for (a window, units the record does not name,
        # an unfinished earlier change), in its one line; None where it would run
        "refusal": change.get("refusal"),
    }
    return doc, not change["windows"] and not doc["side_by_side"] and not doc["refusal"]


def _gpus(pairs: list[list[Any]]) -> str:
    hosts: dict[str, list[int]] = {}
    for h, g in pairs:
        hosts.setdefault(h, []).append(g)
    return ", ".join(f"{h}:{','.join(map(str, gs))}" for h, gs in hosts.items())


def text(doc: dict[str, Any]) -> str:
    if doc["by"] == "index":
        return (f"pdnode diff: {doc['from']} -> {doc['to']}: the node has no record of what it runs (a new node, or one "
                "deployed before records): the deploy starts every instance, named by its index")
    lines = [f"pdnode diff: {doc['from']} -> {doc['to']} (serving now: prefill {doc['serving_before']['prefill']}, "
             f"decode {doc['serving_before']['decode']})",
             "  the deploy's steps, in its order (starts before the stops they replace where GPUs are free)"]
    lines += [f"  note: {n}" for n in doc["notes"]]
    for k in doc["kept"]:
        lines.append(f"  keeps running: {k['instance']} on {k['gpus']}")
    if not doc["steps"]:
        lines.append("  nothing to change")
    for s in doc["steps"]:
        zero = f"  <- no {' and no '.join(s['at_zero'])} serving" if s["at_zero"] else ""
        lines.append(f"  {s['step']}. {s['label']:<28} serving after: prefill {s['serving_after']['prefill']}, "
                     f"decode {s['serving_after']['decode']}{zero}")
    for w in doc["windows"]:
        secs = f"~{w['expected_s']:.0f} s" if w["expected_s"] is not None else "unknown"
        lines.append(f"  window: no {w['role']} serves during step(s) {', '.join(map(str, w['steps']))}: {secs} "
                     f"({w['source']}); no order of these steps avoids it: the deploy refuses it unless "
                     f"-e '{ACCEPT_WINDOW}'")
    for role in doc["side_by_side"]:
        lines.append(f"  side by side: the hosts take their own steps at once; a {role} may have none serving "
                     "between one host's stop and another's start")
    if not doc["windows"] and not doc["side_by_side"]:
        lines.append("  every step keeps a prefill and a decode serving")
    if doc["refusal"]:
        lines.append(f"  the deploy refuses it: {doc['refusal']}")
    return "\n".join(lines)


def cmd_diff(args: argparse.Namespace) -> int:
    try:
        if args.old:
            doc, safe = report(from_inventories(args.old, args.inventory), args.old, args.inventory)
        else:
            doc, safe = report(from_node(args.inventory), "the node (its hosts' records)", args.inventory)
    except Unplannable as exc:
        print(f"pdnode diff: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    print(json.dumps(doc, indent=2) if args.json else text(doc))
    return EXIT_OK if safe else EXIT_FAILED
