"""All roles' views of one host's plan: ``views(plan)`` -> ``plan["roles"]``."""

from __future__ import annotations

from typing import Any

from pdnode.core.plan.roles import firewall, model, pd_services


def views(plan: dict[str, Any]) -> dict[str, Any]:
    """PLAN (``Plan.as_dict()`` without ``roles``) -> each role's view, by role name."""
    return {"pd_services": pd_services.view(plan), "firewall": firewall.view(plan), "model": model.view(plan)}
