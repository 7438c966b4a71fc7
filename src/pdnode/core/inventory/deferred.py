"""Inventory values `pdnode check` does not compute: they need code run on the controller.

`pdnode check`, `render`, `explain` and `plan` read an inventory to review it, so they
run none of its code: no lookup (`lookup`, `query`, `q`: `pipe` runs a command, `file`
reads one), no filter or test from outside ansible-core (a collection's or a plugin
directory's Python), none of ansible-core's filters and tests that read the controller's
filesystem, no `{% include %}` / `{% import %}` / `{% extends %}` of a file
(pdnode.core.inventory.guard holds Ansible's templating to that). A value that needs one
of them is not computed: its variable holds a ``Deferred``, the value as written, and
the plan judges it here:

- a value that lands in a unit, an environment file, a command line or the engines'
  ServerArgs (every ``pdnode_*`` variable but DEPLOY_TIME_FIELDS, and the role variables
  of UNIT_ROLE_VARIABLES) is refused: check cannot show what would run;
- an unknown ``pdnode_*`` name is refused as unknown, its value shown as written;
- any other (connection variables, the site's own helpers, the other roles' variables,
  DEPLOY_TIME_FIELDS) gets a warning, "templated at deploy, not judged", and the plan is
  computed without it (its default).

ansible-playbook templates these values normally at deploy time (its own process; none
of this is active there), and the deploy's plan judges them then.
"""

from __future__ import annotations

from typing import Any

from .fields import BY_NAME, RETIRED_ROLE_VARIABLES


class Deferred(str):
    """A value not computed because it needs ``needs`` (e.g. ``lookup('pipe')``); the
    string is the value as the inventory writes it."""

    needs: str

    def __new__(cls, text: str, needs: str = "a lookup") -> Deferred:
        obj = super().__new__(cls, text)
        obj.needs = needs
        return obj

    def __reduce__(self) -> tuple:
        return Deferred, (str.__str__(self), self.needs)

    def __copy__(self) -> Deferred:
        return self

    def __deepcopy__(self, memo: Any) -> Deferred:
        return self


# pdnode_* variables that reach no unit, environment file, argv or ServerArgs: the plan
# reads them for its own judgement (capacity, the KV hand-off's cost), for the
# verification and the alert rules, or the deploy reads them on the controller (how a
# run converges, where wheels are, the driver branch the provision pins). A required
# variable is never one (the plan cannot do without it). tests/test_check_runs_no_code.py
# changes each and checks that no unit, argv, ServerArgs or environment changes, and that
# none is required.
DEPLOY_TIME_FIELDS = frozenset({
    "pdnode_fast_path", "pdnode_wheelhouse", "pdnode_driver_branch", "pdnode_kv_prompt_tokens",
    "pdnode_model_weights_gb", "pdnode_model_controller_path", "pdnode_model_kv_bytes_per_token",
    "pdnode_verify_prompt_words", "pdnode_verify_max_tokens", "pdnode_verify_burst_requests",
    "pdnode_verify_burst_concurrency", "pdnode_verify_timeout_s", "pdnode_verify_reference_prompt",
    "pdnode_verify_reference_answer", "pdnode_verify_thresholds",
})

# Role variables written into a unit or a unit's command line (roles/pd_services/templates/
# service.j2; roles/monitoring/templates/: the exporters' and Prometheus's ARGS and ExecStart).
UNIT_ROLE_VARIABLES = frozenset({
    "pd_services_limit_memlock", "pd_services_limit_nofile", "pd_services_ready_timeout_s",
    "pd_services_watchdog_s", "pd_services_device_policy",
    "monitoring_prometheus_listen_address", "monitoring_node_exporter_listen_address",
    "monitoring_dcgm_exporter_listen_address", "monitoring_retention_time",
})

REFUSED_RULE = ("needs {needs} to be computed, and pdnode check runs none of the inventory's code; the value "
                "reaches a unit, a command line or the engines' ServerArgs, so it must be known before a deploy")
REFUSED_FIX = "write the value itself (what the template gives), not the template"
WARNED_RULE = "templated at deploy, not judged: it needs {needs}, and pdnode check runs none of the inventory's code"
WARNED_FIX = "nothing, if only the deploy needs it; write the value itself for check to judge it"


def lands_in_unit(name: str) -> bool:
    """Whether variable NAME reaches a unit, an environment file, argv or ServerArgs (an
    unknown ``pdnode_*`` name reaches nothing: the plan refuses it as unknown)."""
    return (name in BY_NAME and name not in DEPLOY_TIME_FIELDS) or name in RETIRED_ROLE_VARIABLES \
        or name in UNIT_ROLE_VARIABLES


def leaves(value: Any, path: str) -> list[tuple[str, Deferred]]:
    """(path, value) of every Deferred in VALUE, paths as the plan's messages write them
    (``pdnode_prefill_instances[0].extra_args.dtype``)."""
    if isinstance(value, Deferred):
        return [(path, value)]
    if isinstance(value, dict):
        return [found for k, item in value.items() for found in leaves(item, f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [found for i, item in enumerate(value) for found in leaves(item, f"{path}[{i}]")]
    return []
