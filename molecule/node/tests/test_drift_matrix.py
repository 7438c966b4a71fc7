"""The drift matrix (issue 27, item 6): every path the deploy's roles manage, changed by
hand, is restored by one deploy.yml, and so are the units' enablement and activity and
the router's worker list.

On a running node eight things were changed by hand and deploy.yml run again: seven were
restored, but the router's admin key, chowned to root, was not (the read looked for the
key by name only, and the key was written only when missing): the router then could not
start, and every deploy after that failed on it. A fast path sees only what it reads, so
the cases here are not written from memory: they are generated from the plan's list of
managed paths (`managed`, pdnode.core.plan.managed; tests/test_managed_paths.py holds that list
to what the roles' tasks and templates write), one case per path and per aspect a re-run
restores (its `restores`: content, mode, owner, group, presence). The drifts of one aspect
go in together, one deploy for all of them: no drift of a batch can hide another from its
judge (each path is judged on its own, by the read or by pd_services_files), while drifts
of different aspects could (a rewrite for a changed content also sets the mode), so each
aspect has its run. Whether a path is restored is read from the container itself (lstat,
owner and group names, SHA-256 of the content), never from Ansible's answer.

The units (the plan's services and their target) are disabled and the router's workers
taken out through its admin API in one run (the first is judged by the read's is-enabled
answers, the second by the reconcile check: neither sets off the other's repair); the
units are stopped in a run of their own (a start reconciles the router's workers anyway).
Leaves the node converged (the last test is a no-change run).
"""

from __future__ import annotations

import json
import os
import time

import pytest
from drift_cases import ASPECTS, cases, drift_command, drifted, expected_restores
from test_fast_path_deploy import admin, changed, deploy, workers

pytestmark = pytest.mark.repair  # scenario repair runs these (molecule/repair)

CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")
PLAN_TASK = "Compute and validate the plan (once per run)"
# The kinds of path the roles write (the list: files, directories, secrets, units,
# drop-ins, environment files, ServerArgs files; and the venvs' markers, the records of
# what each service was started with): each must be among the generated cases.
KINDS = {"directory", "config", "env", "unit", "drop-in", "secret", "record", "marker"}
# lstat, names and content digest of every path, read in the container (as root).
SNAPSHOT = r"""
import grp, hashlib, json, os, pwd, stat, sys
def name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)
out = {}
for path in json.loads(sys.argv[1]):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        out[path] = None
        continue
    kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    entry = {"kind": kind, "mode": "%04o" % stat.S_IMODE(st.st_mode), "owner": name(pwd.getpwuid, st.st_uid),
             "group": name(grp.getgrgid, st.st_gid)}
    if kind == "file":
        with open(path, "rb") as handle:
            entry["sha256"] = hashlib.sha256(handle.read()).hexdigest()
    out[path] = entry
print(json.dumps(out))
"""


def plan_of(record: dict) -> dict:
    """The plan the deploy itself computed (the fact its first task sets)."""
    for play in record["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(CONTAINER)
            if task["task"]["name"] == PLAN_TASK and result and "ansible_facts" in result:
                return result["ansible_facts"]["_pdnode_plan"]
    raise AssertionError(f"no {PLAN_TASK!r} result in the deploy's record")


def snapshot(host, paths: list[str]) -> dict[str, dict | None]:
    return json.loads(host.check_output("python3 -c %s %s", SNAPSHOT, json.dumps(paths)))


@pytest.fixture(scope="module")
def matrix(inventory, host):
    """The node as a deploy leaves it, the plan that deploy computed, and every managed
    path as it is then (each as the plan says)."""
    plan = plan_of(deploy(inventory))
    paths = [e["path"] for e in plan["managed"]]
    baseline = snapshot(host, paths)
    wrong = {e["path"]: baseline[e["path"]] for e in plan["managed"]
             if baseline[e["path"]] is None
             or baseline[e["path"]]["kind"] != ("directory" if e["kind"] == "directory" else "file")
             or any(baseline[e["path"]][k] != e[k] for k in ("mode", "owner", "group"))}
    assert wrong == {}, f"a converged node differs from the plan's managed paths: {wrong}"
    return {"inventory": inventory, "plan": plan, "baseline": baseline}


def test_the_cases_are_generated_from_the_plans_managed_paths(matrix):
    plan = matrix["plan"]
    generated = cases(plan)
    admin_key = plan["install"]["admin_key_path"]
    # the known miss of issue 27 cannot silently drop out of the matrix
    for aspect in ("owner", "group", "mode", "presence"):
        assert admin_key in [e["path"] for e in generated[aspect]], aspect
    assert KINDS <= {e["kind"] for e in plan["managed"]}, sorted({e["kind"] for e in plan["managed"]})
    for aspect in ("mode", "owner", "group"):
        assert len(generated[aspect]) == len(plan["managed"]), aspect  # every path has these three
    # per drift kind, the count the kinds of path ask for: a kind that shrinks fails here
    wants = {aspect: sum(aspect in expected_restores(plan, e) for e in plan["managed"]) for aspect in ASPECTS}
    counted = {aspect: len(entries) for aspect, entries in generated.items()}
    assert counted == wants, (counted, wants)
    units = units_of(plan)
    probe = plan["services"]["router"].get("pair_probe")
    assert (not probe or probe["timer"] in units) and plan["install"]["target"] in units
    print(f"\ndrift cases from {len(plan['managed'])} managed paths: {counted}; units: {len(units)} x "
          f"{len(UNIT_DRIFTS)} ({', '.join(UNIT_DRIFTS)}); the router's workers: {len(plan['cluster']['engines'])}")


@pytest.mark.parametrize("aspect", ASPECTS)
def test_every_drift_of_one_aspect_is_restored_by_one_deploy(matrix, host, aspect):
    plan, baseline = matrix["plan"], matrix["baseline"]
    entries = cases(plan)[aspect]
    paths = [e["path"] for e in entries]
    host.run_expect([0], "set -e; " + "; ".join(drift_command(aspect, e) for e in entries))
    planted = snapshot(host, paths)
    missed = [p for e, p in zip(entries, paths) if not drifted(aspect, e, baseline[p], planted[p])]
    assert missed == [], f"the {aspect} drift did not take on {missed}"

    # a line before the deploy too: on a busy machine it can outlast the stage's idle limit
    print(f"\n{aspect}: {len(entries)} paths drifted; the deploy starts", flush=True)
    start = time.monotonic()
    record = deploy(matrix["inventory"])
    took = time.monotonic() - start
    print(f"{aspect}: one deploy restored them in {took:.1f} s", flush=True)
    assert changed(record) > 0

    after = snapshot(host, [e["path"] for e in plan["managed"]])
    problems = {}
    for e in plan["managed"]:
        now, was = after[e["path"]], baseline[e["path"]]
        if now is None:
            problems[e["path"]] = "missing"
            continue
        wants = {"kind": "directory" if e["kind"] == "directory" else "file",
                 **{k: e[k] for k in ("mode", "owner", "group")}}
        # Content: as the converged node held it; the admin key's is made on the host (a new
        # one once it was removed, and with it the router's record of what it started with).
        renewed = aspect == "presence" and (e["path"] == plan["install"]["admin_key_path"] or e["kind"] == "record")
        if "sha256" in was and not renewed:
            wants["sha256"] = was["sha256"]
        differs = {k: (now.get(k), v) for k, v in wants.items() if now.get(k) != v}
        if differs:
            problems[e["path"]] = differs
    assert problems == {}, f"not restored after the {aspect} drift (what it is, what it should be): {problems}"
    if aspect == "presence":
        matrix["baseline"] = after

    # the services run what is on disk: the router (re)starts with its admin key as given
    # back (the failure: "cannot read secret file ... Permission denied")
    if aspect == "owner":
        router = plan["services"]["router"]["unit"]
        host.run_expect([0], f"systemctl restart {router}")
        assert host.service(router).is_running
    assert set(workers(host)) == {e["url"] for e in plan["cluster"]["engines"].values()}


# How a unit the roles enable drifts: each is planted on every unit in a run of its own
# (a start reconciles the router's workers anyway).
UNIT_DRIFTS = ("disabled", "stopped", "masked")


def units_of(plan: dict) -> list[str]:
    """Every unit the role enables and keeps running: the services, the probe's timer, the
    target (the role's own list: plan.roles.pd_services.enable)."""
    return plan["roles"]["pd_services"]["enable"]


def test_disabled_units_and_workers_taken_out_of_the_router_are_restored(matrix, host):
    plan = matrix["plan"]
    units = units_of(plan)
    planned = {e["url"] for e in plan["cluster"]["engines"].values()}
    host.run_expect([0], "systemctl disable " + " ".join(units))
    for worker in workers(host).values():
        code, body = admin(host, "DELETE", f"/workers/{worker['id']}")
        assert code in (200, 202, 204), body
    deadline = time.monotonic() + 60  # smg drops them within ~5 s (docs/smg.md)
    while set(workers(host)) & planned and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(workers(host)) & planned
    assert all(not host.service(u).is_enabled for u in units)
    start = time.monotonic()
    record = deploy(matrix["inventory"])
    print(f"\n{len(units)} units disabled and {len(planned)} workers taken out: restored in "
          f"{time.monotonic() - start:.1f} s")
    assert changed(record) > 0
    assert [u for u in units if not host.service(u).is_enabled] == []
    assert set(workers(host)) == planned


def test_stopped_units_are_started(matrix, host):
    plan = matrix["plan"]
    units = units_of(plan)
    host.run_expect([0], "systemctl stop " + " ".join(units))
    assert [u for u in units if host.service(u).is_running] == []
    start = time.monotonic()
    record = deploy(matrix["inventory"])
    print(f"\n{len(units)} units stopped: started again in {time.monotonic() - start:.1f} s")
    assert changed(record) > 0
    assert [u for u in units if not host.service(u).is_running] == []
    assert set(workers(host)) == {e["url"] for e in plan["cluster"]["engines"].values()}


def test_masked_units_are_given_back(matrix, host):
    """A unit whose file is in /etc cannot be masked by systemctl (it refuses a link over an
    existing file; a --runtime link in /run is shadowed by the file in /etc): masking one by
    hand replaces its file by a link to /dev/null, which is what systemctl then reports as
    masked. One deploy writes each file back (it judges the path, not the link's target),
    reloads and leaves every unit enabled and running."""
    plan = matrix["plan"]
    units = units_of(plan)
    paths = " ".join(f"/etc/systemd/system/{u}" for u in units)
    host.run_expect([0], f"for f in {paths}; do ln -sfn /dev/null \"$f\"; done && systemctl daemon-reload")
    assert [u for u in units if host.check_output(f"systemctl is-enabled {u} || true") != "masked"] == []
    start = time.monotonic()
    record = deploy(matrix["inventory"])
    print(f"\n{len(units)} units masked: given back in {time.monotonic() - start:.1f} s")
    assert changed(record) > 0
    assert [u for u in units if host.check_output(f"systemctl is-enabled {u} || true") != "enabled"] == []
    assert [u for u in units if not host.service(u).is_running] == []
    files = [f"/etc/systemd/system/{u}" for u in units]
    assert snapshot(host, files) == {f: matrix["baseline"][f] for f in files}
    assert set(workers(host)) == {e["url"] for e in plan["cluster"]["engines"].values()}


def test_after_the_matrix_a_deploy_changes_nothing(matrix, host):
    record = deploy(matrix["inventory"])
    assert changed(record) == 0
    after = snapshot(host, [e["path"] for e in matrix["plan"]["managed"]])
    assert after == matrix["baseline"]
