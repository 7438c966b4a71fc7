"""How long a step of a change leaves a role with no instance serving (issue 45): the
expected start time of the instance that brings the role back.

The stand-in's start is its configured pdnode_sim_startup_s plus its gates; a real
engine's, with no node to measure, is an estimate from the model's size: its weights read
from local disk at LOAD_GB_S per GPU (each GPU reads its shard), then CUDA graphs captured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from . import layout_change as lc

LOAD_GB_S = 2.0
GRAPH_CAPTURE_S = 60.0
# The stand-in's start beyond its configured pdnode_sim_startup_s: the units' readiness
# gate and the router's health check (the demo node's measured starts).
STANDIN_OVERHEAD_S = 3.0


def start_estimate(settings: Mapping[str, Any], model: Mapping[str, Any], gpus: int) -> tuple[float | None, str]:
    """Seconds an instance on GPUS GPUs takes to start and serve, and where the figure comes from."""
    if settings.get("pdnode_engine") == "sim":
        return float(settings["pdnode_sim_startup_s"]) + STANDIN_OVERHEAD_S, \
            "the stand-in's pdnode_sim_startup_s + its gates"
    weights = ((model.get("facts") or {}).get("weight_bytes")
               or (settings.get("pdnode_model_weights_gb") or 0) * 1e9 or None)
    if not weights:
        return None, "unknown (no model size: pdnode_model_source's files or pdnode_model_weights_gb)"
    gpus = max(gpus, 1)
    return (weights / gpus / (LOAD_GB_S * 1e9) + GRAPH_CAPTURE_S,
            f"estimate: {weights / 1e9:.0f} GB over {gpus} GPU(s) at {LOAD_GB_S:g} GB/s + {GRAPH_CAPTURE_S:g} s")


def windows(change: lc.Plan, estimate: Callable[[str], tuple[float | None, str]]) -> list[dict[str, Any]]:
    """Each stretch of steps that leaves a role at zero: its steps and expected seconds
    (until a start or restart of that role serves again). ESTIMATE: new instance id ->
    (seconds, source)."""
    out: list[dict[str, Any]] = []
    for role in lc.ROLES:
        run: list[int] = []
        for i, step in enumerate((*change.steps, None)):
            if step is not None and role in step.at_zero:
                run.append(i)
                continue
            if run:
                back = [change.steps[j] for j in run if change.steps[j].action.kind in ("start", "restart")
                        and change.steps[j].action.role == role]
                estimates = [estimate(b.action.new) for b in back if b.action.new]
                seconds = max((e[0] for e in estimates if e[0] is not None), default=None)
                out.append({"role": role, "steps": [j + 1 for j in run], "expected_s": seconds,
                            "source": estimates[0][1] if estimates else "no start of the role in these steps"})
                run = []
    return out
