"""The pd_services role's view of the plan (filled in by the role's refactor)."""

from __future__ import annotations

from typing import Any


def view(plan: dict[str, Any]) -> dict[str, Any]:
    return {}
