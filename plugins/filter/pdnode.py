"""Ansible filters over the pdnode plan core. No rule lives here: see src/pdnode/core/plan/build.py."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from pdnode.node import unitcheck
    from pdnode.core.rules import guards, values
    from pdnode.core.plan.cluster import layout_view
    from pdnode.core.plan.build import PlanError, applied_dir, build_plan
    from pdnode.core.change import cost, identity, window
    from pdnode.core.inventory.fields import BY_NAME
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pdnode.node import unitcheck
    from pdnode.core.rules import guards, values
    from pdnode.core.plan.cluster import layout_view
    from pdnode.core.plan.build import PlanError, applied_dir, build_plan
    from pdnode.core.change import cost, identity, window
    from pdnode.core.inventory.fields import BY_NAME


def _site_variables(hostvars) -> dict:
    return {str(k): hostvars[k] for k in hostvars if str(k).startswith("pdnode_")}


class _Inventory(Mapping):
    """Every inventory host's pdnode_* variables, read from Ansible's hostvars only for
    the hosts a layout names (the plan reads their address and layout description)."""

    def __init__(self, hostvars):
        self._hostvars = hostvars

    def __getitem__(self, host):
        if host not in self._hostvars:
            raise KeyError(host)
        return _site_variables(self._hostvars[host])

    def __iter__(self):
        return iter(self._hostvars)

    def __len__(self):
        return len(list(self._hostvars))


def _running(variables, hostvars) -> tuple[dict, dict, dict, dict]:
    """(host -> the text of its record of the layout it runs, unit -> seconds its last
    start took, unit -> what its process runs: python and model_commit, host -> the units
    of the prefix it runs that its record does not name) from the hosts' reads
    (playbooks/tasks/plan.yml: _pdnode_running, the layout_read module's answer), for the
    hosts that have a record."""
    found, started, processes, strangers = {}, {}, {}, {}
    for name, hv in ((h, hostvars[h]) for h in hostvars) if hostvars is not None else (("", variables),):
        read = hv.get("_pdnode_running") if hasattr(hv, "get") else None
        if isinstance(read, Mapping) and read.get("content"):
            found[str(name)] = str(read["content"])
            started.update({str(u): float(s) for u, s in (read.get("started") or {}).items()})
            for unit, state in (read.get("units") or {}).items():
                if isinstance(state, Mapping) and (state.get("python") or unit not in processes):
                    processes[str(unit)] = {k: state.get(k) for k in ("python", "model_commit")}
            strangers[str(name)] = [str(u) for u in read.get("strangers") or []]
    return found, started, processes, strangers


def pdnode_node_read(plan, read, router) -> dict:
    """playbooks/read.yml's answer of one host (pdnode.core.change.identity.node_answer)."""
    return identity.node_answer(plan, read if isinstance(read, Mapping) else None,
                                router if isinstance(router, Mapping) and not router.get("skipped") else None)


def pdnode_change_measured(windows, taken, ended) -> list:
    """The pd_services handlers' report of the windows a layout change accepted: measured
    by the deploy's clock beside the plan's prediction (pdnode.core.change.window.measured)."""
    return window.measured(list(windows), list(taken), float(ended))


def pdnode_restart_refusal(plan, instance: str) -> str:
    """playbooks/restart.yml: '' or the one line refusing a restart of INSTANCE (an engine
    id, or "all": this host's engines) that leaves a role with no instance serving
    (pdnode.core.change.cost.restart_refusal)."""
    ids = [sid for sid in plan["services"] if sid != "router"] if instance == "all" else [str(instance)]
    return cost.restart_refusal(plan, ids) or ""


def pdnode_layout_read_spec(variables) -> dict:
    """The layout_read module's options for a host: where the deploy records the layout it
    runs (the plan's change.record_file) and the units' prefix; both "" for a prefix the
    plan refuses (in one line; nothing is read before)."""
    prefix = variables.get("pdnode_service_prefix") or BY_NAME["pdnode_service_prefix"].default
    if not isinstance(prefix, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,39}", prefix):
        return {"path": "", "prefix": ""}
    return {"path": f"{applied_dir(prefix)}/{identity.RECORD_FILE}", "prefix": prefix}


def pdnode_plan(variables, host: str = "node", hostvars=None, model_lock=None, inventory_dir=None) -> dict:
    """hostvars of one host (and of all hosts, for a layout spanning several) -> the
    validated plan of that host as a dict (see docs/architecture.md). ``model_lock``: the
    lock of the model commit an upgrade goes back to (else the inventory's lock file, in
    ``inventory_dir`` or the host's own inventory_dir)."""
    try:
        where = inventory_dir or (variables.get("inventory_dir") if hasattr(variables, "get") else None)
        plan = build_plan(_site_variables(variables), host, _Inventory(hostvars) if hostvars is not None else None,
                          str(where) if where else None, dict(model_lock) if model_lock else None,
                          *_running(variables, hostvars))
    except PlanError as exc:
        lines = "\n".join(f"  {p}" for p in exc.problems)
        raise AnsibleFilterError(f"the node description has {len(exc.problems)} problem(s):\n{lines}") from None
    return plan.as_dict()


def pdnode_layout_view(plan, hostvars) -> dict:
    """This host's plan with every engine instance of its layout (the other hosts'
    plans computed from hostvars): what the verifier on the router's host checks."""
    if not plan["cluster"]["multi_host"]:
        return plan
    plans = {h: (plan if h == plan["host"] else pdnode_plan(hostvars[h], h, hostvars)) for h in plan["cluster"]["hosts"]}
    return layout_view(plans, plan["host"])


def pdnode_exec_line(argv, prefix: str = "") -> str:
    """An argv list -> the value of a unit's Exec*= line (every argument double-quoted,
    '\\' '"' escaped, '%' and '$' doubled; pdnode.node.unitcheck.exec_line), one argument per
    continued line. The one place where values are written into a command line of a unit."""
    try:
        return unitcheck.exec_line(list(argv), prefix, sep=" \\\n    ")
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"pdnode_exec_line: {exc}") from None


def pdnode_key_file_problem(path: str) -> str:
    """'' when the controller's key file PATH is a readable, non-empty file, else one line
    naming it and the fix (pdnode.core.rules.guards.deploy_key_file_problem)."""
    return guards.deploy_key_file_problem(str(path))


def pdnode_role_value_problem(value, name: str) -> str:
    """'' when the role variable NAME may hold VALUE, else one line: "NAME must ... (got
    VALUE); fix: ..." (pdnode.core.rules.values.ROLE_RULES: the rules `pdnode check` applies too)."""
    return values.role_value_problem(name, value) or ""


def pdnode_role_value_problems(named) -> list[str]:
    """{NAME: VALUE, ...} of role variables -> one line per value that breaks its rule, in
    the order given (pdnode_role_value_problem's line); [] when every value keeps it."""
    return values.role_value_problems(dict(named))


class FilterModule:
    def filters(self):
        return {"pdnode_plan": pdnode_plan, "pdnode_layout_view": pdnode_layout_view,
                "pdnode_change_measured": pdnode_change_measured,
                "pdnode_exec_line": pdnode_exec_line, "pdnode_role_value_problem": pdnode_role_value_problem,
                "pdnode_key_file_problem": pdnode_key_file_problem,
                "pdnode_layout_read_spec": pdnode_layout_read_spec, "pdnode_node_read": pdnode_node_read,
                "pdnode_restart_refusal": pdnode_restart_refusal,
                "pdnode_role_value_problems": pdnode_role_value_problems}
