"""Ansible filters over pdnode.core.plan.monitoring (the monitoring role's files). No rule lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from pdnode.core.plan import monitoring
    from pdnode.core.plan.roles import monitoring as monitoring_role
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pdnode.core.plan import monitoring
    from pdnode.core.plan.roles import monitoring as monitoring_role


def _plain(value):
    """Ansible's tagged strings and containers as plain Python data (PyYAML refuses them)."""
    return json.loads(json.dumps(value))


def _call(function, *args, **kwargs):
    try:
        return function(*map(_plain, args), **{k: _plain(v) for k, v in kwargs.items()})
    except (monitoring.ScrapeConfigError, monitoring.TemplateError) as exc:
        raise AnsibleFilterError(str(exc)) from None


def pdnode_dcgm_counters(default_csv: str) -> str:
    """dcgm-exporter's default-counters.csv -> the counters the rules need."""
    return _call(monitoring.dcgm_counters, default_csv)


def pdnode_monitoring_facts(plan: dict) -> dict:
    """GPU host or not, the node exporter's flags, the rules file path, the job names."""
    return monitoring.role_facts(_plain(plan))


def pdnode_monitoring_files(plan: dict, **values) -> dict:
    """plan and the role's values -> the rules, the scrape configuration and node_state's
    specs of the files and directory the role writes (pdnode.core.plan.roles.monitoring.files)."""
    return _call(monitoring_role.files, plan, **values)


class FilterModule:
    def filters(self):
        return {"pdnode_dcgm_counters": pdnode_dcgm_counters, "pdnode_monitoring_facts": pdnode_monitoring_facts,
                "pdnode_monitoring_files": pdnode_monitoring_files}
