"""`pdnode diff --from OLD NEW`: a layout change previewed before it runs (issue 45).

Both inventories are planned (every host); their engine instances are paired by what
they are (pdnode.core.change.layout_change: role, hosts, GPUs and arguments; a name
given on both sides): an instance that stays runs on. The steps that remain are ordered
to keep a prefill and a decode serving wherever some order can, and printed with how
many of each serve after each step. A step that leaves a role with none serving is
named with its expected window: the stand-in's start time, or for a real engine an
estimate from the model's size (no node measured: weights read at LOAD_GB_S per GPU,
plus GRAPH_CAPTURE_S).

Exit 0: no step leaves a role without an instance; 1: some step does (the change drops
that role's requests for its window: docs/decisions.md, "A layout change, in order");
2: an inventory could not be read or planned.

What this computes is the change a deploy must make; deploy.yml does not follow it yet
(it still names instances by index and restarts by the list): reading what a node runs
from its hosts, and the deploy taking these steps, are issue 45's remaining items.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.change import layout_change as lc
from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from ..core.inventory.read import InventoryError, inventory_dirs, inventory_variables
from ..core.plan.build import PlanError, build_plan

# A real engine's start with no node to measure: its weights read from local disk at this
# rate per GPU (each GPU reads its shard), then CUDA graphs captured (docs/decisions.md).
LOAD_GB_S = 2.0
GRAPH_CAPTURE_S = 60.0
# The stand-in's start beyond its configured pdnode_sim_startup_s: the units' readiness
# gate and the router's health check (the demo node's measured starts).
STANDIN_OVERHEAD_S = 3.0


class Unplannable(Exception):
    pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="a layout change as steps: what starts, restarts and stops, in which order, "
                                    "how many of each role serve after each step (exit 1: a role reaches 0)")
    p.add_argument("inventory", help="the inventory as it will be (e.g. inventories/gpu01)")
    p.add_argument("--from", dest="old", required=True, metavar="OLD_INVENTORY",
                   help="the inventory as it runs now (a copy of the deployed one)")
    p.add_argument("--json", action="store_true", help="the steps as JSON (schema pdnode.diff/1)")
    p.set_defaults(func=cmd_diff)


def _plans(inventory: str) -> dict[str, Any]:
    try:
        peers, dirs = inventory_variables(inventory), inventory_dirs(inventory)
    except InventoryError as exc:
        raise Unplannable(str(exc)) from None
    plans = {}
    for host in peers:
        try:
            plans[host] = build_plan(peers[host], host, peers, dirs.get(host))
        except PlanError as exc:
            raise Unplannable(f"{inventory}: host {host} has {len(exc.problems)} problem(s), the first: "
                              f"{exc.problems[0]}; `pdnode check {inventory}` lists them") from None
    return plans


def instances(plans: dict[str, Any]) -> list[lc.Instance]:
    """Every engine instance of the layout, with the (host, GPU) pairs it runs on."""
    found: dict[str, dict[str, Any]] = {}
    for host, plan in sorted(plans.items()):
        for svc in plan.engines():
            entry = found.setdefault(svc["id"], {"svc": svc, "gpus": []})
            entry["gpus"] += [(host, g) for g in svc["gpus"]]
    return [lc.Instance(iid, e["svc"]["role"], tuple(sorted(e["gpus"])), lc.shape_of(e["svc"]["args"]),
                        named=not str(e["svc"]["name"]).isdigit())
            for iid, e in sorted(found.items())]


def start_estimate(plan: Any, inst: lc.Instance) -> tuple[float | None, str]:
    """Seconds an instance takes to start and serve, and where the figure comes from."""
    s = plan.settings
    if s.get("pdnode_engine") == "sim":
        return float(s["pdnode_sim_startup_s"]) + STANDIN_OVERHEAD_S, "the stand-in's pdnode_sim_startup_s + its gates"
    weights = ((plan.model.get("facts") or {}).get("weight_bytes")
               or (s.get("pdnode_model_weights_gb") or 0) * 1e9 or None)
    if not weights:
        return None, "unknown (no model size: pdnode_model_source's files or pdnode_model_weights_gb)"
    gpus = max(len(inst.gpus), 1)
    return (weights / gpus / (LOAD_GB_S * 1e9) + GRAPH_CAPTURE_S,
            f"estimate: {weights / 1e9:.0f} GB over {gpus} GPU(s) at {LOAD_GB_S:g} GB/s + {GRAPH_CAPTURE_S:g} s")


def windows(plan_change: lc.Plan, new_plan: Any, new: dict[str, lc.Instance]) -> list[dict[str, Any]]:
    """Each stretch of steps that leaves a role at zero: its steps and expected seconds
    (until a start or restart of that role serves again)."""
    out: list[dict[str, Any]] = []
    for role in lc.ROLES:
        run: list[int] = []
        for i, step in enumerate(plan_change.steps + (None,)):  # type: ignore[operator]
            if step is not None and role in step.at_zero:
                run.append(i)
                continue
            if run:
                back = [plan_change.steps[j] for j in run if plan_change.steps[j].action.kind in ("start", "restart")
                        and plan_change.steps[j].action.role == role]
                estimates = [start_estimate(new_plan, new[b.action.new]) for b in back if b.action.new in new]
                seconds = max((e[0] for e in estimates if e[0] is not None), default=None)
                out.append({"role": role, "steps": [j + 1 for j in run], "expected_s": seconds,
                            "source": estimates[0][1] if estimates else "no start of the role in these steps"})
                run = []
    return out


def report(old_inv: str, new_inv: str) -> tuple[dict[str, Any], bool]:
    old_plans, new_plans = _plans(old_inv), _plans(new_inv)
    old, new = instances(old_plans), instances(new_plans)
    m, change = lc.plan_change(old, new)
    any_plan = next(iter(new_plans.values()))
    by_id = {i.id: i for i in new}
    doc = {
        "schema": "pdnode.diff/1", "from": old_inv, "to": new_inv, "exact_order": change.exact,
        "serving_before": change.start,
        "kept": [{"instance": n.id, "was": o.id, "gpus": _gpus(n)} for o, n in m.keep],
        "steps": [{"step": i + 1, "action": s.action.kind, "instance": s.action.new or s.action.old,
                   "was": s.action.old, "label": s.action.label, "serving_after": s.serving,
                   "at_zero": list(s.at_zero)} for i, s in enumerate(change.steps)],
        "windows": windows(change, any_plan, by_id),
    }
    return doc, not change.zero_steps


def _gpus(i: lc.Instance) -> str:
    hosts: dict[str, list[int]] = {}
    for h, g in i.gpus:
        hosts.setdefault(h, []).append(g)
    return ", ".join(f"{h}:{','.join(map(str, gs))}" for h, gs in hosts.items())


def text(doc: dict[str, Any]) -> str:
    lines = [f"pdnode diff: {doc['from']} -> {doc['to']} (serving now: prefill {doc['serving_before']['prefill']}, "
             f"decode {doc['serving_before']['decode']})",
             "  the steps that keep serving where some order can (deploy.yml does not take them yet: "
             "docs/decisions.md)"]
    for k in doc["kept"]:
        listed = f" (listed as {k['instance']} now)" if k["instance"] != k["was"] else ""
        lines.append(f"  keeps running: {k['was']}{listed} on {k['gpus']}")
    if not doc["steps"]:
        lines.append("  nothing to change")
    for s in doc["steps"]:
        zero = f"  <- no {' and no '.join(s['at_zero'])} serving" if s["at_zero"] else ""
        lines.append(f"  {s['step']}. {s['label']:<28} serving after: prefill {s['serving_after']['prefill']}, "
                     f"decode {s['serving_after']['decode']}{zero}")
    for w in doc["windows"]:
        secs = f"~{w['expected_s']:.0f} s" if w["expected_s"] is not None else "unknown"
        lines.append(f"  window: no {w['role']} serves during step(s) {', '.join(map(str, w['steps']))}: {secs} "
                     f"({w['source']}); no order of these steps avoids it")
    if not doc["windows"]:
        lines.append("  every step keeps a prefill and a decode serving")
    return "\n".join(lines)


def cmd_diff(args: argparse.Namespace) -> int:
    try:
        doc, safe = report(args.old, args.inventory)
    except Unplannable as exc:
        print(f"pdnode diff: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    print(json.dumps(doc, indent=2) if args.json else text(doc))
    return EXIT_OK if safe else EXIT_FAILED
