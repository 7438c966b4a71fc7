"""Typed values wherever the plan hands them on (issue 43, item 6): every engine
environment variable the plan knows is checked for the type its library parses
(pdnode.core.rules.environment_types.TYPES), on every KV path, not only on the path that
reads it; the values the plan renders itself parse as that type too; and the table
cannot fall behind the names the plan's code mentions."""

from __future__ import annotations

import ast
import json
import re

import pytest
import test_kv_environment
from planvars import ROOT, changed

from pdnode.commands import cli
from pdnode.core.inventory.read import inventory_variables
from pdnode.core.plan import kv_path
from pdnode.core.plan.build import PlanError, build_plan
from pdnode.core.rules import disagg, environment_types
from pdnode.core.rules.catalogue import BY_ID
from pdnode.core.rules.environment_types import TYPES

PARSES, PRESENCE = "environment-value-parses", "environment-presence-switch"
LAYOUTS = sorted(test_kv_environment.LAYOUTS)  # nvlink, rdma (with and without the NIC map), tcp, nixl, two hosts

# (variable, value): one bad value of each kind, each refused on every KV path
BAD = [
    ("MC_GID_INDEX", "three"),  # Mooncake's atoi reads 0
    ("MC_IB_PORT", 0),  # below its range (Mooncake#3381)
    ("MC_MIN_RPC_PORT", 40000),  # in the ephemeral range Mooncake refuses
    ("NCCL_IB_TIMEOUT", 1.5),  # NCCL's strtoll reads 1
    ("NCCL_IB_GID_INDEX", "3.0"),
    ("SGLANG_DISAGGREGATION_QUEUE_SIZE", True),  # "True" is not an integer for EnvInt
    ("SGLANG_HEALTH_CHECK_TIMEOUT", "20s"),  # int(os.getenv(...)) fails the engine's start
    ("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", "soon"),  # EnvFloat
    ("SGLANG_MOONCAKE_SEND_AUX_TCP", "maybe"),  # EnvBool
    ("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "on"),  # EnvBool takes no "on"
]
# Values of each kind the libraries parse, together: accepted on every path, in silence.
GOOD = {
    "NCCL_IB_TIMEOUT": 22,
    "NCCL_IB_GID_INDEX": -1,  # NCCL's automatic choice
    "SGLANG_DISAGGREGATION_QUEUE_SIZE": "8",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": 12.5,
    "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S": 30,  # an integer is a float too
    "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": True,  # rendered "True": EnvBool lowers it
    "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "Y",
    "SGLANG_HEALTH_CHECK_TIMEOUT": 40,
    "NCCL_DEBUG": "WARN",
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v}" for n, v in BAD])
def test_a_value_its_library_does_not_parse_is_refused_on_every_path_in_one_line(name, value, layout):
    found = test_kv_environment._findings(layout, {name: value})
    assert [r for r, _ in found] == [PARSES], found
    line = found[0][1]
    assert line.startswith(f"pdnode_engine_environment.{name}="), line
    t = TYPES[name]
    assert f"{t.library} reads it as {environment_types.expected(t)}" in line, line
    assert f"Fix: write {environment_types.expected(t)}, or remove it." in line, line


@pytest.mark.parametrize("layout", LAYOUTS)
def test_values_their_libraries_parse_are_accepted_on_every_path_and_rendered(layout):
    assert test_kv_environment._findings(layout, GOOD) == []
    plan = test_kv_environment._plan(layout, GOOD)
    assert plan.cluster["kv"]["path"] == test_kv_environment.PATHS[layout]
    for svc in plan.engines():
        for name, value in GOOD.items():
            assert svc["environment"][name] == str(value)
            assert environment_types.parses(name, svc["environment"][name]), name


def test_parsing_follows_each_library():
    ok = [("MC_GID_INDEX", "3"), ("MC_GID_INDEX", 255), ("MC_IB_PORT", "+1"), ("NCCL_IB_GID_INDEX", -1),
          ("MC_MAX_RPC_PORT", 17000), ("MC_MAX_RPC_PORT", 61000), ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2.5"),
          ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5), ("SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S", "1e3"),
          ("SGLANG_MOONCAKE_SEND_AUX_TCP", False), ("SGLANG_MOONCAKE_SEND_AUX_TCP", "NO"),
          ("MC_FORCE_TCP", "anything"), ("MC_TE_FILTERS", "mlx5_0,mlx5_1"), ("NOT_KNOWN_X", "x")]
    bad = [("MC_GID_INDEX", 256), ("MC_GID_INDEX", "-1"), ("MC_GID_INDEX", "0x3"), ("MC_GID_INDEX", ""),
           ("MC_TRANSFER_TIMEOUT", 4), ("MC_MIN_RPC_PORT", 1023), ("MC_MIN_RPC_PORT", 32768),
           ("NCCL_IB_RETRY_CNT", 8), ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 1.5),
           ("SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S", "inf"), ("SGLANG_DISAGGREGATION_QUEUE_SIZE", 4.0),
           ("SGLANG_MOONCAKE_SEND_AUX_TCP", "off"), ("SGLANG_MOONCAKE_SEND_AUX_TCP", "")]
    assert [(n, v) for n, v in ok if not environment_types.parses(n, v)] == []
    assert [(n, v) for n, v in bad if environment_types.parses(n, v)] == []


def test_the_refusal_says_what_the_library_takes_and_why_this_value_is_not_it():
    """problem(): a boolean's refusal lists the words its library takes; a number out of
    its range is said to be out of range, anything else (a float for an integer, a number
    for a boolean) not to be one, with what the library does with it (the variable's own
    failure where the table names one)."""
    def why(name, value):
        found = environment_types.problem(name, value)
        assert found is not None, (name, value)
        return found[0]

    words = "(true, 1, yes, y / false, 0, no, n, in any case)"
    sglang = environment_types.ON_FAILURE["SGLang"]
    assert why("SGLANG_MOONCAKE_SEND_AUX_TCP", "maybe").endswith(
        f"true or false {words}: 'maybe' is not one, and {sglang} (sglang/srt/environ.py Envs, EnvBool)"), \
        why("SGLANG_MOONCAKE_SEND_AUX_TCP", "maybe")
    assert f"{words}: '2' is not one, and {sglang}" in why("SGLANG_MOONCAKE_SEND_AUX_TCP", 2)
    assert "in any case" not in why("MC_GID_INDEX", "three")
    mooncake, nccl = environment_types.ON_FAILURE["Mooncake"], environment_types.ON_FAILURE["NCCL"]
    assert f": 'three' is not one, and {mooncake} (" in why("MC_GID_INDEX", "three")
    assert ": '0' is out of that range: Mooncake does not use it as written (" in why("MC_IB_PORT", 0)
    assert f": '1.5' is not one, and {nccl} (" in why("NCCL_IB_TIMEOUT", 1.5)
    assert ": '1.5' is out of that range: SGLang does not use it as written (" in \
        why("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 1.5)
    own = TYPES["SGLANG_HEALTH_CHECK_TIMEOUT"].failure
    assert own and f": '20s' is not one, and {own} (" in why("SGLANG_HEALTH_CHECK_TIMEOUT", "20s")
    assert environment_types.problem("MC_IB_PORT", 1) is None


def test_a_presence_switch_written_as_off_is_a_warning_where_nothing_else_judges_it():
    """Mooncake tests MC_FORCE_TCP for presence: on the TCP path (no contradiction) "0"
    is a warning of its own; where the path judges the variable, that one line only."""
    found = test_kv_environment._findings("tcp", {"MC_FORCE_TCP": "0"})
    assert [r for r, _ in found] == [PRESENCE], found
    assert found[0][1].startswith("pdnode_engine_environment.MC_FORCE_TCP='0': Mooncake tests it for presence only")
    assert BY_ID[PRESENCE].severity == "warning"
    assert test_kv_environment._findings("tcp", {"MC_FORCE_TCP": "1"}) == []
    switches = [n for n, t in TYPES.items() if t.kind == "presence"]
    for layout in LAYOUTS:
        for name in switches:
            for value in ("0", False):
                found = test_kv_environment._findings(layout, {name: value})
                assert len(found) == 1, (layout, name, found)  # one rule per fact


def test_pdnode_check_refuses_the_issue_examples_on_a_path_that_does_not_read_them(capsys, tmp_path):
    """Issue 43: MC_GID_INDEX "three" and NCCL_IB_TIMEOUT 1.5 passed check on gpu01's
    NVLink path (no RDMA transport reads them there) and fail the engines after a
    layout change."""
    inv = test_kv_environment.gpu01_with_environment(tmp_path, {"MC_GID_INDEX": "three", "NCCL_IB_TIMEOUT": 1.5})
    rc = cli.main(["check", "--json", str(inv)])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["ok"] is False
    assert {(p["field"], p["rule"]) for p in report["problems"]} == {
        ("pdnode_engine_environment.MC_GID_INDEX", PARSES), ("pdnode_engine_environment.NCCL_IB_TIMEOUT", PARSES)}


# --- the plan's own values ------------------------------------------------------------

PATH_CHANGES = {
    "nvlink": {"pdnode_transfer_backend": "mooncake", "pdnode_kv_intranode_nvlink": True},
    "rdma": {"pdnode_transfer_backend": "mooncake", "pdnode_kv_intranode_nvlink": False},
    "tcp": {"pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None, "pdnode_kv_intranode_nvlink": False},
    "nixl": {"pdnode_transfer_backend": "nixl"},
}
# the disaggregation settings at SGLang's floors, and a heartbeat that renders as a fraction
FLOORS = {"pdnode_disagg_bootstrap_timeout_s": 1, "pdnode_disagg_waiting_timeout_s": 1,
          "pdnode_disagg_heartbeat_interval_s": 2.5, "pdnode_disagg_heartbeat_max_failure": 1}


def _plans(inventory: str, changes: dict):
    """The plan of every host of the example inventory that holds a layout."""
    peers = {h: changed(v, changes) for h, v in inventory_variables(ROOT / "inventories" / inventory).items()}
    for host, v in peers.items():
        try:
            yield build_plan(v, host, peers)
        except PlanError:
            assert "pdnode_prefill_instances" not in v, host  # only a preflight-only host (h200-single)


@pytest.mark.parametrize("inventory", sorted(p.name for p in (ROOT / "inventories").iterdir() if p.is_dir()))
def test_every_value_the_plan_renders_parses_as_its_librarys_type(inventory):
    """For every example inventory on every KV path, as written and at the disaggregation
    settings' floors: each variable of an engine's environment the table knows parses."""
    paths = set()
    for path, changes in PATH_CHANGES.items():
        for extra in ({}, FLOORS):
            for plan in _plans(inventory, {**changes, **extra}):
                paths.add(plan.cluster["kv"]["path"])
                for svc in plan.engines():
                    env = svc["environment"]
                    rendered = {**disagg.environment(plan.settings), **kv_path.PATH_ENVIRONMENT.get(
                        plan.cluster["kv"]["path"], {})}
                    assert set(rendered) <= set(env) and set(rendered) <= set(TYPES), svc["id"]
                    bad = {n: val for n, val in env.items() if not environment_types.parses(n, val)}
                    assert bad == {}, (inventory, path, svc["id"])
    if inventory != "h200-single":
        assert paths >= {"rdma", "tcp", "nixl"}, paths  # nvlink where the layout is one host's


def test_the_plans_own_variables_are_in_the_table():
    owned = {variable for variable, _ in disagg.ENVIRONMENT.values()}
    owned |= {n for env in kv_path.PATH_ENVIRONMENT.values() for n in env} | {kv_path.ADDRESS_VARIABLE}
    assert sorted((owned | kv_path.JUDGED_ENVIRONMENT) - set(TYPES)) == []


# --- the table itself -----------------------------------------------------------------

_MENTION = re.compile(r"\b(?:MC|NCCL|SGLANG)_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_variable_the_plans_code_mentions_is_in_the_table():
    """Every MC_*, NCCL_* and SGLANG_* name in src/pdnode/core (code, strings, comments;
    the table's module aside) that is not a Python name is in TYPES: a variable the plan learns of gets its type."""
    mentioned, identifiers = set(), set()
    for path in (ROOT / "src" / "pdnode" / "core").rglob("*.py"):
        if path.name == "environment_types.py":
            continue  # the table, whose notes name the libraries' own macros (NCCL_PARAM)
        text = path.read_text(encoding="utf-8")
        mentioned |= set(_MENTION.findall(text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Name):
                identifiers.add(node.id)
            elif isinstance(node, ast.Attribute):
                identifiers.add(node.attr)
    assert {"MC_GID_INDEX", "NCCL_IB_GID_INDEX", "SGLANG_HOST_IP"} <= mentioned  # the scan sees them
    assert sorted(mentioned - identifiers - set(TYPES)) == []


def test_the_table_is_well_formed():
    for name, t in TYPES.items():
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), name
        assert t.kind in ("int", "float", "bool", "str", "presence"), name
        assert t.library in environment_types.ON_FAILURE and t.source, name
        assert t.truth in environment_types.TRUTH, name
        if t.kind not in ("int", "float"):
            assert t.low is None and t.high is None and t.gap is None, name
        if t.low is not None and t.high is not None:
            assert t.low <= t.high, name
        if t.kind == "presence":
            assert t.library == "Mooncake", name  # only Mooncake tests for presence
