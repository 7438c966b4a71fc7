"""A no-change deploy.yml reads the host once per role (issue 20, section 5), and the reads
see what they claim to see: each drift planted here (a venv's marker emptied, a venv's
pdnode.pth removed, the configuration directory's mode and the service user's shell
changed, an engine stopped, a unit disabled, a worker taken out of the router through
its admin API) makes the deploy change something and repair it; a re-run then changes
nothing. Module calls are counted from Ansible's own record of the run (the
ansible.posix.json callback), as test_no_change_budget.py counts them. Leaves the node
converged (the last test is a no-change run).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from playbook_record import run_playbook
from test_no_change_budget import module_calls

CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")
PREFIX = "sglang-pd"
CFG = "/etc/sglang-pd"
ROUTER = "http://127.0.0.1:8000"
ADMIN_KEY_ON_HOST = f"{CFG}/router-admin-key"
# The plan's read of what the node runs (its layout record and measured starts, issue 45),
# the one read per role and the writer (pd_services_files keeps the digest logic).
NO_CHANGE_CALLS = [
    "Read the layout the node runs (its record) and its engines' measured starts",
    "pdnode.sglang_pd.sglang : Read what the release and the router's virtualenvs hold (one call)",
    "pdnode.sglang_pd.pd_services : Read what pd_services converges on the host (one call)",
    "pdnode.sglang_pd.pd_services : Write the ServerArgs, environment files, API key and units "
    "(units checked by systemd-analyze)",
]


def deploy(inventory, *args: str) -> dict:
    return run_playbook(inventory, "playbooks/deploy.yml", *args)


def changed(record: dict) -> int:
    return record["stats"][CONTAINER]["changed"]


def ran(record: dict) -> dict[str, dict]:
    """Task name -> this host's result, for the tasks that ran (not skipped)."""
    out = {}
    for play in record["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(CONTAINER)
            if result is not None and not result.get("skipped"):
                out[task["task"]["name"]] = result
    return out


def venv(host, unit: str) -> str:
    """The virtualenv a unit runs from (its ExecStart's python)."""
    exec_start = host.check_output(f"systemctl show -p ExecStart --value {unit}")
    return re.search(r"path=(\S+)/bin/python", exec_start).group(1)


def admin(host, method: str, path: str) -> tuple[int, str]:
    r = host.run(f"curl -sS --max-time 20 -X {method} -w '\\n%{{http_code}}' "
                 f"-H \"Authorization: Bearer $(cat {ADMIN_KEY_ON_HOST})\" '{ROUTER}{path}'")
    assert r.rc == 0, r.stderr
    body, _, code = r.stdout.rpartition("\n")
    return int(code), body


def workers(host) -> dict[str, dict]:
    code, body = admin(host, "GET", "/workers")
    assert code == 200, body
    return {w["url"]: w for w in json.loads(body)["workers"]}


@pytest.fixture(scope="module")
def converged(inventory):
    """The node as a deploy leaves it (the scenario's converge, or an earlier test's run)."""
    deploy(inventory)
    return inventory


def test_a_no_change_deploy_makes_four_module_calls(converged):
    record = deploy(converged)
    calls = module_calls(record, CONTAINER)
    print(f"\nmodule calls of a no-change deploy.yml: {calls}")
    assert changed(record) == 0, calls
    assert calls["host"] == NO_CHANGE_CALLS
    assert calls["controller"] == []


def test_a_venv_without_its_marker_or_bundle_is_repaired(converged, host):
    router_venv = venv(host, f"{PREFIX}-router.service")
    release_venv = venv(host, f"{PREFIX}-prefill-0.service")
    marker = host.file(f"{router_venv}/.pdnode-release").content_string
    pth = host.check_output(f"ls {release_venv}/lib/python3*/site-packages/pdnode.pth")
    bundle = host.file(pth).content_string
    host.run_expect([0], f": > {router_venv}/.pdnode-release && rm {pth}")
    record = deploy(converged)
    assert changed(record) > 0
    names = ran(record)
    assert "pdnode.sglang_pd.sglang : Install the bundle into the release and the router virtualenvs" in names
    assert host.file(f"{router_venv}/.pdnode-release").content_string == marker
    assert host.file(pth).content_string == bundle
    assert changed(deploy(converged)) == 0


def test_the_services_drifts_are_repaired(converged, host):
    user = host.check_output(f"systemctl show -p User --value {PREFIX}-router.service")
    host.run_expect([0], f"chmod 0755 {CFG} && usermod -s /bin/sh {user}")
    # prefill-0 stops its bound decode with it; decode-0 no longer starts at boot
    host.run_expect([0], f"systemctl stop {PREFIX}-prefill-0.service && systemctl disable {PREFIX}-decode-0.service")
    record = deploy(converged)
    assert changed(record) > 0
    names = ran(record)
    for task in ("Create the configuration directories", "Create the service user", "Enable the services and their target",
                 "Start what does not run, and name each service that did not start"):
        assert f"pdnode.sglang_pd.pd_services : {task}" in names, sorted(names)
    assert host.file(CFG).mode == 0o750
    assert host.user(user).shell == "/usr/sbin/nologin"
    for unit in ("prefill-0", "decode-0", "router"):
        assert host.service(f"{PREFIX}-{unit}.service").is_enabled
        assert host.service(f"{PREFIX}-{unit}.service").is_running
    assert changed(deploy(converged)) == 0


def test_a_worker_taken_out_of_the_router_is_put_back(converged, host):
    before = workers(host)
    url, decode = next((u, w) for u, w in before.items() if w["worker_type"] == "decode")
    code, body = admin(host, "DELETE", f"/workers/{decode['id']}")
    assert code in (200, 202, 204), body
    deadline = time.monotonic() + 60  # smg drops it within ~5 s (docs/smg.md)
    while url in workers(host) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert url not in workers(host)
    record = deploy(converged)
    assert changed(record) > 0
    result = ran(record)["pdnode.sglang_pd.pd_services : Put back every planned worker the router lacks"]
    assert result["changed"], result
    assert set(workers(host)) == set(before)
    assert changed(deploy(converged)) == 0

