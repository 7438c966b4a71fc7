"""How long the steps of a change that leave a role with no instance serving last (issue
45): the window a deploy refuses without pdnode_allow_unavailable, and predicts with it.

A role is at zero from the moment its last instance leaves the router (the first step of
the run: the drain takes it out, waits for its requests and for the router to drop it,
then stops it) until an instance of the role is back in the router (the run's last step:
a start, ready, then added). A run's window is the sum of its steps, the deploy taking
them one at a time:

- a stop: the router's drop of a removed worker (ROUTER_DROP_S, measured per router
  package) and the unit's stop (UNIT_STOP_S);
- a restart: a stop, then a start;
- a start: for a prefill of several that ran before under its name, the wait
  until every decode has dropped it (the plan's restart_delay_s, from the heartbeat
  settings); its start to ready; its addition to the router (JOIN_S).

A start's time is the node's own where it has one: systemd's record of how long the same
unit, or else the slowest running instance of the role, took to start the last time (read
by playbooks/tasks/plan.yml with the record). Without a node: the stand-in's configured
start plus its gates, or a real engine's estimate from the model's size (its weights read
from local disk at LOAD_GB_S per GPU, then CUDA graphs captured).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from . import layout_change as lc

LOAD_GB_S = 2.0
GRAPH_CAPTURE_S = 60.0
# The stand-in's start beyond its configured pdnode_sim_startup_s: the unit's readiness
# gate (measured starts of 1 s stand-ins: 1.5-1.7 s).
STANDIN_GATE_S = 0.7
# A ready instance's addition to the router (pdnode.node.drain in) and its first answer.
JOIN_S = 1.0
# A stopped engine's exit (the stand-in's measured stops: 0.1-0.9 s).
UNIT_STOP_S = 1.0
# How long a router keeps routing to a worker removed through its admin API: smg 1.13
# drops it about 5 s after the DELETE (docs/measurements.md, "smg drops a worker removed
# through its admin API"); sglang-router at once.
ROUTER_DROP_S = {"smg": 5.0, "sglang-router": 0.0}


def start_estimate(settings: Mapping[str, Any], model: Mapping[str, Any], gpus: int,
                   measured: tuple[float, str] | None = None) -> tuple[float | None, str]:
    """Seconds an instance on GPUS GPUs takes from its start to ready, and where the figure
    comes from. MEASURED: (seconds, what) the node recorded, which wins."""
    if measured is not None:
        return measured[0], f"measured on the node: {measured[1]}"
    if settings.get("pdnode_engine") == "sim":
        return float(settings["pdnode_sim_startup_s"]) + STANDIN_GATE_S, \
            "the stand-in's pdnode_sim_startup_s + its gate"
    weights = ((model.get("facts") or {}).get("weight_bytes")
               or (settings.get("pdnode_model_weights_gb") or 0) * 1e9 or None)
    if not weights:
        return None, "unknown (no model size: pdnode_model_source's files or pdnode_model_weights_gb)"
    gpus = max(gpus, 1)
    return (weights / gpus / (LOAD_GB_S * 1e9) + GRAPH_CAPTURE_S,
            f"estimate: {weights / 1e9:.0f} GB over {gpus} GPU(s) at {LOAD_GB_S:g} GB/s + {GRAPH_CAPTURE_S:g} s")


def stop_seconds(router_package: str) -> float:
    return ROUTER_DROP_S.get(router_package, 0.0) + UNIT_STOP_S


def windows(change: lc.Plan, start: Callable[[str], tuple[float | None, str]], stop_s: float,
            hold: Callable[[lc.Action], float]) -> list[dict[str, Any]]:
    """Each run of steps in a row that leaves a role at zero: its steps (1-based) and
    expected seconds (the module doc), with where the start figure comes from. START: new
    instance id -> (seconds, source); HOLD: a start's wait before it may start."""
    out: list[dict[str, Any]] = []
    for role in lc.ROLES:
        run: list[int] = []
        for i, step in enumerate((*change.steps, None)):
            if step is not None and role in step.at_zero:
                run.append(i)
                continue
            if run:
                total: float | None = 0.0
                sources: list[str] = []
                for j in run:
                    a = change.steps[j].action
                    if a.kind == "stop":
                        total = None if total is None else total + stop_s
                        continue
                    seconds, source = start(a.new) if a.new else (None, "")
                    sources.append(source)
                    away = stop_s if a.kind == "restart" else 0.0  # a restart leaves first, as a stop
                    total = None if total is None or seconds is None else total + away + hold(a) + seconds + JOIN_S
                out.append({"role": role, "steps": [j + 1 for j in run],
                            "expected_s": round(total, 1) if total is not None else None,
                            "source": sources[0] if sources else "no start of the role in these steps"})
                run = []
    return out


def measured(windows: list[Mapping[str, Any]], taken: list[Any], ended: float) -> list[str]:
    """The deploy's report of each window it ran (pdnode_allow_unavailable accepted them):
    WINDOWS as the pd_services view gives them (role, expected_s, and the steps as the
    handlers take them: kind stop or restart, id), TAKEN the handlers' [kind, id, began]
    of each step they took, in order, ENDED when the last one ended. A window lasts from
    the beginning of its first step to the end of its last (the next step's beginning):
    the drain that took the role's last instance out, to the join that brought one back."""
    began = [float(t[2]) for t in taken] + [float(ended)]
    at = {(str(t[0]), str(t[1])): i for i, t in enumerate(taken)}  # the last taking of a step
    lines = []
    for w in windows:
        mine = sorted(at[(s["kind"], s["id"])] for s in w["steps"] if (s["kind"], s["id"]) in at)
        predicted = f"{w['expected_s']:.1f} s" if w["expected_s"] is not None else "unknown"
        if not mine:
            lines.append(f"window without a {w['role']}: predicted {predicted}; not measured here (its steps "
                         "ran on another host)")
            continue
        seconds = began[mine[-1] + 1] - began[mine[0]]
        lines.append(f"window without a {w['role']}: measured {seconds:.1f} s by the deploy (from {taken[mine[0]][0]} "
                     f"{taken[mine[0]][1]} to {taken[mine[-1]][0]} {taken[mine[-1]][1]} done), predicted {predicted}")
    return lines
