"""What a planned change costs on a layout (issue 18, section 5): for each restart the
runbooks offer, whether requests are dropped, for how long at most, and where each figure
comes from. Pure: reads one host's plan (`Plan.as_dict()`) and the readiness timeout.

The rule: a planned restart of an engine instance drops nothing when another instance of
its role serves meanwhile (the instance is taken out of the router first, drained, then
restarted); the layout's only prefill or only decode cannot be replaced while it restarts,
so its restart is an outage. The one router's restart always is: clients connect to it.
But the router restarts only when the router itself changes: a layout change reaches it
through its admin API (its worker list), and it runs from a venv of its own, named by its
package and version, so an upgrade restarts every engine on the new release and leaves
the router running unless the router's package or version changes ("router-upgrade").
Each costs what the worst of its restarts costs.

The outage's length: from the moment the instance leaves the router, the wait for its
requests in flight (at most `pdnode_drain_timeout_s`), the prefill's wait for the decodes
to drop its old sessions (`restart_delay_s`, the plan's heartbeat figure) when it has one,
and its start-to-ready time, bounded by the readiness timeout (`pd_services_ready_timeout_s`:
past it the start fails). Measured start times are in docs/measurements.md (MEASURED names the rows);
with a real model they are minutes, and no real-model restart has been measured yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENGINE_ROLES = ("prefill", "decode")
# The extra variables that accept a change's or a restart's window (ansible-playbook -e
# takes JSON: a plain =true would be the string "true", which the plan refuses).
ACCEPT_WINDOW = '{"pdnode_allow_unavailable": true}'

# Rows of docs/measurements.md the pages quote: what was measured -> (the row's first cell,
# the figure as the row writes it); tests/test_change_cost.py checks each figure still
# stands in its row. Measured on the demo node (stand-in engines, smg 1.13.0) under load.
ROLLING_2P2D = "failed requests, rolling restart of every instance of 2P2D"
LONE_1P1D = "longest gap, restart of 1P1D's prefill (and its bound decode)"
SMG_DROP = "smg drops a worker removed through its admin API"
ROUTER_RESTART = "longest gap while the router restarts (an upgrade of its package)"
MEASURED = {
    ROLLING_2P2D: ("2P2D, rolling restart of every instance (`playbooks/restart.yml -e restart_instance=all`)",
                   "0 of 3,212"),
    LONE_1P1D: ("1P1D, restart of the prefill (its decode is bound to it: both leave and return)", "12.8 s"),
    SMG_DROP: ("1P1D, restart of the prefill (its decode is bound to it: both leave and return)",
               "~5 s after the DELETE"),
    ROUTER_RESTART: ("2P2D, upgrade changing the router package (smg 1.13.0 -> sglang-router 0.3.2)", "0.5 s"),
}


@dataclass(frozen=True)
class Cost:
    """One planned restart: what restarts, whether requests are dropped, why, and the
    longest outage in seconds the plan allows (None: no outage)."""

    what: str  # an instance id, "router", or "upgrade"
    units: tuple[str, ...]  # the units that restart
    drops: bool
    why: str
    outage_max_s: int | None


def _engines(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every engine instance of the layout (all hosts), id -> the cluster's entry."""
    return {iid: e for iid, e in plan["cluster"]["engines"].items() if e["role"] in ENGINE_ROLES}


def role_counts(plan: dict[str, Any]) -> dict[str, int]:
    engines = _engines(plan).values()
    return {role: sum(e["role"] == role for e in engines) for role in ENGINE_ROLES}


def instance_cost(plan: dict[str, Any], iid: str, ready_timeout_s: int, drain: bool = True) -> Cost:
    """A planned restart of engine instance `iid` (a service of this host's plan). `drain`:
    the restart takes the instance out of the router and waits for its requests first
    (without it, the requests in flight on it fail even where a peer serves)."""
    svc = plan["services"][iid]
    role = svc["role"]
    counts = role_counts(plan)
    upheld = tuple(svc.get("upholds") or ())
    units = (svc["unit"], *upheld)
    delay = int(svc.get("restart_delay_s") or 0)
    if counts[role] >= 2:
        others = counts[role] - 1
        serve = f"{others} other {role} instance{'s' if others > 1 else ''} serve{'s' if others == 1 else ''}"
        if not drain:
            return Cost(iid, units, True, f"{serve}, but the requests in flight on {iid} fail: nothing takes it "
                                          "out of the router first", None)
        return Cost(iid, units, False, f"{serve} while {iid} is out of the router", None)
    # the only instance of its role: nothing can take its work while it restarts;
    # the decodes bound to it restart after it, each with its own readiness gate
    chain = 1 + (1 if upheld else 0)
    drained = int(plan["settings"]["pdnode_drain_timeout_s"]) if drain else 0
    why = f"{iid} is the layout's only {role}"
    if upheld:
        ids = [sid for sid, s in plan["services"].items() if s["unit"] in upheld]
        why += f"; {', '.join(ids)} restart{'s' if len(ids) == 1 else ''} with it"
    return Cost(iid, units, True, why, drained + delay + chain * ready_timeout_s)


def router_cost(plan: dict[str, Any], ready_timeout_s: int) -> Cost:
    unit = plan["services"]["router"]["unit"]
    return Cost("router", (unit,), True, "the layout has one router: clients connect to it", ready_timeout_s)


def upgrade_cost(plan: dict[str, Any], ready_timeout_s: int, drain: bool = True, router: bool = False) -> Cost:
    """Every engine instance of this host restarts on the new release, one at a time; the
    router (where it runs here) only when ROUTER: the upgrade changes its package or
    version (otherwise its venv and unit stay as they are). The worst single restart is
    the outage."""
    upheld = {u for s in plan["services"].values() for u in s.get("upholds") or ()}
    # a decode bound to the node's one prefill restarts with it, not on its own
    engines = [iid for iid, s in plan["services"].items() if s["role"] in ENGINE_ROLES and s["unit"] not in upheld]
    parts = [instance_cost(plan, iid, ready_timeout_s, drain) for iid in engines]
    if router and "router" in plan["services"]:
        parts.append(router_cost(plan, ready_timeout_s))
    what = "router-upgrade" if router else "upgrade"
    dropping = [c for c in parts if c.drops]
    units = tuple(u for c in parts for u in c.units)
    if not dropping:
        return Cost(what, units, False, "every instance has a peer of its role serving while it restarts", None)
    why = "; ".join(c.why for c in dropping)
    outages = [c.outage_max_s for c in dropping if c.outage_max_s is not None]
    return Cost(what, units, True, why, max(outages) if outages else None)


def costs(plan: dict[str, Any], ready_timeout_s: int, drain: bool = True) -> dict[str, Cost]:
    """id -> Cost for every engine instance of this host, the router (when here), the
    upgrade and (when the router is here) the upgrade that changes the router: what the
    runbooks print."""
    out = {iid: instance_cost(plan, iid, ready_timeout_s, drain)
           for iid, s in plan["services"].items() if s["role"] in ENGINE_ROLES}
    if "router" in plan["services"]:
        out["router"] = router_cost(plan, ready_timeout_s)
    out["upgrade"] = upgrade_cost(plan, ready_timeout_s, drain)
    if "router" in plan["services"]:
        out["router-upgrade"] = upgrade_cost(plan, ready_timeout_s, drain, router=True)
    return out


def restart_refusal(plan: dict[str, Any], ids: list[str]) -> str | None:
    """playbooks/restart.yml's refusal (issue 45): one line when a restart of IDS (engine
    ids; those of another host are not this host's to restart) drops requests because an
    instance is its role's only one, unless pdnode_allow_unavailable accepts it; else None.
    The rule is instance_cost's (its outage bound is the runbooks'; not needed here)."""
    if plan["settings"].get("pdnode_allow_unavailable"):
        return None
    lone = [c for c in (instance_cost(plan, iid, 0) for iid in ids if iid in plan["services"]) if c.drops]
    if not lone:
        return None
    return (f"restarting {', '.join(c.what for c in lone)} leaves no instance of its role serving until it is back "
            f"({'; '.join(c.why for c in lone)}); nothing was stopped. Fix: add an instance of its role, or accept "
            f"the window with -e '{ACCEPT_WINDOW}'")


def upgrade_refused(plan: dict[str, Any]) -> bool:
    """Whether the plan refuses an upgrade or a new model commit of this layout unless
    pdnode_allow_unavailable accepts it: every engine restarts, and a role with one
    instance in the whole layout has none serving while it does (pdnode.core.plan.build's
    change.refusal; tests/test_layout_runs.py holds the two to each other)."""
    return not plan["settings"].get("pdnode_allow_unavailable") and 1 in role_counts(plan).values()
