"""Ansible filters over the pdnode plan core. No rule lives here: see scripts/pdnode/plan.py."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from pdnode.plan import PlanError, build_plan
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from pdnode.plan import PlanError, build_plan


def _site_variables(hostvars) -> dict:
    return {str(k): hostvars[k] for k in hostvars if str(k).startswith("pdnode_")}


def pdnode_plan(hostvars, host: str = "node") -> dict:
    """hostvars of one host -> the validated plan as a dict (see docs/architecture.md)."""
    try:
        plan = build_plan(_site_variables(hostvars), host)
    except PlanError as exc:
        lines = "\n".join(f"  {p}" for p in exc.problems)
        raise AnsibleFilterError(f"the node description has {len(exc.problems)} problem(s):\n{lines}") from None
    return plan.as_dict()


class FilterModule:
    def filters(self):
        return {"pdnode_plan": pdnode_plan}
