"""A no-change site.yml on the deployed node (issue 20, section 5): it changes nothing and
does no more work than its budget. What a run costs is mostly its module calls (each one
a round trip to the host, or a process on the controller), so those are counted, from
Ansible's own record of the run (the ansible.posix.json callback): a task that ran a
module counts once, a loop once per item that ran; skipped tasks and the controller's
own actions (set_fact, assert, debug, ...) count nothing. The budgets come from the
profile in docs/measurements.md ("A no-change site.yml beside one peer service"); a new
task that every no-change run pays for has to be worth raising them.
How long the run takes is a benchmark (scripts/measure-site-peer), never asserted here.
"""

from __future__ import annotations

import json
import os

import pytest
from playbook_record import make_report_dirs, run_playbook

CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")
# Actions that run inside the controller's process: no module, no round trip.
IN_PROCESS = {"set_fact", "assert", "debug", "fail", "meta", "include_tasks", "include_role", "import_tasks",
              "import_role", "validate_argument_spec", "include_vars", "add_host", "group_by",
              # pdnode.sglang_pd.report_file: an action plugin that writes the controller's report itself
              "report_file"}
# Module calls of a no-change site.yml on the node scenario's instance (stand-in engine,
# API key, one host): on the host, and on the controller (delegate_to: localhost).
# Each role reads the host in one node_state call and converges only what differs (issue 20,
# section 5): preflight's probe, the firewall's, sglang's and pd_services' reads, the services'
# files, monitoring's read and the verification: 7; and the plan's read of the layout the
# node runs (its record, issue 45): 8.
HOST_CALLS_BUDGET = 8
CONTROLLER_CALLS_BUDGET = 0
# Tasks of a no-change site.yml, skipped ones included: each costs a worker process of its
# own even when it only says "skipping". Tasks that act only on a difference are grouped in
# files included only then (pd_services: account.yml, ports.yml, running.yml, orphans.yml),
# so a no-change run skips each group as one task. The model role (issue 44) costs a node
# without a model source two: its argument check and its one skipped include. Issue 45 three
# (counted on the scenario's node): the plan's read of the node's record of its layout (run
# where the plan is computed, skipped in a later play), and deploy.yml's refusal of a change
# that leaves a role at zero (an assert, in the controller's process).
TASKS_BUDGET = 64


def _short(action: str) -> str:
    return action.rsplit(".", 1)[-1]


def module_calls(record: dict, host: str) -> dict[str, list[str]]:
    """{"host": [task names], "controller": [task names]}: one entry per module call."""
    calls: dict[str, list[str]] = {"host": [], "controller": []}
    for play in record["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(host)
            if result is None or result.get("skipped") or _short(result["action"]) in IN_PROCESS:
                continue
            delegated = result.get("_ansible_delegated_vars") or {}
            where = "controller" if delegated.get("ansible_delegated_host") == "localhost" else "host"
            items = result.get("results")
            n = 1 if items is None else sum(1 for r in items if not r.get("skipped"))
            calls[where] += [task["task"]["name"]] * n
    return calls


def site_yml(inventory, *extra: str) -> dict:
    """One site.yml on the node; Ansible's JSON record of it."""
    return run_playbook(inventory, "site.yml", *extra)


@pytest.fixture(scope="module")
def no_change_run(inventory):
    make_report_dirs()
    return site_yml(inventory)


def test_a_no_change_site_yml_changes_nothing(no_change_run):
    stats = no_change_run["stats"][CONTAINER]
    assert (stats["changed"], stats["failures"], stats["unreachable"]) == (0, 0, 0), stats


def test_every_task_judging_agrees_with_the_one_call_reads(no_change_run, inventory):
    """The fast path's reads (node_state) found nothing to change on this node; with
    pdnode_fast_path false every role runs all its tasks, each module judging for itself.
    They must agree: nothing changes. (A read that missed something its role converges would
    show here as a change, on a node the fast run called converged.)"""
    full = site_yml(inventory, "--extra-vars", json.dumps({"pdnode_fast_path": False}))
    stats = full["stats"][CONTAINER]
    assert (stats["changed"], stats["failures"]) == (0, 0), stats
    fast, slow = (len(module_calls(run, CONTAINER)["host"]) for run in (no_change_run, full))
    print(f"\nmodule calls on the host: {fast} with the fast path, {slow} with every task judging")
    assert fast <= slow


def tasks_run(record: dict, host: str) -> list[str]:
    """The names of the tasks this host met in the run, skipped ones included."""
    return [task["task"]["name"] for play in record["plays"] for task in play["tasks"] if host in task["hosts"]]


def test_a_no_change_site_yml_stays_within_its_task_budget(no_change_run):
    names = tasks_run(no_change_run, CONTAINER)
    print(f"\ntasks of a no-change site.yml: {len(names)}")
    assert len(names) <= TASKS_BUDGET, names
    # the grouped converge tasks were skipped as groups, not one by one
    assert "pdnode.sglang_pd.pd_services : Create the service user" not in names
    assert "pdnode.sglang_pd.pd_services : Enable the services and their target" not in names


def test_a_no_change_site_yml_stays_within_its_module_call_budget(no_change_run):
    calls = module_calls(no_change_run, CONTAINER)
    print(f"\nmodule calls of a no-change site.yml: {len(calls['host'])} on the host, "
          f"{len(calls['controller'])} on the controller:\n  " + "\n  ".join(calls["host"] + calls["controller"]))
    assert len(calls["host"]) <= HOST_CALLS_BUDGET, calls["host"]
    assert len(calls["controller"]) <= CONTROLLER_CALLS_BUDGET, calls["controller"]
    # the count is of real work: the verification and the services' files are among it
    assert "Run the verification on the host" in calls["host"]
    assert any("pd_services : Write the ServerArgs" in name for name in calls["host"])
