"""The plan chooses how KV moves from prefill to decode (issue 19, section 1;
docs/kv-path.md): NVLink inside one host, RDMA between hosts, TCP without NICs (a
warning that says what it costs), and it renders what the engines need for the path."""

from __future__ import annotations

import subprocess
import sys

import pytest
from planvars import ROOT, changed, variables

from pdnode.core.inventory.read import inventory_variables
from pdnode.core.plan import kv_path
from pdnode.core.plan.build import build_plan

NVLINK_ENV = {"MC_INTRANODE_NVLINK": "1", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "INTRA_NODE_NVLINK"}


def _engines_env(plan) -> list[dict]:
    return [s["environment"] for s in plan.engines()]


def test_one_host_moves_kv_over_nvlink_and_renders_it_in_every_engine():
    plan = build_plan(variables("gpu01"), "gpu01")
    kv = plan.cluster["kv"]
    assert kv["path"] == "nvlink" and kv["gb_s"] == 385.0
    for env in _engines_env(plan):
        assert {k: env[k] for k in NVLINK_ENV} == NVLINK_ENV
        assert "MC_FORCE_HCA" not in env  # NVLink needs no NIC
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"mooncake"}
    assert "MC_INTRANODE_NVLINK" not in plan.services["router"]["environment"]


def test_mooncake_tcp_on_one_host_still_takes_nvlink_with_the_mooncake_backend():
    """mooncake_tcp would set MC_FORCE_TCP in SGLang; under NVLink the plan renders mooncake."""
    plan = build_plan(changed(variables("gpu01"), {"pdnode_transfer_backend": "mooncake_tcp",
                                                    "pdnode_ib_devices": None}), "gpu01")
    assert plan.cluster["kv"]["path"] == "nvlink"
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"mooncake"}


def test_nvlink_switched_off_without_nics_is_tcp_with_a_warning_naming_its_ttft_cost():
    plan = build_plan(changed(variables("gpu01"), {
        "pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None, "pdnode_kv_intranode_nvlink": False,
        "pdnode_model_kv_bytes_per_token": 188_416, "pdnode_kv_prompt_tokens": 4000}), "gpu01")
    kv = plan.cluster["kv"]
    assert kv["path"] == "tcp" and kv["gb_s"] == 1.8
    assert kv["handoff_s"] == pytest.approx(188_416 * 4000 / 1.8e9, rel=1e-3)
    assert all("MC_INTRANODE_NVLINK" not in env and "MC_FORCE_HCA" not in env for env in _engines_env(plan))
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"mooncake_tcp"}
    [warning] = [w for w in plan.warnings if w.rule_id == "kv-over-tcp"]
    assert "about 0.42 s of TTFT for a 4000-token prompt" in str(warning), str(warning)


def test_rdma_with_the_nic_map_when_nvlink_is_off():
    plan = build_plan(changed(variables("gpu01"), {"pdnode_kv_intranode_nvlink": False}), "gpu01")
    assert plan.cluster["kv"]["path"] == "rdma" and "per-GPU NIC map" in plan.cluster["kv"]["why"]
    assert not [w for w in plan.warnings if w.rule_id == "kv-over-tcp"]
    # field failure 7c: an engine without a usable NIC fails its start instead of moving KV over TCP
    assert all(env["MC_FORCE_HCA"] == "1" and "MC_INTRANODE_NVLINK" not in env for env in _engines_env(plan))
    assert "MC_FORCE_HCA" not in plan.services["router"]["environment"]


def test_a_layout_over_two_hosts_is_rdma_for_every_pair_and_says_why_not_nvlink():
    peers = inventory_variables(ROOT / "inventories" / "gpu-pair")
    for host in peers:
        plan = build_plan(peers[host], host, peers)
        kv = plan.cluster["kv"]
        assert kv["path"] == "rdma" and "spans hosts" in kv["why"]
        assert all("MC_INTRANODE_NVLINK" not in env and env["MC_FORCE_HCA"] == "1" for env in _engines_env(plan))


def test_nixl_keeps_its_backend():
    plan = build_plan(changed(variables("gpu01"), {"pdnode_transfer_backend": "nixl"}), "gpu01")
    assert plan.cluster["kv"]["path"] == "nixl"
    assert {s["args"]["disaggregation_transfer_backend"] for s in plan.engines()} == {"nixl"}
    assert all("MC_FORCE_HCA" not in env for env in _engines_env(plan))


@pytest.mark.parametrize(("backend", "multi_host", "nvlink", "why"), [
    ("nixl", False, True, "pdnode_transfer_backend: nixl (UCX chooses its transport)"),
    ("nixl", False, False, "pdnode_transfer_backend: nixl (UCX chooses its transport)"),
    ("nixl", True, True, "pdnode_transfer_backend: nixl (UCX chooses its transport)"),
    ("mooncake", True, False, "RDMA over the NICs Mooncake finds"),
    ("mooncake", False, False, "RDMA over the NICs Mooncake finds (pdnode_kv_intranode_nvlink: false)"),
    ("mooncake_tcp", False, False, "pdnode_transfer_backend: mooncake_tcp (no RDMA NICs) (pdnode_kv_intranode_nvlink: "
                                   "false)"),
])
def test_the_paths_reason_names_nvlink_only_where_mooncake_could_have_taken_it(backend, multi_host, nvlink, why):
    """kv_path.choose's `why` (what `explain` prints): "not NVLink" only for Mooncake over
    hosts with NVLink on, "(pdnode_kv_intranode_nvlink: false)" only for Mooncake on one
    host with it off; nixl never names Mooncake's NVLink switch."""
    chosen = kv_path.choose({"pdnode_transfer_backend": backend, "pdnode_kv_intranode_nvlink": nvlink},
                            multi_host, nic_map=False)
    assert chosen["why"] == why


def test_the_stand_in_node_paces_its_loopback_bytes_to_the_paths_speed():
    plan = build_plan(variables("demo"), "pdnode-demo")
    assert plan.cluster["kv"]["path"] == "nvlink" and "loopback TCP" in plan.cluster["kv"]["why"]
    assert plan.cluster["kv"]["handoff_s"] is not None  # the stand-in's bytes per token are known
    for env in _engines_env(plan):
        assert env["PDNODE_SIM_KV_GB_S"] == "385.0" and env["MC_INTRANODE_NVLINK"] == "1"
    tcp = build_plan(changed(variables("demo"), {"pdnode_kv_intranode_nvlink": False}), "pdnode-demo")
    for env in _engines_env(tcp):
        assert env["PDNODE_SIM_KV_GB_S"] == "1.8" and "MC_INTRANODE_NVLINK" not in env
    # the stand-in's engines are not measured by the verify's link check, nor given a floor
    assert plan.cluster["kv"]["checks"] == [] and not plan.cluster["kv"]["floor_from_path"]


@pytest.mark.parametrize(("changes", "floor"), [
    ({}, 5.0),                                    # nvlink: a fall-back to TCP (<= 2.0 GB/s) fails
    ({"pdnode_kv_intranode_nvlink": False}, 5.0),  # rdma: the same
    ({"pdnode_kv_intranode_nvlink": False, "pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None},
     0.35),                                       # tcp: a quarter of its lowest measurement
])
def test_the_verify_floor_is_the_paths_when_the_inventory_sets_none(changes, floor):
    v = changed(variables("gpu01"), changes)
    v["pdnode_verify_thresholds"] = {k: x for k, x in v["pdnode_verify_thresholds"].items()
                                     if k != "kv_transfer_speed_min_gb_s"}
    plan = build_plan(v, "gpu01")
    assert plan.settings["pdnode_verify_thresholds"]["kv_transfer_speed_min_gb_s"] == floor
    assert plan.cluster["kv"]["floor_from_path"]
    # the inventory's own value wins, and is said to
    v["pdnode_verify_thresholds"] = {**v["pdnode_verify_thresholds"], "kv_transfer_speed_min_gb_s": 12.5}
    plan = build_plan(v, "gpu01")
    assert plan.settings["pdnode_verify_thresholds"]["kv_transfer_speed_min_gb_s"] == 12.5
    assert not plan.cluster["kv"]["floor_from_path"]


def test_the_link_checks_cover_each_gpu_pair_once_with_the_paths_transport():
    plan = build_plan(variables("gpu01-2p1d"), "gpu01")
    checks = plan.cluster["kv"]["checks"]
    firsts = {s["id"]: s["gpus"][0] for s in plan.engines()}
    assert [(c["pair"], c["src_gpu"], c["dst_gpu"]) for c in checks] == [
        ("prefill-0 -> decode-0", firsts["prefill-0"], firsts["decode-0"]),
        ("prefill-1 -> decode-0", firsts["prefill-1"], firsts["decode-0"])]
    assert all(c["args"][-1] == "--intranode-nvlink" for c in checks)
    rdma = build_plan(changed(variables("gpu01"), {"pdnode_kv_intranode_nvlink": False}), "gpu01")
    [check] = rdma.cluster["kv"]["checks"]
    nic = rdma.engines()[0]["args"]["disaggregation_ib_device"][str(check["src_gpu"])]
    assert check["args"][-4:] == ["--protocol", "rdma", "--device-name", nic]
    peers = inventory_variables(ROOT / "inventories" / "gpu-pair")
    assert all(build_plan(peers[h], h, peers).cluster["kv"]["checks"] == [] for h in peers)


def test_the_check_tool_is_where_the_mooncake_role_installs_it():
    import yaml
    role_vars = yaml.safe_load((ROOT / "roles" / "mooncake" / "vars" / "main.yml").read_text())
    plan = build_plan(variables("gpu01"), "gpu01")
    assert role_vars["_mooncake_check_tool"].replace("{{ mooncake_venv }}", plan.install["venv"]) \
        == plan.install["kv_check_tool"]


def test_explain_shows_each_pairs_path_speed_and_ttft():
    r = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "explain", str(ROOT / "inventories" / "gpu01-2p1d")],
                       capture_output=True, text=True, check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(ln.startswith("KV hand-off: nvlink, about 385 GB/s") for ln in lines), r.stdout
    pairs = [ln.strip() for ln in lines if "-> decode-0:" in ln]
    assert pairs == ["prefill-0 -> decode-0: nvlink (on this host), ~385 GB/s",
                     "prefill-1 -> decode-0: nvlink (on this host), ~385 GB/s"], r.stdout
