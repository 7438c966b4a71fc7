"""The engines' transport environment is judged against the plan's KV path (issue 28,
item 7; docs/kv-path.md): every Mooncake or SGLang variable of pdnode_engine_environment
that steers the KV transport or its memory pool is refused where it contradicts the path
the plan chose (or where the plan sets it itself), a warning where it does nothing or
steers the path unchecked, and silent where it agrees. Every case is the real plan of a
shipped inventory: gpu01 (one host: NVLink; RDMA, TCP or nixl when its settings say so)
and gpu-pair (two hosts: RDMA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from planvars import ROOT, changed, variables

from pdnode.commands import cli
from pdnode.core.plan import kv_path
from pdnode.core.inventory.read import inventory_variables
from pdnode.core.plan.build import PlanError, build_plan
from pdnode.core.rules.catalogue import BY_ID
from pdnode.standin.config import load_sim_settings

# layout -> (inventory, the changes to its hosts' variables); PATHS: the path the plan takes
LAYOUTS = {
    "nvlink": ("gpu01", {}),
    "rdma-map": ("gpu01", {"pdnode_kv_intranode_nvlink": False}),
    "rdma-nomap": ("gpu01", {"pdnode_kv_intranode_nvlink": False, "pdnode_ib_devices": None}),
    "tcp": ("gpu01", {"pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None,
                      "pdnode_kv_intranode_nvlink": False}),
    "nixl": ("gpu01", {"pdnode_transfer_backend": "nixl"}),
    "pair": ("gpu-pair", {}),
}
PATHS = {"nvlink": "nvlink", "rdma-map": "rdma", "rdma-nomap": "rdma", "tcp": "tcp", "nixl": "nixl", "pair": "rdma"}
OWNED, AGAINST, WARN = "kv-environment-owned", "kv-environment-contradicts", "kv-environment-surprising"


def _plan(layout: str, env: dict):
    """The plan of the layout's first host with ``env`` as pdnode_engine_environment."""
    inventory, changes = LAYOUTS[layout]
    changes = {**changes, "pdnode_engine_environment": env}
    if inventory == "gpu-pair":
        peers = inventory_variables(ROOT / "inventories" / "gpu-pair")
        peers = {h: changed(peers[h], changes) for h in peers}
        return build_plan(peers["gpu01"], "gpu01", peers)
    return build_plan(changed(variables(inventory), changes), "gpu01")


def _findings(layout: str, env: dict) -> list:
    """The problems, or else the warnings, of the layout with ``env`` (rule id, the line),
    less the layout's own: the TCP layout is always told what TCP costs (kv-over-tcp)."""
    try:
        plan = _plan(layout, env)
    except PlanError as exc:
        return [(p.rule_id, str(p)) for p in exc.problems]
    return [(w.rule_id, str(w)) for w in plan.warnings if w.rule_id != "kv-over-tcp"]


# (variable, value, layout, the one rule it breaks): the refused and the warned values
FLAGGED = [
    # SGLang's PR 17866: never together with the MC_INTRANODE_NVLINK the plan sets
    ("MC_FORCE_MNNVL", "1", "nvlink", AGAINST),
    ("MC_FORCE_MNNVL", "true", "pair", AGAINST),
    ("MC_FORCE_MNNVL", "1", "nixl", WARN),
    # Mooncake 0.3.14 tests for presence: "0" forces TCP too
    ("MC_FORCE_TCP", "0", "nvlink", AGAINST),
    ("MC_FORCE_TCP", "1", "pair", AGAINST),
    ("MC_INTRANODE_NVLINK", "1", "nvlink", OWNED),
    ("MC_INTRANODE_NVLINK", "1", "pair", AGAINST),
    ("MC_INTRANODE_NVLINK", "0", "rdma-map", AGAINST),
    ("MC_INTRANODE_NVLINK", "1", "tcp", AGAINST),
    ("MC_FORCE_HCA", "1", "nvlink", WARN),
    ("MC_FORCE_HCA", "1", "tcp", WARN),
    ("MC_FORCE_HCA", "1", "pair", OWNED),  # the plan sets it on the RDMA path (field failure 7c)
    ("MC_USE_TENT", "1", "nvlink", AGAINST),
    ("MC_USE_TEV1", "1", "pair", AGAINST),
    ("MC_GID_INDEX", 3, "nvlink", WARN),
    ("MC_IB_PORT", 1, "tcp", WARN),
    ("MC_RDMA_BIND_ADDRESS", "10.20.0.11", "nvlink", WARN),
    ("MC_TE_FILTERS", "mlx5_9", "pair", AGAINST),        # no mapped NIC left: a silent fall-back to TCP
    # one GPU starved is enough: its engine falls back to TCP while the others keep RDMA
    ("MC_TE_FILTERS", "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6", "pair", AGAINST),
    ("MC_TE_FILTERS", "mlx5_0,mlx5_1", "rdma-nomap", WARN),
    ("MC_TE_FILTERS", "mlx5_0", "nvlink", WARN),
    ("MC_CUSTOM_TOPO_JSON", "/etc/mooncake/topo.json", "pair", AGAINST),
    ("MC_CUSTOM_TOPO_JSON", "/etc/mooncake/topo.json", "rdma-nomap", WARN),
    ("MC_TCP_BIND_ADDRESS", "10.20.0.11", "tcp", WARN),
    ("MOONCAKE_PROTOCOL", "tcp", "nvlink", WARN),
    ("MOONCAKE_PROTOCOL", "rdma", "nixl", WARN),
    ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "INTRA_NODE_NVLINK", "nvlink", OWNED),
    ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", True, "pair", AGAINST),  # "True": the MNNVL fabric pool
    ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "BAREX", "nixl", AGAINST),
    ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "intra_node_nvlink", "tcp", WARN),  # SGLang matches upper case only
    ("SGLANG_MOONCAKE_SEND_AUX_TCP", "true", "nvlink", AGAINST),
    ("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1", "rdma-map", AGAINST),
    ("SGLANG_HOST_IP", "10.20.0.99", "pair", OWNED),
    ("SGLANG_HOST_IP", "10.20.0.99", "nvlink", WARN),
    ("HOST_IP", "10.20.0.99", "pair", WARN),
    ("SGLANG_LOCAL_IP_NIC", "eth1", "nvlink", WARN),
    ("SGLANG_DISAGGREGATION_NIXL_BACKEND", "LIBFABRIC", "nixl", WARN),
    ("SGLANG_DISAGGREGATION_NIXL_BACKEND", "UCX", "nvlink", WARN),
    ("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", "x", "pair", WARN),
]

# (variable, value, layout): values that agree with the plan's path, accepted in silence
ACCEPTED = [
    ("MC_FORCE_TCP", "1", "tcp"),  # what SGLang's mooncake_tcp sets itself
    ("MC_GID_INDEX", 3, "pair"),
    ("MC_IB_PORT", 1, "rdma-map"),
    ("MC_RDMA_BIND_ADDRESS", "10.20.0.11", "pair"),
    ("MOONCAKE_PROTOCOL", "rdma", "nvlink"),  # SGLang's own default
    ("SGLANG_MOONCAKE_SEND_AUX_TCP", "false", "nvlink"),
    ("SGLANG_MOONCAKE_SEND_AUX_TCP", "1", "pair"),  # host-side buffers: TCP reads them
    ("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "false", "nvlink"),
    ("SGLANG_DISAGGREGATION_NIXL_BACKEND", "UCX", "nixl"),
    ("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", "x", "nixl"),
]

# Judged variables no layout accepts in silence, and why: the plan sets them itself, no
# pdnode path uses what they ask for, or they never do anything for SGLang's Mooncake.
NEVER_SILENT = {
    "MC_INTRANODE_NVLINK": "the plan sets it on the NVLink path (pdnode_kv_intranode_nvlink), and it breaks any other",
    "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "the plan sets it on the NVLink path; its pools serve no other path",
    "MC_FORCE_HCA": "the plan sets it on the RDMA path; it does nothing on any other",
    "MC_FORCE_MNNVL": "no pdnode path is MNNVL, and the PyPI builds pdnode installs lack it",
    "MC_USE_TENT": "TENT chooses its own transport: no plan describes it",
    "MC_USE_TEV1": "TENT chooses its own transport: no plan describes it",
    "MC_TE_FILTERS": "pdnode_ib_devices is the checked NIC choice; a filter narrows or starves it",
    "MC_CUSTOM_TOPO_JSON": "pdnode_ib_devices is the checked NIC choice; a file replaces it",
    "MC_TCP_BIND_ADDRESS": "Mooncake reads it only with a metadata server, never with SGLang's P2PHANDSHAKE",
    "SGLANG_HOST_IP": "the plan sets it over several hosts; on one host it is unchecked",
    "HOST_IP": "read only without SGLANG_HOST_IP; unchecked",
    "SGLANG_LOCAL_IP_NIC": "read only without SGLANG_HOST_IP; unchecked",
}


def test_every_judged_variable_has_a_flagged_case_and_an_accepted_case_or_a_reason():
    """The table of the variables the rule judges (kv_path.JUDGED_ENVIRONMENT) held to the
    cases, and through them to the rule: a variable counts as flagged only where the plan
    flags every one of its FLAGGED cases with the case's rule, and as accepted only where the
    plan accepts every one of its ACCEPTED cases in silence. A variable of the table that the
    rule stops judging (or judges with another verdict) fails here, by name."""
    flagged = {name for name, *_ in FLAGGED} - {
        name for name, value, layout, rule in FLAGGED if [r for r, _ in _findings(layout, {name: value})] != [rule]}
    accepted = {name for name, *_ in ACCEPTED} - {
        name for name, value, layout in ACCEPTED if _findings(layout, {name: value})}
    assert sorted(kv_path.JUDGED_ENVIRONMENT - flagged) == [], \
        "judged variables without a refused or warned case, or one the rule does not flag so"
    assert sorted(kv_path.JUDGED_ENVIRONMENT - accepted - set(NEVER_SILENT)) == [], \
        "without an accepted case, or with one the rule does not accept"
    assert not accepted & set(NEVER_SILENT), "a variable both accepted and never silent"
    assert sorted((flagged | accepted | set(NEVER_SILENT)) - kv_path.JUDGED_ENVIRONMENT) == [], "cases for unjudged names"


@pytest.mark.parametrize(("name", "value", "layout", "rule"), FLAGGED,
                         ids=[f"{n}={v}@{lay}" for n, v, lay, _ in FLAGGED])
def test_a_variable_against_the_path_is_refused_or_warned_in_one_line(name, value, layout, rule):
    found = _findings(layout, {name: value})
    assert [r for r, _ in found] == [rule], found
    line = found[0][1]
    # the field, the value, the plan's path or its own setting, and a fix
    assert line.startswith(f"pdnode_engine_environment.{name}=") and ". Fix: " in line, line
    assert BY_ID[rule].severity == ("warning" if rule == WARN else "error")


def test_each_verdict_says_why_for_its_path_and_gives_that_paths_fix():
    """kv_path.judge_environment's words differ by path and by hosts where the fix does:
    what to remove, what chose first, what each host count breaks."""
    def one(name, value, path, multi_host=False):
        [found] = kv_path.judge_environment({name: value}, path, multi_host, {})
        return found

    tcp_fix = "remove it; for TCP set pdnode_transfer_backend: mooncake_tcp"
    assert one("MC_FORCE_TCP", "1", "nvlink").fix == tcp_fix + " and pdnode_kv_intranode_nvlink: false"
    assert one("MC_FORCE_TCP", "1", "rdma").fix == tcp_fix
    nvlink_fix = "remove it; for NVLink keep every instance on one host with pdnode_kv_intranode_nvlink: true"
    tcp, over_hosts, one_host = (one("MC_INTRANODE_NVLINK", "1", "tcp"), one("MC_INTRANODE_NVLINK", "1", "rdma", True),
                                 one("MC_INTRANODE_NVLINK", "1", "rdma"))
    assert tcp.why.startswith("asks for Mooncake's intra-node NVLink transport") and tcp.fix == nvlink_fix, tcp
    assert "every hand-off between the layout's hosts fails" in over_hosts.why and over_hosts.fix == "remove it"
    assert one_host.why.endswith("(pdnode_kv_intranode_nvlink: false)") and one_host.fix == nvlink_fix, one_host
    assert "SGLang's PR 17866" in one("MC_FORCE_MNNVL", "1", "nvlink").why
    assert "SGLang's PR 17866" not in one("MC_FORCE_MNNVL", "1", "rdma").why
    assert one("MC_FORCE_HCA", "1", "nvlink").why.startswith("MC_INTRANODE_NVLINK (the plan's) is chosen before it")
    assert one("MC_FORCE_HCA", "1", "tcp").why.startswith("MC_FORCE_TCP (SGLang's for mooncake_tcp) is chosen before")
    assert one("HOST_IP", "10.0.0.1", "rdma", True).why.startswith("SGLang reads it only without SGLANG_HOST_IP")
    assert one("HOST_IP", "10.0.0.1", "rdma").why.startswith("the engines advertise this address")


@pytest.mark.parametrize("starved", [[7], [0], [3, 5]])
def test_a_nic_filter_that_starves_one_gpu_is_refused_naming_that_gpu_only(starved):
    """Field failure 7c: an MC_TE_FILTERS that keeps every GPU's NIC but one is refused, naming
    the GPUs left without one (not only a filter that starves them all)."""
    nics = variables("gpu01")["pdnode_ib_devices"]  # the same map on both of gpu-pair's hosts
    kept = ",".join(str(nic) for gpu, nic in sorted(nics.items()) if gpu not in starved)
    found = _findings("pair", {"MC_TE_FILTERS": kept})
    assert [r for r, _ in found] == [AGAINST], found
    assert f"leaves GPUs {starved} none of their pdnode_ib_devices NICs" in found[0][1], found
    everyone = ",".join(str(nic) for nic in nics.values())
    assert [r for r, _ in _findings("pair", {"MC_TE_FILTERS": everyone})] == [WARN]


@pytest.mark.parametrize(("name", "value", "layout"), ACCEPTED, ids=[f"{n}={v}@{lay}" for n, v, lay in ACCEPTED])
def test_a_variable_that_agrees_with_the_path_is_accepted_and_rendered(name, value, layout):
    plan = _plan(layout, {name: value})
    assert _findings(layout, {name: value}) == []
    assert plan.cluster["kv"]["path"] == PATHS[layout]
    assert all(s["environment"][name] == str(value) for s in plan.engines())


@pytest.mark.parametrize("name", sorted(NEVER_SILENT))
def test_a_never_silent_variable_is_flagged_on_every_layout(name):
    for layout in LAYOUTS:
        found = _findings(layout, {name: "1"})
        assert [r for r, _ in found if r.startswith("kv-environment-")], (layout, found)


@pytest.mark.parametrize(("name", "value", "layout"), ACCEPTED, ids=[f"{n}={v}@{lay}" for n, v, lay in ACCEPTED])
def test_what_the_plan_says_is_what_the_engines_environment_selects(name, value, layout):
    """The stand-in reads Mooncake's switches from the rendered environment as Mooncake
    does: an accepted variable leaves the engines on the plan's path, so `explain`, the
    verify floor and the planner's hand-off term describe what runs."""
    plan = _plan(layout, {name: value})
    if plan.cluster["kv"]["path"] == "nixl":
        return  # UCX's choice: no Mooncake switch to read
    for svc in plan.engines():
        sim = load_sim_settings(svc["environment"])
        assert sim.kv_path(svc["args"]["disaggregation_transfer_backend"]) == plan.cluster["kv"]["path"], svc["id"]


def gpu01_with_environment(tmp_path: Path, environment: dict) -> Path:
    """An inventory: gpu01's group_vars, and ENVIRONMENT as its host's pdnode_engine_environment."""
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n")
    (inv / "group_vars").symlink_to(ROOT / "inventories" / "gpu01" / "group_vars")
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu01.yml").write_text(yaml.safe_dump({"pdnode_engine_environment": environment}))
    return inv


def test_pdnode_check_refuses_the_issue_reproduction(capsys, tmp_path):
    """Issue 28: `pdnode_engine_environment: {MC_FORCE_MNNVL: "1"}` beside gpu01's NVLink
    transport was accepted (exit 0); with the others that put the transport against the path."""
    inv = gpu01_with_environment(tmp_path, {
        "MC_FORCE_MNNVL": "1", "MC_FORCE_TCP": "1", "MC_USE_TENT": "1",
        "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "NVLINK", "SGLANG_MOONCAKE_SEND_AUX_TCP": "true"})
    rc = cli.main(["check", "--json", str(inv)])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["ok"] is False
    got = {p["field"].removeprefix("pdnode_engine_environment."): p["rule"] for p in report["problems"]}
    assert got == {"MC_FORCE_MNNVL": AGAINST, "MC_FORCE_TCP": AGAINST, "MC_USE_TENT": AGAINST,
                   "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": OWNED, "SGLANG_MOONCAKE_SEND_AUX_TCP": AGAINST}, report
