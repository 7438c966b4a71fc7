"""pdnode.placement: GPU / NUMA / NIC placement advice from `nvidia-smi topo -m`.

Three kinds of input, named as such in every test:
* real captures (tests/fixtures/nvidia-smi/h200-1gpu, h200-1gpu-run2, h200-2gpu): one
  and two H200s -- fewer GPUs than the gpu01 plan needs, so these test the degraded path;
* the HAND-MADE 8-GPU HGX fixture (handmade/topo-m-handmade-hgx8.txt): no 8-GPU machine
  was available, so the 8-GPU behaviour is only tested on this hand-written topology;
* CONSTRUCTED topologies rendered below in nvidia-smi's format (tabs, ANSI header, NIC
  legend) and parsed by pdnode.core.host.facts, for the warnings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdnode.commands import cli
from pdnode.core.host.facts import parse_topo_matrix
from pdnode.core.inventory.read import load_inventory
from pdnode.core.host.placement import format_ids, link_cost, parse_id_list
from pdnode.core.host.placement_advice import advise, candidate_splits, engine_instances
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "nvidia-smi"
REAL_1GPU = FIX / "h200-1gpu" / "topo-m.txt"
REAL_1GPU_RUN2 = FIX / "h200-1gpu-run2" / "topo-m.txt"
REAL_2GPU = FIX / "h200-2gpu" / "topo-m.txt"
HANDMADE_HGX8 = FIX / "handmade" / "topo-m-handmade-hgx8.txt"
GPU01 = ROOT / "inventories" / "gpu01"


def topo(path: Path) -> dict:
    return parse_topo_matrix(path.read_text())


@pytest.fixture(scope="module")
def gpu01_plan():
    hv = load_inventory(GPU01)
    return build_plan(hv.variables, hv.host)


# --- constructed topologies ------------------------------------------------------------

def render_topo(gpu_numa: list[int | None], gpu_link, nic_gpu: tuple[int, ...] = ()) -> str:
    """`nvidia-smi topo -m` text for a CONSTRUCTED host.

    gpu_numa[i]: NUMA node of GPU i (None: N/A); gpu_link(a, b): GPU a <-> GPU b link;
    nic_gpu[k]: the GPU NIC k sits next to (PXB); other GPUs on its node see NODE, the
    rest SYS. NUMA node n owns CPUs 16n-16n+15 (all 0-15 when N/A).
    """
    n = len(gpu_numa)
    nic_numa = [gpu_numa[g] for g in nic_gpu]
    names = [f"GPU{i}" for i in range(n)] + [f"NIC{k}" for k in range(len(nic_gpu))]
    out = ["\t\x1b[4m" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]

    def gpu_nic(a: int, k: int) -> str:
        return "PXB" if nic_gpu[k] == a else ("NODE" if nic_numa[k] == gpu_numa[a] else "SYS")

    for a in range(n):
        cells = [" X " if a == b else gpu_link(a, b) for b in range(n)]
        cells += [gpu_nic(a, k) for k in range(len(nic_gpu))]
        node = gpu_numa[a]
        cpus = f"{16 * node}-{16 * node + 15}" if node is not None else "0-15"
        out.append("\t".join([f"GPU{a}", *cells, cpus, "N/A" if node is None else str(node), "", "N/A"]))
    for k in range(len(nic_gpu)):
        cells = [gpu_nic(a, k) for a in range(n)]
        cells += [" X " if k == j else ("NODE" if nic_numa[j] == nic_numa[k] else "SYS") for j in range(len(nic_gpu))]
        out.append("\t".join([f"NIC{k}", *cells]))
    out += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks"]
    if nic_gpu:
        out += ["", "NIC Legend:", ""] + [f"  NIC{k}: mlx5_{k}" for k in range(len(nic_gpu))]
    return "\n".join(out) + "\n"


def bridged_pcie_link(numa):
    """A 2-socket PCIe host with NVLink bridges between GPU pairs (0,1), (2,3), ..."""
    def link(a, b):
        if a // 2 == b // 2:
            return "NV12"
        return "NODE" if numa[a] == numa[b] else "SYS"
    return link


BRIDGED_NUMA = [0, 0, 0, 0, 1, 1, 1, 1]
CONSTRUCTED_BRIDGED = render_topo(BRIDGED_NUMA, bridged_pcie_link(BRIDGED_NUMA), nic_gpu=tuple(range(8)))


def pd(*groups: list[int], decode_from: int = 1) -> dict:
    """The plan's services for a PD layout: groups[:decode_from] prefill instances, the
    rest decode instances, plus the router (which placement skips)."""
    out, n = {}, {"prefill": 0, "decode": 0}
    for i, gpus in enumerate(groups):
        role = "prefill" if i < decode_from else "decode"
        sid = f"{role}-{n[role]}"
        n[role] += 1
        out[sid] = {"id": sid, "role": role, "name": sid.split("-")[1], "gpus": gpus}
    out["router"] = {"id": "router", "role": "router", "name": "router", "gpus": []}
    return out


# --- helpers ---------------------------------------------------------------------------

def test_id_lists_round_trip():
    assert parse_id_list("0-55,112-167") == set(range(56)) | set(range(112, 168))
    assert format_ids(parse_id_list("0-55,112-167")) == "0-55,112-167"
    assert format_ids([7, 0, 1, 2, 3]) == "0-3,7"
    assert parse_id_list(None) is None and parse_id_list("N/A") is None and parse_id_list("5-2") is None


def test_link_order_nvlink_before_pcie_before_sys():
    order = ["NV18", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS", "weird"]
    assert sorted(reversed(order), key=link_cost) == order
    assert link_cost("SOC") == link_cost("SYS")


def test_candidate_splits_are_contiguous_and_disjoint():
    # same-size instances are interchangeable: one order of their windows is listed
    assert candidate_splits(list(range(8)), {"prefill-0": 4, "decode-0": 4}) == [
        {"prefill-0": [0, 1, 2, 3], "decode-0": [4, 5, 6, 7]}]
    got = candidate_splits(list(range(4)), {"prefill-0": 2, "decode-0": 1})
    assert sorted((c["prefill-0"], c["decode-0"]) for c in got) == [
        ([0, 1], [2]), ([0, 1], [3]), ([1, 2], [0]), ([1, 2], [3]), ([2, 3], [0]), ([2, 3], [1])]
    assert candidate_splits([0], {"prefill-0": 1, "decode-0": 1}) == []


def test_candidate_splits_of_many_equal_instances_stay_few():
    """Eight 1-GPU instances on 8 GPUs: one candidate, not 8! = 40320."""
    sizes = {f"decode-{i}": 1 for i in range(8)}
    assert candidate_splits(list(range(8)), sizes) == [{f"decode-{i}": [i] for i in range(8)}]
    # windows follow the planned order of equal instances: the one planned lower stays lower
    got = candidate_splits([0, 1], {"prefill-0": 1, "decode-0": 1}, {"prefill-0": 1, "decode-0": 0})
    assert got == [{"prefill-0": [1], "decode-0": [0]}]


# --- real captures: fewer GPUs than the plan (the degraded path) ---------------------------

@pytest.mark.parametrize("capture", [REAL_1GPU, REAL_1GPU_RUN2], ids=["real-h200-1gpu", "real-h200-1gpu-run2"])
def test_real_1gpu_capture_cannot_hold_the_gpu01_plan(capture, gpu01_plan):
    advice = advise(topo(capture), gpu01_plan.services, gpu01_plan.settings["pdnode_ib_devices"])
    assert advice.lines() == [
        "topology: 1 GPU (0); NUMA node 0: GPU 0; no NICs",
        "instance   GPUs                   NUMA  CPUs  interconnect",
        "---------  ---------------------  ----  ----  ------------",
        "prefill-0  0-3 (1-3 not on host)  0     0-15  single GPU",
        "decode-0   4-7 (not on host)      -     -     -",
        "NICs: not checked (the topology shows no NIC)",
        "warning: the plan needs 8 GPUs (prefill-0 0-3, decode-0 4-7) but the host has 1 (GPU 0): GPUs 1-7 are not on "
        "this host. Fix: run against the host the inventory describes; a PD node needs at least 2 GPUs (prefill "
        "and decode on different GPUs).",
        "warning: the NIC mapping names NICs for GPU 0 but the topology shows no NIC, so they were not checked. "
        "Fix: capture `nvidia-smi topo -m` on the host with its NICs (driver loaded), or use "
        "pdnode_transfer_backend: mooncake_tcp on a host without RDMA.",
        "recommended: none (no split into prefill-0 4 + decode-0 4 contiguous GPUs fits this host's 1 GPU)",
    ]
    assert not advice.fits and advice.recommendation is None and advice.exit_code == 1


def test_real_1gpu_capture_smallest_pd_plan_still_does_not_fit():
    advice = advise(topo(REAL_1GPU), pd([0], [1]), None)
    assert advice.lines()[3:8] == [
        "prefill-0  0                0     0-15  single GPU",
        "decode-0   1 (not on host)  -     -     -",
        "NICs: not checked (no GPU->NIC mapping given)",
        "warning: the plan needs 2 GPUs (prefill-0 0, decode-0 1) but the host has 1 (GPU 0): GPU 1 is not on this "
        "host. Fix: run against the host the inventory describes; a PD node needs at least 2 GPUs (prefill and "
        "decode on different GPUs).",
        "recommended: none (no split into prefill-0 1 + decode-0 1 contiguous GPUs fits this host's 1 GPU)",
    ]
    assert advice.exit_code == 1


def test_real_2gpu_capture_reports_what_is_there_and_what_would_fit(gpu01_plan):
    advice = advise(topo(REAL_2GPU), gpu01_plan.services, None)
    assert advice.lines() == [
        "topology: 2 GPUs (0-1); NUMA node 0: GPUs 0-1; no NICs",
        "instance   GPUs                   NUMA  CPUs  interconnect",
        "---------  ---------------------  ----  ----  ------------",
        "prefill-0  0-3 (2-3 not on host)  0     0-31  NV18 x1",
        "decode-0   4-7 (not on host)      -     -     -",
        "NICs: not checked (no GPU->NIC mapping given)",
        "warning: the plan needs 8 GPUs (prefill-0 0-3, decode-0 4-7) but the host has 2 (GPUs 0-1): GPUs 2-7 are not "
        "on this host. Fix: run against the host the inventory describes, or plan at most 2 GPUs in all (e.g. "
        "pdnode_prefill_instances[0].gpus: [0], pdnode_decode_instances[0].gpus: [1]).",
        "recommended: none (no split into prefill-0 4 + decode-0 4 contiguous GPUs fits this host's 2 GPUs)",
    ]
    assert advice.instances["prefill-0"].present == [0, 1] and advice.instances["decode-0"].present == []
    assert advice.exit_code == 1


def test_real_2gpu_capture_one_plus_one_is_already_best():
    advice = advise(topo(REAL_2GPU), pd([0], [1]), None)
    assert advice.lines() == [
        "topology: 2 GPUs (0-1); NUMA node 0: GPUs 0-1; no NICs",
        "instance   GPUs  NUMA  CPUs  interconnect",
        "---------  ----  ----  ----  ------------",
        "prefill-0  0     0     0-31  single GPU",
        "decode-0   1     0     0-31  single GPU",
        "NICs: not checked (no GPU->NIC mapping given)",
        "no warnings",
        "recommended: prefill-0 GPU 0, decode-0 GPU 1 (the plan's placement)",
        "  prefill-0: CPUAffinity=0-31 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=0-31 NUMAPolicy=preferred NUMAMask=0",
    ]
    assert advice.exit_code == 0
    assert advice.affinity["decode-0"] == {"numa_nodes": [0], "CPUAffinity": "0-31", "NUMAPolicy": "preferred",
                                         "NUMAMask": "0", "note": None}


def test_real_2gpu_capture_swapped_roles_are_equally_good():
    advice = advise(topo(REAL_2GPU), pd([1], [0]), None)
    assert advice.lines()[7] == "recommended: prefill-0 GPU 1, decode-0 GPU 0 (the plan's placement)"
    assert advice.exit_code == 0


def test_real_2gpu_preflight_report_topology_gives_the_same_advice():
    """The preflight role keeps hostfacts' parse in .cache/preflight/<host>.json (facts.topology):
    advise() takes it as it is (real report of the same 2-GPU run)."""
    report = json.loads((FIX / "h200-2gpu" / "preflight-report.json").read_text())
    plan = pd([0], [1])
    assert advise(report["facts"]["topology"], plan, None).lines() == advise(topo(REAL_2GPU), plan, None).lines()


# --- the HAND-MADE 8-GPU HGX topology (not a capture) -------------------------------------

def test_handmade_hgx8_gpu01_plan_is_the_recommended_one(gpu01_plan):
    advice = advise(topo(HANDMADE_HGX8), gpu01_plan.services, gpu01_plan.settings["pdnode_ib_devices"])
    assert advice.lines() == [
        "topology: 8 GPUs (0-7); NUMA node 0: GPUs 0-3; NUMA node 1: GPUs 4-7; 8 NICs",
        "instance   GPUs  NUMA  CPUs            interconnect",
        "---------  ----  ----  --------------  ------------",
        "prefill-0  0-3   0     0-55,112-167    NV18 x6",
        "decode-0   4-7   1     56-111,168-223  NV18 x6",
        "NICs: 8 GPU->NIC pairs, all on the GPU's NUMA node (PXB x8)",
        "no warnings",
        "recommended: prefill-0 GPUs 0-3, decode-0 GPUs 4-7 (the plan's placement)",
        "  prefill-0: CPUAffinity=0-55,112-167 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=56-111,168-223 NUMAPolicy=preferred NUMAMask=1",
    ]
    assert advice.exit_code == 0 and advice.plan_is_recommended


def test_handmade_hgx8_swapped_roles_are_equally_good(gpu01_plan):
    advice = advise(topo(HANDMADE_HGX8), pd([4, 5, 6, 7], [0, 1, 2, 3]),
                    gpu01_plan.settings["pdnode_ib_devices"])
    assert advice.lines()[7] == "recommended: prefill-0 GPUs 4-7, decode-0 GPUs 0-3 (the plan's placement)"
    assert advice.exit_code == 0


def test_handmade_hgx8_two_plus_two_across_numa_nodes_warns_and_moves_one_role():
    nics = {g: f"mlx5_{g}" for g in range(8)}
    advice = advise(topo(HANDMADE_HGX8), pd([3, 4], [5, 6]), nics)
    assert advice.lines()[3:] == [
        "prefill-0  3-4   0,1   0-223           NV18 x1",
        "decode-0   5-6   1     56-111,168-223  NV18 x1",
        "NICs: 4 GPU->NIC pairs, all on the GPU's NUMA node (PXB x4)",
        "warning: prefill-0 GPUs 3-4 span NUMA nodes 0,1 while a placement keeps each instance on one NUMA node. Fix: "
        "pdnode_prefill_instances[0].gpus: [2, 3] (NUMA 0).",
        "recommended: prefill-0 GPUs 2-3, decode-0 GPUs 5-6 (better: each instance on one NUMA node)",
        "  prefill-0: CPUAffinity=0-55,112-167 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=56-111,168-223 NUMAPolicy=preferred NUMAMask=1",
    ]
    assert advice.exit_code == 1


def test_handmade_hgx8_nic_mapped_across_the_sockets(gpu01_plan):
    nics = {**gpu01_plan.settings["pdnode_ib_devices"], 4: "mlx5_0"}
    advice = advise(topo(HANDMADE_HGX8), gpu01_plan.services, nics)
    assert advice.lines()[5:] == [
        "NICs: 8 GPU->NIC pairs, 1 on another NUMA node (PXB x7, SYS x1)",
        "warning: decode-0 GPU 4 -> mlx5_0 crosses SYS: mlx5_0 is on NUMA node 0, GPU 4 on NUMA node 1 (RDMA "
        "transfers of the KV cache cross the sockets). Fix: map GPU 4 to mlx5_4 (PXB, NUMA node 1) in "
        "pdnode_ib_devices.",
        "recommended: prefill-0 GPUs 0-3, decode-0 GPUs 4-7 (the plan's placement)",
        "  prefill-0: CPUAffinity=0-55,112-167 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=56-111,168-223 NUMAPolicy=preferred NUMAMask=1",
        "  pdnode_ib_devices: 4: mlx5_4 (PXB, was mlx5_0)",
    ]
    check = next(c for c in advice.nic_checks if c.gpu == 4)
    assert (check.link, check.gpu_numa, check.nic_numa, check.same_numa) == ("SYS", [1], [0], False)
    assert advice.plan_is_recommended and advice.exit_code == 1


def test_handmade_hgx8_six_plus_two_must_span_nodes_so_no_numa_warning():
    advice = advise(topo(HANDMADE_HGX8), pd([0, 1, 2, 3, 4, 5], [6, 7]), None)
    assert advice.lines()[3:] == [
        "prefill-0  0-5   0,1   0-223           NV18 x15",
        "decode-0   6-7   1     56-111,168-223  NV18 x1",
        "NICs: not checked (no GPU->NIC mapping given)",
        "no warnings",
        "recommended: prefill-0 GPUs 0-5, decode-0 GPUs 6-7 (the plan's placement)",
        "  prefill-0: CPUAffinity=0-223 (spans NUMA nodes 0,1: no NUMAPolicy)",
        "  decode-0: CPUAffinity=56-111,168-223 NUMAPolicy=preferred NUMAMask=1",
    ]
    assert advice.exit_code == 0


def test_handmade_hgx8_plan_gpus_beyond_the_host_get_a_split_of_this_host():
    advice = advise(topo(HANDMADE_HGX8), pd([8, 9], [10, 11]), None)
    assert advice.warnings == [
        "the plan needs 4 GPUs (prefill-0 8-9, decode-0 10-11) but the host has 8 (GPUs 0-7): GPUs 8-11 are not on "
        "this host. Fix: use GPUs this host has: pdnode_prefill_instances[0].gpus: [4, 5], pdnode_decode_instances[0].gpus: [6, 7]."]
    assert advice.lines()[-3] == ("recommended: prefill-0 GPUs 4-5, decode-0 GPUs 6-7 (the plan's GPUs are not all "
                                  "on this host)")
    assert advice.exit_code == 1


# --- CONSTRUCTED topologies: the warnings --------------------------------------------------

def test_constructed_bridged_pcie_interconnect_worse_than_other_groups():
    advice = advise(CONSTRUCTED_BRIDGED, pd([1, 2], [5, 6]), None)
    assert advice.lines() == [
        "topology: 8 GPUs (0-7); NUMA node 0: GPUs 0-3; NUMA node 1: GPUs 4-7; 8 NICs",
        "instance   GPUs  NUMA  CPUs   interconnect",
        "---------  ----  ----  -----  ------------",
        "prefill-0  1-2   0     0-15   NODE x1",
        "decode-0   5-6   1     16-31  NODE x1",
        "NICs: not checked (no GPU->NIC mapping given)",
        "warning: prefill-0 GPUs 1-2 are linked by NODE x1, worse than GPUs 0-1 (NV12 x1). Fix: pdnode_prefill_instances[0].gpus: "
        "[0, 1] (NUMA 0), pdnode_decode_instances[0].gpus: [4, 5] (NUMA 1).",
        "warning: decode-0 GPUs 5-6 are linked by NODE x1, worse than GPUs 4-5 (NV12 x1). Fix: pdnode_prefill_instances[0].gpus: "
        "[0, 1] (NUMA 0), pdnode_decode_instances[0].gpus: [4, 5] (NUMA 1).",
        "recommended: prefill-0 GPUs 0-1, decode-0 GPUs 4-5 (better GPU links: NV12 x2 instead of NODE x2)",
        "  prefill-0: CPUAffinity=0-15 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=16-31 NUMAPolicy=preferred NUMAMask=1",
    ]
    assert advice.exit_code == 1


def test_constructed_bridged_pcie_role_split_across_numa_nodes():
    advice = advise(CONSTRUCTED_BRIDGED, pd([2, 3, 4], [5, 6, 7]), None)
    assert advice.lines()[3:] == [
        "prefill-0  2-4   0,1   0-31   NV12 x1, SYS x2",
        "decode-0   5-7   1     16-31  NV12 x1, NODE x2",
        "NICs: not checked (no GPU->NIC mapping given)",
        "warning: prefill-0 GPUs 2-4 span NUMA nodes 0,1 while a placement keeps each instance on one NUMA node. Fix: "
        "pdnode_prefill_instances[0].gpus: [1, 2, 3] (NUMA 0).",
        "warning: prefill-0 GPUs 2-4 are linked by NV12 x1, SYS x2, worse than GPUs 1-3 (NV12 x1, NODE x2). Fix: "
        "pdnode_prefill_instances[0].gpus: [1, 2, 3] (NUMA 0).",
        "recommended: prefill-0 GPUs 1-3, decode-0 GPUs 5-7 (better: each instance on one NUMA node)",
        "  prefill-0: CPUAffinity=0-15 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=16-31 NUMAPolicy=preferred NUMAMask=1",
    ]
    assert advice.instances["prefill-0"].numa == [0, 1] and advice.exit_code == 1


def test_constructed_nics_only_on_one_socket_warn_without_an_inventory_fix():
    numa = [0, 0, 1, 1]
    text = render_topo(numa, lambda a, b: "NODE" if numa[a] == numa[b] else "SYS", nic_gpu=(0, 1))
    advice = advise(text, pd([0, 1], [2, 3]), {0: "mlx5_0", 1: "mlx5_1", 2: "mlx5_0", 3: "mlx5_1"})
    assert advice.lines()[5:9] == [
        "NICs: 4 GPU->NIC pairs, 2 on another NUMA node (PXB x2, SYS x2)",
        "warning: decode-0 GPU 2 -> mlx5_0 crosses SYS: mlx5_0 is on NUMA node 0, GPU 2 on NUMA node 1 (RDMA "
        "transfers of the KV cache cross the sockets). Fix: none in the inventory: no NIC of this host is on NUMA "
        "node 1; add one on that socket or accept the cross-socket path.",
        "warning: decode-0 GPU 3 -> mlx5_1 crosses SYS: mlx5_1 is on NUMA node 0, GPU 3 on NUMA node 1 (RDMA "
        "transfers of the KV cache cross the sockets). Fix: none in the inventory: no NIC of this host is on NUMA "
        "node 1; add one on that socket or accept the cross-socket path.",
        "recommended: prefill-0 GPUs 0-1, decode-0 GPUs 2-3 (the plan's placement)",
    ]
    # Nothing better exists: the placement is the best this hardware allows.
    assert advice.exit_code == 0


def test_constructed_nic_on_the_other_socket_with_a_local_one_available():
    nics = {g: f"mlx5_{g}" for g in range(8)} | {1: "mlx5_6"}
    advice = advise(CONSTRUCTED_BRIDGED, pd([0, 1], [4, 5]), nics)
    assert advice.warnings == [
        "prefill-0 GPU 1 -> mlx5_6 crosses SYS: mlx5_6 is on NUMA node 1, GPU 1 on NUMA node 0 (RDMA transfers of "
        "the KV cache cross the sockets). Fix: map GPU 1 to mlx5_1 (PXB, NUMA node 0) in pdnode_ib_devices."]
    assert advice.lines()[-1] == "  pdnode_ib_devices: 1: mlx5_1 (PXB, was mlx5_6)"
    assert advice.exit_code == 1


def test_constructed_unknown_numa_gives_cpus_but_no_numa_policy():
    text = render_topo([None, None], lambda a, b: "NV18")
    advice = advise(text, pd([0], [1]), None)
    assert advice.lines()[0] == "topology: 2 GPUs (0-1); NUMA node unknown: GPUs 0-1; no NICs"
    assert advice.lines()[3] == "prefill-0  0     ?     0-15  single GPU"
    assert advice.lines()[-1] == "  decode-0: CPUAffinity=0-15 (NUMA node unknown: no NUMAPolicy)"
    assert advice.exit_code == 0


def test_advise_rejects_unusable_inputs():
    with pytest.raises(ValueError, match="lists no GPU"):
        advise(parse_topo_matrix("not a topology"), pd([0], [1]), None)
    with pytest.raises(ValueError, match=r"^service 'prefill-0': gpus must be a non-empty list of GPU ids, not \[\]$"):
        advise(topo(REAL_2GPU), {"prefill-0": {"id": "prefill-0", "role": "prefill", "gpus": []}}, None)
    with pytest.raises(ValueError, match="^the plan has no prefill or decode service$"):
        advise(topo(REAL_2GPU), {"router": pd([0], [1])["router"]}, None)


def test_engine_instances_name_the_inventory_entry_per_role():
    services = pd([0], [1], [2], [3], decode_from=2)
    assert [(e["id"], e["field"]) for e in engine_instances(services)] == [
        ("prefill-0", "pdnode_prefill_instances[0]"), ("prefill-1", "pdnode_prefill_instances[1]"),
        ("decode-0", "pdnode_decode_instances[0]"), ("decode-1", "pdnode_decode_instances[1]")]


# --- the command line --------------------------------------------------------------------

def _main(capsys, *argv):
    rc = cli.main(["placement", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_handmade_hgx8_exit_0_with_the_table(capsys):
    rc, out, err = _main(capsys, "inventories/gpu01", "--topo", str(HANDMADE_HGX8.relative_to(ROOT)))
    assert rc == 0 and err == ""
    assert out.splitlines() == [
        "host gpu01: plan from inventories/gpu01 (pdnode_gpu_count=8), topology from "
        "tests/fixtures/nvidia-smi/handmade/topo-m-handmade-hgx8.txt",
        "topology: 8 GPUs (0-7); NUMA node 0: GPUs 0-3; NUMA node 1: GPUs 4-7; 8 NICs",
        "instance   GPUs  NUMA  CPUs            interconnect",
        "---------  ----  ----  --------------  ------------",
        "prefill-0  0-3   0     0-55,112-167    NV18 x6",
        "decode-0   4-7   1     56-111,168-223  NV18 x6",
        "NICs: 8 GPU->NIC pairs, all on the GPU's NUMA node (PXB x8)",
        "no warnings",
        "recommended: prefill-0 GPUs 0-3, decode-0 GPUs 4-7 (the plan's placement)",
        "  prefill-0: CPUAffinity=0-55,112-167 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=56-111,168-223 NUMAPolicy=preferred NUMAMask=1",
    ]


def test_cli_handmade_hgx8_json(capsys):
    rc, out, _ = _main(capsys, str(GPU01), "--topo", str(HANDMADE_HGX8), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["exit_code"] == 0 and doc["schema"] == "pdnode.placement/2"
    assert doc["recommendation"]["gpus"] == {"prefill-0": [0, 1, 2, 3], "decode-0": [4, 5, 6, 7]}
    assert doc["recommendation"]["affinity"]["decode-0"]["CPUAffinity"] == "56-111,168-223"
    assert doc["instances"]["prefill-0"]["links"] == {"NV18": 6}
    assert doc["instances"]["decode-0"]["field"] == "pdnode_decode_instances[0]"
    assert doc["host"] == "gpu01" and doc["topology"]["numa_nodes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}


def test_cli_nic_across_sockets_from_host_vars_exits_1(capsys, tmp_path):
    inv = tmp_path / "inv"
    subprocess.run(["cp", "-r", str(GPU01), str(inv)], check=True)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu01.yml").write_text(
        "---\npdnode_ib_devices: {0: mlx5_0, 1: mlx5_1, 2: mlx5_2, 3: mlx5_3, 4: mlx5_4, 5: mlx5_5, 6: mlx5_6, "
        "7: mlx5_2}\n")
    rc, out, _ = _main(capsys, str(inv), "--topo", str(HANDMADE_HGX8))
    assert rc == 1
    assert ("warning: decode-0 GPU 7 -> mlx5_2 crosses SYS: mlx5_2 is on NUMA node 0, GPU 7 on NUMA node 1 (RDMA "
            "transfers of the KV cache cross the sockets). Fix: map GPU 7 to mlx5_7 (PXB, NUMA node 1) in "
            "pdnode_ib_devices.") in out.splitlines()


def test_cli_real_2gpu_capture_exits_1_saying_the_plan_does_not_fit(capsys):
    rc, out, _ = _main(capsys, "inventories/gpu01", "--topo", str(REAL_2GPU))
    assert rc == 1
    assert "warning: the plan needs 8 GPUs (prefill-0 0-3, decode-0 4-7) but the host has 2 (GPUs 0-1)" in out


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "placement", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=30)


@pytest.mark.parametrize(("argv", "line"), [
    (["inventories/gpu01", "--topo", "/nonexistent/topo.txt"],
     "pdnode placement: could not run: cannot read /nonexistent/topo.txt: No such file or directory"),
    (["inventories/gpu01", "--topo", "tests/fixtures/nvidia-smi/h200-2gpu/query-gpu.txt"],
     "pdnode placement: could not run: tests/fixtures/nvidia-smi/h200-2gpu/query-gpu.txt is not `nvidia-smi topo "
     "-m` output (no GPU0 header row and matrix)"),
    (["inventories/nonexistent", "--topo", "tests/fixtures/nvidia-smi/h200-2gpu/topo-m.txt"], None),
])
def test_cli_unreadable_inputs_exit_2_with_one_line(argv, line):
    r = _run(*argv)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0] == line if line else lines[0].startswith("pdnode placement: could not run: ")


def test_cli_invalid_inventory_exits_2_with_one_line(tmp_path):
    inv = tmp_path / "inv"
    subprocess.run(["cp", "-r", str(GPU01), str(inv)], check=True)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu01.yml").write_text("---\npdnode_decode_instances[0].gpus: [3, 4, 5, 6]\n")
    r = _run(str(inv), "--topo", str(HANDMADE_HGX8))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"pdnode placement: could not run: the inventory {inv} is invalid (1 problem; `pdnode check {inv}` lists them)"]


# --- several instances per role (the instances plan) ------------------------------------------

def test_handmade_hgx8_second_prefill_instance_across_sockets_is_moved_alone():
    advice = advise(topo(HANDMADE_HGX8), pd([0, 1], [3, 4], [5, 6], decode_from=2), None)
    assert advice.lines()[3:] == [
        "prefill-0  0-1   0     0-55,112-167    NV18 x1",
        "prefill-1  3-4   0,1   0-223           NV18 x1",
        "decode-0   5-6   1     56-111,168-223  NV18 x1",
        "NICs: not checked (no GPU->NIC mapping given)",
        "warning: prefill-1 GPUs 3-4 span NUMA nodes 0,1 while a placement keeps each instance on one NUMA node. "
        "Fix: pdnode_prefill_instances[1].gpus: [2, 3] (NUMA 0).",
        "recommended: prefill-0 GPUs 0-1, prefill-1 GPUs 2-3, decode-0 GPUs 5-6 (better: each instance on one NUMA "
        "node)",
        "  prefill-0: CPUAffinity=0-55,112-167 NUMAPolicy=preferred NUMAMask=0",
        "  prefill-1: CPUAffinity=0-55,112-167 NUMAPolicy=preferred NUMAMask=0",
        "  decode-0: CPUAffinity=56-111,168-223 NUMAPolicy=preferred NUMAMask=1",
    ]
    assert advice.exit_code == 1


def test_handmade_hgx8_eight_single_gpu_instances_are_the_recommended_placement():
    advice = advise(topo(HANDMADE_HGX8), pd(*[[g] for g in range(8)], decode_from=4), None)
    assert list(advice.instances) == [f"prefill-{i}" for i in range(4)] + [f"decode-{i}" for i in range(4)]
    assert advice.plan_is_recommended and advice.warnings == [] and advice.exit_code == 0
    assert advice.affinity["decode-3"]["NUMAMask"] == "1" and advice.affinity["prefill-0"]["NUMAMask"] == "0"


def test_cli_two_prefill_instances_one_decode(capsys):
    rc, out, err = _main(capsys, "inventories/gpu01-2p1d", "--topo", str(HANDMADE_HGX8.relative_to(ROOT)))
    assert rc == 0 and err == ""
    assert out.splitlines()[2:7] == [
        "instance   GPUs  NUMA  CPUs            interconnect",
        "---------  ----  ----  --------------  ------------",
        "prefill-0  0-1   0     0-55,112-167    NV18 x1",
        "prefill-1  2-3   0     0-55,112-167    NV18 x1",
        "decode-0   4-7   1     56-111,168-223  NV18 x6",
    ]
