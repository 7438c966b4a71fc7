"""What both monitoring tests start from: the plan of a repository inventory, and promtool."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[2]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: it comes with Debian's `prometheus` package, listed in "
                    "scripts/lib/system-packages; run scripts/setup")
    return path


def plan_of(name: str) -> dict[str, Any]:
    """The plan of inventories/NAME; NAME+PACKAGE: with that router package (smg is the default)."""
    name, _, package = name.partition("+")
    hv = load_inventory(ROOT / "inventories" / name)
    variables = dict(hv.variables, **({"pdnode_router_package": package} if package else {}))
    plan = build_plan(variables, hv.host).as_dict()
    assert plan["install"]["router_package"] == (package or "smg")
    return plan
