"""The pd_services role's view of the plan (pdnode.core.plan.roles.pd_services) and the run-time
rules its modules answer with (pd_services_files: the orphans and the restart set;
node_state: what differs, by kind): the cases the role's Jinja used to handle.

That the files the role writes stay byte for byte what the role wrote before the view is
held by the tests that render them with Ansible (test_unit_argv, test_plan_facts,
test_managed_paths) and by the molecule scenarios."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
from ansible.plugins.filter.core import to_nice_json
from module_runner import load_module
from planvars import changed, variables

from pdnode.core.inventory.read import inventory_variables
from pdnode.core.plan.build import build_plan
from pdnode.core.plan.roles.pd_services import nice_json

ROOT = Path(__file__).resolve().parents[1]
FILES_MODULE = load_module(ROOT / "plugins" / "modules" / "pd_services_files.py")
STATE_MODULE = load_module(ROOT / "plugins" / "modules" / "node_state.py")


def _view(changes: dict[str, Any] | None = None, inventory: str = "demo") -> dict[str, Any]:
    return build_plan(changed(variables(inventory), changes or {}), "node").as_dict()["roles"]["pd_services"]


def _value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "float", "str", "bool", "none"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-10**12, 10**12)
    if kind == "float":
        return rng.uniform(-1e6, 1e6)
    if kind == "str":
        return "".join(rng.choice("aZ09 _-./:\"\\\n\té€😀") for _ in range(rng.randint(0, 12)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{rng.randint(0, 99)}": _value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def test_the_json_is_ansibles_to_nice_json_over_generated_values():
    rng = random.Random(43)  # noqa: S311 - generated test values, not secrets
    for _ in range(500):
        value = {f"k{i}": _value(rng) for i in range(rng.randint(0, 6))}
        assert nice_json(value) == to_nice_json(value, sort_keys=True)


def test_every_file_kind_with_the_managed_mode_and_owners():
    plan = build_plan(variables("demo"), "node").as_dict()
    view = plan["roles"]["pd_services"]
    managed = {m["path"]: m for m in plan["managed"] if m["role"] == "pd_services"}
    kinds = {f["kind"] for f in view["files"]}
    assert kinds == {"config", "env", "unit", "drop-in", "state"}
    for f in view["files"]:
        assert (f["mode"], f["owner"], f["group"]) == tuple(managed[f["path"]][k] for k in ("mode", "owner", "group"))
        assert (f["content"] is None) != (f["template"] is None), f["path"]
        assert f["unit"] == (f["kind"] in ("unit", "drop-in"))
        # every file a person opens says who manages it; the JSON files (arguments, the layout
        # record) cannot carry a comment
        assert f["header"] == (f["kind"] not in ("config", "state")), f["path"]
    # the one template: the services' units (they take the role's own settings)
    assert {f["template"] for f in view["files"]} == {None, "service.j2", "pair_probe.service.j2"}
    # every managed file but the keys and records is written by the module (the directories
    # by account.yml, the records by the module's own digests, the admin key on the host)
    listed = {f["path"] for f in view["files"]}
    assert {p for p, m in managed.items() if m["kind"] not in ("directory", "record", "secret")} == listed
    # each service's JSON is its arguments; the router's digest leaves out its workers
    router = next(f for f in view["files"] if f["path"] == plan["services"]["router"]["config"])
    assert json.loads(router["content"]) == plan["services"]["router"]["args"]
    live = plan["services"]["router"]["live_args"]
    assert live and not set(json.loads(router["digest"])) & set(live)
    assert all(f["digest"] is None for f in view["files"] if f is not router)


def test_a_file_the_plan_does_not_manage_is_a_defect_here():
    from pdnode.core.plan.roles import pd_services
    plan = build_plan(variables("demo"), "node").as_dict()
    with pytest.raises(KeyError, match="not among the plan's managed paths"):
        pd_services._file({}, "/etc/x", "config", content="")
    assert pd_services.files(plan, {m["path"]: m for m in plan["managed"]})


def test_without_a_key_file_no_secret_and_no_key_input():
    view = _view({"pdnode_api_key_file": None})
    assert view["secret_files"] == []
    assert all(not i["path"].endswith("/api-key") for i in view["inputs"])
    assert all(spec["api_key_file"] is None for spec in view["drain"].values())


def test_with_a_key_file_every_service_reads_it():
    view = _view({"pdnode_api_key_file": "molecule/node/files/test-api-key"})
    [secret] = view["secret_files"]
    ids = ["prefill-0", "decode-0", "router"]
    assert secret["roles"] == ids and secret["mode"] == "0400" and secret["validate"][-1] == "%s"
    assert {"path": secret["path"], "roles": ids} in view["inputs"]
    assert all(spec["api_key_file"] == secret["path"] for spec in view["drain"].values())


def test_the_engines_read_the_release_venv_and_the_router_its_own():
    view = _view()
    by_path = {i["path"]: i["roles"] for i in view["inputs"]}
    engines = view["restart"]["engines"]
    assert engines == ["prefill-0", "decode-0"]
    venv = build_plan(variables("demo"), "node").as_dict()["install"]["venv"]
    assert by_path[f"{venv}/.pdnode-release"] == engines
    assert [r for p, r in by_path.items() if "/router-" in p and p.endswith(".pdnode-release")] == [["router"]]


def test_a_router_on_another_host():
    peers = inventory_variables(ROOT / "inventories/demo-cluster")
    router_host = next(h for h in peers if h.endswith("router"))
    for host in peers:
        view = build_plan(peers[host], host, peers).as_dict()["roles"]["pd_services"]
        assert view["router_host"] == router_host
        if host != router_host:
            assert not view["router"] and view["admin_key_files"] == []
            assert "reconcile" not in view["read_commands"] and view["reconcile_spec"] is None
            assert view["probe"] is None and view["enable"] == view["units"] + [view["target"]]
            assert not any(i["roles"] == ["router"] for i in view["inputs"])
            assert view["start"]["after"] == [view["target"]] and view["start"]["others"] == []
            assert view["admin_key_argv"] is None
        else:
            [key] = view["admin_key_files"]
            assert view["router"] and key["path"].endswith("/router-admin-key") and key["mode"] == "0400"
            assert view["read_commands"]["reconcile"]["json"] is True
            assert view["admin_key_argv"][2:] == [key[k] for k in ("path", "owner", "group", "mode")]


def test_the_pair_probe_off():
    on, off = _view(), _view({"pdnode_pair_probe_interval_s": 0})
    assert on["start"]["after"] == [on["router_unit"], on["probe"]["timer"], on["target"]]
    assert off["start"]["after"] == [off["router_unit"], off["target"]]
    assert on["probe"] and on["enable"] == on["units"] + [on["probe"]["timer"], on["target"]]
    assert off["probe"] is None and off["enable"] == off["units"] + [off["target"]]
    assert off["enable"] == off["units"] + [off["target"]]
    assert not any("pair-probe" in f["path"] for f in off["files"])
    assert not any("pair-probe" in u for u in off["orphans"]["keep"])


def test_the_node_s_one_prefill_drains_with_its_bound_decodes():
    view = _view(inventory="gpu01-1p2d")
    assert view["restart"]["bound"] == ["decode-0", "decode-1"]
    assert [w["id"] for w in view["drain"]["prefill-0"]["workers"]] == ["prefill-0", "decode-0", "decode-1"]
    assert [w["id"] for w in view["drain"]["decode-1"]["workers"]] == ["decode-1"]
    assert view["start"]["hold"] == [] and view["services"]["prefill-0"]["hold"] is None
    several = _view(inventory="gpu01-2p1d")
    assert several["restart"]["bound"] == [] and \
        [w["id"] for w in several["drain"]["prefill-0"]["workers"]] == ["prefill-0"]
    # one of several prefills waits until every decode dropped it, before a start and a restart
    hold = several["services"]["prefill-1"]["hold"]
    plan = build_plan(changed(variables("gpu01-2p1d"), {}), "node").as_dict()
    assert hold[-3:] == ["hold", "sglang-pd-prefill-1.service", str(plan["services"]["prefill-1"]["restart_delay_s"])]
    assert {"unit": "sglang-pd-prefill-1.service", "argv": hold} in several["start"]["hold"]


# --- the texts the plan gives (byte for byte what the role's templates wrote) -------------

def test_the_environment_file_is_sorted_as_jinjas_dictsort():
    from pdnode.core.plan.roles.pd_services import environment_text
    assert environment_text({"b": "2", "A": "1", "MC_X": "x y"}) == "A=1\nb=2\nMC_X=x y\n"
    assert environment_text({}) == ""


@pytest.mark.parametrize("svc, lines", [
    ({"upholds": ["u-d0.service", "u-d1.service"], "restart_delay_s": None, "bound_to": None},
     ["[Unit]", "Upholds=u-d0.service u-d1.service"]),
    ({"upholds": [], "restart_delay_s": 11, "bound_to": None}, ["[Unit]", "[Service]", "RestartSec=11"]),
    ({"upholds": [], "restart_delay_s": None, "bound_to": "u-p0.service"},
     ["[Unit]", "BindsTo=u-p0.service", "PartOf=u-p0.service", "After=u-p0.service"]),
])
def test_the_coupling_drop_in(svc, lines):
    from pdnode.core.plan.roles.pd_services import coupling_text
    text = coupling_text(svc)
    assert [line for line in text.splitlines() if not line.startswith("#")] == lines and text.endswith("\n")


def test_the_router_waits_for_the_workers_on_its_host_only():
    from pdnode.core.plan.roles.pd_services import workers_text
    assert "Wants=a.service b.service\nAfter=a.service b.service\n" in workers_text(["a.service", "b.service"])
    assert "[Unit]" not in workers_text([])


def test_the_target_and_the_probe_timer():
    from pdnode.core.plan.roles.pd_services import target_text, timer_text
    target = target_text(["a.service", "b.service"], "m")
    assert "Description=SGLang prefill/decode node (m)" in target and target.endswith("WantedBy=multi-user.target")
    assert "Wants=a.service b.service\nAfter=a.service b.service\n" in target
    timer = timer_text({"interval_s": 45, "service": "p.service"}, "t.target")
    assert "OnUnitInactiveSec=45\n" in timer and "Unit=p.service\n" in timer and timer.endswith("WantedBy=t.target")


# --- pd_services_files: the units the plan no longer has ------------------------------------

RULE = {"unit_dir": "/etc/systemd/system", "prefix": "sglang-pd", "config_dir": "/etc/sglang-pd",
        "applied_dir": "/var/lib/pdnode/applied/sglang-pd",
        "own_pattern": _view()["orphans"]["own_pattern"], "engine_pattern": _view()["orphans"]["engine_pattern"],
        "keep": ["sglang-pd-prefill-0.service", "sglang-pd-decode-0.service", "sglang-pd-router.service",
                 "sglang-pd-pair-probe.service", "sglang-pd-pair-probe.timer"]}


@pytest.mark.parametrize("unit, orphan", [
    ("sglang-pd-prefill.service", True),  # the one-instance releases' name
    ("sglang-pd-decode.service", True),
    ("sglang-pd-decode-1.service", True),  # an instance the layout dropped
    ("sglang-pd-prefill-a7.service", True),
    ("sglang-pd-pair-probe.service", False),  # planned
    ("sglang-pd-decode-0.service", False),
    ("sglang-pd-router.service", False),  # the router is never an orphan by name
    ("sglang-pd.target", False),
    ("other-pd-decode-1.service", False),  # another prefix: not ours
    ("sglang-pd-decode-1.service.d", False),
    ("sglang-pd-decode-X.service", False),
])
def test_each_naming_form_of_an_orphan_unit(unit, orphan):
    gone, remove = FILES_MODULE.orphans(RULE, set(), [unit, *RULE["keep"]], {})
    assert gone["units"] == ([unit] if orphan else [])
    if orphan:
        name = unit.removeprefix("sglang-pd-").removesuffix(".service")
        assert remove == [f"/etc/systemd/system/{unit}", f"/etc/sglang-pd/{name}.json", f"/etc/sglang-pd/{name}.env",
                          f"/var/lib/pdnode/applied/sglang-pd/{name}.sha256"]
        assert gone["stop"] == [unit] and gone["any"]


def test_the_probe_s_units_are_orphans_once_the_plan_drops_the_probe():
    rule = {**RULE, "keep": RULE["keep"][:3]}
    gone, _ = FILES_MODULE.orphans(rule, set(), ["sglang-pd-pair-probe.service", "sglang-pd-pair-probe.timer"], {})
    assert gone["units"] == ["sglang-pd-pair-probe.service", "sglang-pd-pair-probe.timer"]


def test_an_engine_unit_running_without_its_file_is_stopped():
    loaded = {"sglang-pd-decode-1.service": "active", "sglang-pd-decode-2.service": "inactive",
              "sglang-pd-decode-0.service": "active", "sglang-pd-router.service": "active"}
    gone, remove = FILES_MODULE.orphans(RULE, set(), list(RULE["keep"]), loaded)
    assert gone["units"] == [] and remove == []
    assert gone["running"] == gone["stop"] == ["sglang-pd-decode-1.service"] and gone["any"]


def test_a_coupling_drop_in_the_plan_no_longer_writes_is_removed(tmp_path):
    rule = {**RULE, "unit_dir": str(tmp_path)}
    for unit in ("sglang-pd-prefill-0.service", "sglang-pd-decode-0.service"):
        (tmp_path / f"{unit}.d").mkdir()
        (tmp_path / f"{unit}.d" / "10-coupling.conf").write_text("[Unit]\n")
    planned = {str(tmp_path / "sglang-pd-decode-0.service.d" / "10-coupling.conf")}
    gone, remove = FILES_MODULE.orphans(rule, planned, ["sglang-pd-prefill-0.service", "sglang-pd-decode-0.service"],
                                        {})
    assert not gone["any"]
    assert remove == [str(tmp_path / "sglang-pd-prefill-0.service.d" / "10-coupling.conf")]


# --- pd_services_files: the restart set and its order ---------------------------------------

ONE_PREFILL = {"engines": ["prefill-0", "decode-0", "decode-1"], "prefills": ["prefill-0"],
               "bound": ["decode-0", "decode-1"], "router": True}
TWO_PREFILLS = {"engines": ["prefill-0", "prefill-1", "decode-0"], "prefills": ["prefill-0", "prefill-1"],
                "bound": [], "router": True}


@pytest.mark.parametrize("rule, stale, flags, want", [
    (ONE_PREFILL, [], {}, {"engines": [], "router": False, "record": []}),
    # the one prefill restarts its bound decodes with it (BindsTo=): they are not drained twice
    (ONE_PREFILL, ["decode-1", "prefill-0"], {},
     {"engines": ["prefill-0"], "router": False, "record": ["prefill-0", "decode-1", "decode-0"]}),
    (ONE_PREFILL, ["decode-1"], {}, {"engines": ["decode-1"], "router": False, "record": ["decode-1"]}),
    (ONE_PREFILL, [], {"release_changed": True},
     {"engines": ["prefill-0"], "router": False, "record": ["prefill-0", "decode-0", "decode-1"]}),
    (TWO_PREFILLS, ["decode-0", "prefill-1", "router"], {},
     {"engines": ["prefill-1", "decode-0"], "router": True, "record": ["prefill-1", "decode-0", "router"]}),
    (TWO_PREFILLS, [], {"router_venv_changed": True}, {"engines": [], "router": True, "record": ["router"]}),
    # a router on another host: its venv is not this host's to restart
    ({**TWO_PREFILLS, "router": False}, ["router"], {"router_venv_changed": True},
     {"engines": [], "router": False, "record": []}),
])
def test_the_restart_set_in_start_order(rule, stale, flags, want):
    steps = [{"kind": "restart", "id": e} for e in want["engines"]]
    assert FILES_MODULE.restart_plan(rule, stale, **flags) == {**want, "steps": steps}


def test_a_layout_change_s_steps_come_first_in_its_order_then_the_other_restarts():
    """The plan's change on this host (pdnode.core.change.identity): its stops always (a
    stop of a stopped unit is nothing), its starts and restarts only where the files
    differ from what runs (a rerun after an interruption starts nothing twice)."""
    rule = {**TWO_PREFILLS, "engines": ["prefill-0", "prefill-1", "prefill-2", "decode-0"],
            "change": [{"kind": "stop", "id": "decode-1"}, {"kind": "start", "id": "prefill-2"},
                       {"kind": "stop", "id": "prefill-9"}, {"kind": "restart", "id": "prefill-1"}]}
    got = FILES_MODULE.restart_plan(rule, ["decode-0", "prefill-2"])
    assert got["steps"] == [{"kind": "stop", "id": "decode-1"}, {"kind": "restart", "id": "prefill-2"},
                            {"kind": "stop", "id": "prefill-9"}, {"kind": "restart", "id": "decode-0"}]
    assert got["engines"] == ["prefill-2", "decode-0"]


def test_the_view_s_restart_rule_is_the_plan_s_order():
    view = _view(inventory="gpu01-2p1d")
    assert view["restart"]["engines"] == ["prefill-0", "prefill-1", "decode-0"]
    assert view["units"] == [f"sglang-pd-{s}.service" for s in view["restart"]["engines"] + ["router"]]
    assert view["restart"]["prefills"] == ["prefill-0", "prefill-1"]


# --- node_state: what differs, by kind -----------------------------------------------------

@pytest.mark.parametrize("got, differs", [
    ({"rc": 0, "stdout": "", "stderr": ""}, False),
    ({"rc": 1, "stdout": "port 8000 is held by nginx\n", "stderr": ""}, True),
    ({"rc": 127, "stdout": "", "stderr": "env: 'python': No such file or directory\n"}, True),
    ({"rc": 0, "stdout": 'decode-1 missing\n{"needed": true}\n', "stderr": "", "json": {"needed": True}}, True),
    ({"rc": 0, "stdout": '{"needed": false}\n', "stderr": "", "json": {"needed": False}}, False),
])
def test_a_check_command_differs_when_it_fails_or_says_needed(got, differs):
    lines = STATE_MODULE.command_drift({"c": {"argv": ["x"], "differs": "label"}}, {"c": got})
    assert bool(lines) == differs
    if differs:
        [(kind, key, line)] = lines
        assert (kind, key) == ("commands", "c") and line.startswith("label: ") and "needed" not in line
    assert STATE_MODULE.command_drift({"c": {"argv": ["x"]}}, {"c": got}) == []


@pytest.mark.parametrize("stdout, want", [("a\n{\"needed\": true}\n", {"needed": True}), ("", None),
                                          ("not json\n", None), ("[1]\n", None)])
def test_the_last_json_line(stdout, want):
    assert STATE_MODULE.last_json_line(stdout) == want


def test_a_unit_neither_enabled_nor_active_is_named_under_both_kinds():
    states = {"a.service": {"enabled": "disabled", "active": "inactive"}, "b.timer": {"enabled": "enabled",
                                                                                        "active": "active"}}
    found = STATE_MODULE.unit_drift([{"name": "a.service", "enabled": True, "active": True},
                                     {"name": "b.timer", "enabled": True, "active": True}], states)
    assert [(k, n) for k, n, _ in found] == [("not_enabled", "a.service"), ("not_active", "a.service")]
    assert all(re.match(r"^unit a[.]service: ", line) for _, _, line in found)


# --- the deploy's key file, on the controller (the role's assert) -----------------------------

def test_the_deploys_key_file_is_readable_and_not_empty(tmp_path):
    from pdnode.core.rules.guards import deploy_key_file_problem
    key = tmp_path / "key"
    assert "which is missing on the controller" in deploy_key_file_problem(str(key))
    assert "which is not a regular file" in deploy_key_file_problem(str(tmp_path))
    key.write_text("")
    assert "which is empty" in deploy_key_file_problem(str(key))
    key.write_text("k" * 32 + "\n")
    assert deploy_key_file_problem(str(key)) == ""
    if os.geteuid() != 0:  # root reads every file
        key.chmod(0)
        assert "not readable by" in deploy_key_file_problem(str(key))
    line = deploy_key_file_problem(str(tmp_path / "absent"))
    assert line.startswith(f'pdnode_api_key_file (pd_services_api_key_file) is "{tmp_path}/absent"')
    assert "\n" not in line and 'fix: write the key into that file' in line
