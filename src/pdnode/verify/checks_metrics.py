"""metrics: every metric the checks and thresholds use exists on every engine instance of
its role (REQUIRED_METRICS in thresholds.py); a missing one is named with its instance,
what needs it and the closest names that instance exposes."""

from __future__ import annotations

from . import metrics as pm
from .base import FAIL, PASS, RUNBOOK, Ctx, Result
from ..core.inventory.thresholds import REQUIRED_METRICS


def check_metrics(ctx: Ctx) -> Result:
    after = ctx.snaps.get("completion_after", {})
    missing, present = [], 0
    for inst in ctx.t.instances:
        snap = after.get(inst.id)
        if not isinstance(snap, pm.Snapshot):
            return Result(FAIL, f"cannot read metrics: {snap}",
                          "enable metrics on every engine (enable_metrics: true)")
        for name, needed_by in REQUIRED_METRICS[inst.role].items():
            if snap.has(name):
                present += 1
                continue
            close = pm.close_names(name, snap.names())
            missing.append(f"{inst.id} lacks {name} (needed by {needed_by})"
                           + (f"; it exposes {', '.join(close)}" if close else ""))
    ctx.measurements["metrics_missing"] = missing
    if missing:
        return Result(FAIL, "; ".join(missing),
                      "the engine's metric names differ from the ones this verifier (and the dashboards) use: a "
                      "renamed metric in another SGLang version; update the names in pdnode/core/inventory/thresholds.py "
                      f"and templates/ together, or pin the SGLang version the plan names; {RUNBOOK}#metrics")
    ids = ", ".join(i.id for i in ctx.t.instances)
    return Result(PASS, f"all {present} metrics the checks and thresholds use exist on {ids}")
