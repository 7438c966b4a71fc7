"""pdnode.preflight: the verdicts, over facts parsed from real H200 output and from the
hand-made 8-GPU fixtures (labelled handmade)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from pdnode.core.host import facts as hf
from pdnode.core.host import preflight as pf
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi"
H200 = FIX / "h200-1gpu"
HGX = FIX / "handmade"
ROOT = Path(__file__).resolve().parents[1]


REAL_QUERY_HEADER = (H200 / "query-gpu.txt").read_text().splitlines(keepends=True)[0]


def r(path: Path, rc: int = 0) -> dict:
    return {"rc": rc, "stdout": path.read_text(), "stderr": ""}


def ok(stdout: str = "", rc: int = 0) -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": ""}


CUDA_OK_1 = ok('{"ok": true, "device_count": 1, "driver_version": 13000, '
               '"devices": [{"ordinal": 0, "ok": true}]}')


@pytest.fixture
def h200_raw() -> dict:
    """The real H200 capture, on a host that otherwise looks like a production node."""
    return {
        "os": {"id": "ubuntu", "version": "24.04", "major": "24"},
        "pid1": ok("systemd"), "systemd_dir": ok(),
        "query_gpu": r(H200 / "query-gpu.txt"), "smi_q": r(H200 / "nvidia-smi-q.txt"),
        "topo": r(H200 / "topo-m.txt"), "proc_version": r(H200 / "proc-driver-nvidia-version.txt"),
        "nvswitch_proc": ok(""), "pci": ok("/sys/bus/pci/devices/0000:00:06.0 0x10de 0x030200 0x2335"),
        "tcp": r(H200 / "proc-net-tcp.txt"), "tcp6": r(H200 / "proc-net-tcp6.txt"),
        "limits": r(H200 / "ulimit-l.txt"), "df": r(H200 / "df.txt"), "cuda": CUDA_OK_1,
        "model": {"path": "/models/m", "exists": True, "isdir": True, "config_json": True},
    }


def one_gpu_expect(**over) -> dict:
    exp = dict(gpu_count=1, gpu_model="NVIDIA H200", driver_branch=580, gpu_ids=[0],
               ports={"pdnode_prefill_port": 30000, "pdnode_router_port": 8000}, nics={},
               transfer_backend="mooncake_tcp", model_path="/models/m", own_unit_prefix="sglang-pd",
               min_free_disk_gb=30)
    exp.update(over)
    return pf.expectations(None, exp)


def lines(problems) -> list[str]:
    return [p.line for p in problems]


def checks(problems) -> list[tuple[str, str]]:
    return [(p.severity, p.check) for p in problems]


def test_real_h200_passes(h200_raw):
    assert pf.judge(hf.collect(h200_raw), one_gpu_expect()) == []


def test_real_h200_as_captured_fails_only_on_systemd(h200_raw):
    """On the borrowed machine itself PID 1 is the sandbox's process_api."""
    h200_raw["pid1"], h200_raw["systemd_dir"] = ok("process_api"), ok(rc=1)
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert lines(problems) == [
        "ERROR init.pid1='process_api': systemd is not PID 1 (no /run/systemd/system): the node's services are "
        "systemd units. Fix: run on a host booted with systemd (in a container: systemd as PID 1)."]


def test_real_h200_against_the_8_gpu_plan(h200_raw):
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect(gpu_count=8, gpu_ids=list(range(8))))
    assert lines(problems) == [
        "ERROR gpu.count=1: the host has 1 NVIDIA GPU(s) (nvidia-smi) but the inventory expects 8 "
        "(pdnode_gpu_count); the plan uses GPU ids [1, 2, 3, 4, 5, 6, 7] that do not exist. Fix: run against the "
        "right host, or correct pdnode_gpu_count and the instances' gpus."]


def test_wrong_model_and_branch(h200_raw):
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect(gpu_model="NVIDIA H100 80GB HBM3", driver_branch=570))
    assert checks(problems) == [("error", "driver.version"), ("error", "gpu.model")]
    assert "'580.159.04'" in problems[0].line and "pinned branch 570" in problems[0].line
    assert problems[1].line.startswith("ERROR gpu.model='NVIDIA H200': GPU model differs from "
                                       "pdnode_gpu_model='NVIDIA H100 80GB HBM3'")


# --- GPU memory against the table pdnode check's capacity check used ---------------------------

def _with_memory(raw: dict, mib: int, name: str = "NVIDIA H200") -> dict:
    text = (H200 / "query-gpu.txt").read_text()
    assert ", 143771 MiB," in text and "NVIDIA H200," in text  # the real capture, edited below
    raw["query_gpu"] = ok(text.replace(", 143771 MiB,", f", {mib} MiB,").replace("NVIDIA H200,", f"{name},"))
    return raw


def test_real_h200_memory_matches_the_table(h200_raw):
    facts = hf.collect(h200_raw)
    assert facts["gpus"][0]["memory_total_mib"] == 143771
    assert pf.judge(facts, one_gpu_expect()) == []


def test_gpu_memory_within_two_percent_of_the_table_passes(h200_raw):
    # 2% of 143771 MiB is 2875 MiB: 140900 is 2.0% below, 146600 2.0% above
    for mib in (140900, 146600):
        assert pf.judge(hf.collect(_with_memory(h200_raw, mib)), one_gpu_expect()) == [], mib


def test_gpu_memory_below_the_table_is_an_error(h200_raw):
    problems = pf.judge(hf.collect(_with_memory(h200_raw, 139000)), one_gpu_expect())
    assert lines(problems) == [
        "ERROR gpu.memory_total=139000: GPUs [0] report 139000 MiB, -3.3% from the 143771 MiB that "
        "src/pdnode/data/gpu-memory.json gives 'NVIDIA H200' and that pdnode check's capacity check used. "
        "Fix: check for ECC, MIG or a vGPU slice on the host; if 139000 MiB is the model's full memory, correct its "
        "memory_total_mib in src/pdnode/data/gpu-memory.json and run pdnode check."]


def test_gpu_memory_above_the_table_is_a_warning(h200_raw):
    problems = pf.judge(hf.collect(_with_memory(h200_raw, 150000)), one_gpu_expect())
    assert checks(problems) == [("warning", "gpu.memory_total")]
    assert problems[0].line.endswith("Fix: correct memory_total_mib in src/pdnode/data/gpu-memory.json to 150000.")


def test_gpu_model_missing_from_the_table_is_a_warning_with_the_hosts_value(h200_raw):
    raw = _with_memory(h200_raw, 95830, name="NVIDIA H100 NVL")
    problems = pf.judge(hf.collect(raw), one_gpu_expect(gpu_model="NVIDIA H100 NVL"))
    assert lines(problems) == [
        "WARNING gpu.memory_table='NVIDIA H100 NVL': pdnode_gpu_model is not in src/pdnode/data/gpu-memory.json, "
        "so pdnode check could not judge whether the model's weights fit the GPUs. Fix: add \"NVIDIA H100 NVL\": "
        "{\"memory_total_mib\": 95830, \"_source\": \"<where the number comes from>\"} to "
        "src/pdnode/data/gpu-memory.json (docs/capacity.md)."]


def test_gpu_memory_is_not_judged_on_gpus_of_another_model(h200_raw):
    # the wrong model is its own error; its memory is not compared with the planned model's
    problems = pf.judge(hf.collect(_with_memory(h200_raw, 81559, name="NVIDIA H100 80GB HBM3")), one_gpu_expect())
    assert checks(problems) == [("error", "gpu.model")]


def test_unsupported_os(h200_raw):
    h200_raw["os"] = {"id": "ubuntu", "version": "20.04", "major": "20"}
    assert checks(pf.judge(hf.collect(h200_raw), one_gpu_expect())) == [("error", "os")]
    h200_raw["os"] = {"id": "debian", "version": "12.11", "major": "12"}
    assert pf.judge(hf.collect(h200_raw), one_gpu_expect()) == []


@pytest.mark.parametrize(("arch", "package", "refused"), [
    ("aarch64", "smg", True), ("x86_64", "smg", False), ("aarch64", "sglang-router", False), ("aarch64", None, False)])
def test_smg_is_refused_where_it_has_no_wheel(h200_raw, arch, package, refused):
    h200_raw["os"] = {"id": "ubuntu", "version": "24.04", "major": "24", "arch": arch}
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect(router_package=package))
    assert [p.line for p in problems] == ([
        "ERROR router_package='smg': has no wheel for aarch64 (x86_64 only; docs/smg.md). "
        "Fix: set pdnode_router_package: sglang-router for this host."] if refused else [])


def test_the_plan_tells_preflight_its_router_package():
    plan = build_plan(load_inventory(ROOT / "inventories" / "gpu01", "gpu01").variables, "gpu01").as_dict()
    assert pf.expectations(plan)["router_package"] == "smg"


def test_cuda_failures(h200_raw):
    h200_raw["cuda"] = ok('{"ok": false, "error": "cuInit: 802 system not yet initialized", "devices": []}')
    (p,) = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert p.check == "cuda.init" and "802 system not yet initialized" in p.line
    h200_raw["cuda"] = ok('{"ok": true, "device_count": 0, "devices": []}')
    (p,) = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert p.line.startswith("ERROR cuda.device_count=0: CUDA sees 0 device(s) but nvidia-smi lists 1")


def test_persistence_and_mig(h200_raw):
    q = (H200 / "query-gpu.txt").read_text().replace("Enabled", "Disabled")
    h200_raw["query_gpu"] = ok(q)
    smi = (H200 / "nvidia-smi-q.txt").read_text().replace(
        "    MIG Mode\n        Current                                        : Disabled",
        "    MIG Mode\n        Current                                        : Enabled")
    h200_raw["smi_q"] = ok(smi)
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert checks(problems) == [("error", "gpu0.mig"), ("warning", "gpu.persistence_mode")]


def test_query_header_that_moved_a_column_is_one_error(h200_raw):
    """A driver printing the columns in another order: nothing is read under the wrong name,
    and the verdict says expected vs got in one line."""
    q = (H200 / "query-gpu.txt").read_text().replace("name, uuid", "uuid, name", 1)
    h200_raw["query_gpu"] = ok(q)
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert checks(problems) == [("error", "gpu.query_header")]
    assert problems[0].line.startswith(
        "ERROR gpu.query_header=\"nvidia-smi --query-gpu header: expected 'index, name, uuid, pci.bus_id, "
        "driver_version, memory.total, persistence_mode, compute_cap, compute_mode', got 'index, uuid, name, "
        "pci.bus_id, driver_version, memory.total, persistence_mode, compute_cap, compute_mode'\": nvidia-smi "
        "printed other columns than the preflight asked for")
    assert "\n" not in problems[0].line


def test_no_driver_counts_gpus_on_pci():
    raw = {"os": {"id": "debian", "version": "12.11", "major": "12"}, "pid1": ok("systemd"), "systemd_dir": ok(),
           "query_gpu": {"rc": 127, "stdout": "", "stderr": "nvidia-smi: command not found"},
           "pci": r(HGX / "pci-handmade-hgx8.txt"), "nvswitch_proc": ok(rc=2)}
    exp = one_gpu_expect(gpu_count=8, gpu_ids=list(range(8)), model_path=None)
    assert checks(pf.judge(hf.collect(raw), exp)) == [("warning", "driver")]


def test_container_without_gpu_against_8_gpu_plan():
    """What molecule/preflight asserts: a GPU-less systemd container and an 8-GPU plan."""
    raw = {"os": {"id": "debian", "version": "12.11", "major": "12"}, "pid1": ok("systemd"), "systemd_dir": ok(),
           "query_gpu": {"rc": 127, "stdout": "", "stderr": "nvidia-smi: command not found"},
           "pci": ok(""), "infiniband": ok(rc=2),
           "model": {"path": "/models/DeepSeek-V3", "exists": False, "isdir": False, "config_json": False}}
    exp = one_gpu_expect(gpu_count=8, gpu_ids=list(range(8)), transfer_backend="mooncake",
                         nics={str(i): f"mlx5_{i}" for i in range(8)}, model_path="/models/DeepSeek-V3")
    problems = pf.judge(hf.collect(raw), exp)
    assert checks(problems) == [("error", "gpu.count")] + [("error", f"nic.mlx5_{i}") for i in range(8)] + \
        [("error", "model.path"), ("warning", "driver")]
    assert problems[0].line.startswith("ERROR gpu.count=0: the host has 0 NVIDIA GPU(s) (PCI scan, no NVIDIA driver "
                                       "loaded) but the inventory expects 8")


def test_standin_engine_host_needs_no_gpu():
    """The demo node (pdnode_engine: sim) on a GPU-less container: only host checks apply."""
    hv = load_inventory(Path(__file__).resolve().parents[1] / "inventories" / "demo")
    plan = build_plan(hv.variables, hv.host).as_dict()
    raw = {"os": {"id": "debian", "version": "12.11", "major": "12"}, "pid1": ok("systemd"), "systemd_dir": ok(),
           "query_gpu": {"rc": 127, "stdout": "", "stderr": "nvidia-smi: command not found"},
           "pci": ok(""), "infiniband": ok(rc=2),
           "model": {"path": plan["settings"]["pdnode_model_path"], "exists": False, "isdir": False,
                     "config_json": False}}
    exp = pf.expectations(plan)
    assert exp["engine"] == "sim"
    # The model directory is still checked; GPUs, driver, fabric, CUDA and NICs are not.
    assert checks(pf.judge(hf.collect(raw), exp)) == [("error", "model.path")]
    exp_real = dict(exp, engine="sglang")
    assert ("error", "gpu.count") in checks(pf.judge(hf.collect(raw), exp_real))


# --- NVSwitch host (hand-made 8-GPU fixtures) ----------------------------------------------------

@pytest.fixture
def hgx_raw() -> dict:
    cuda = ok('{"ok": true, "device_count": 8, "devices": ' +
              str([{"ordinal": i, "ok": True} for i in range(8)]).replace("True", "true").replace("'", '"') + "}")
    return {
        "os": {"id": "ubuntu", "version": "22.04", "major": "22"}, "pid1": ok("systemd"), "systemd_dir": ok(),
        # The hand-made rows under the real driver's header (the role asks --format=csv).
        "query_gpu": ok(REAL_QUERY_HEADER + (HGX / "query-gpu-handmade-hgx8.txt").read_text()),
        "smi_q": r(HGX / "nvidia-smi-q-handmade-hgx8.txt"),
        "topo": r(HGX / "topo-m-handmade-hgx8.txt"), "proc_version": r(H200 / "proc-driver-nvidia-version.txt"),
        "nvswitch_proc": r(HGX / "nvswitch-devices-handmade-hgx8.txt"), "pci": r(HGX / "pci-handmade-hgx8.txt"),
        "fabricmanager": ok("active"), "infiniband": r(HGX / "sys-infiniband-handmade-hgx8.txt"),
        "limits": ok("Max locked memory         unlimited            unlimited            bytes\n"),
        "cuda": cuda, "model": {"path": "/models/m", "exists": True, "isdir": True, "config_json": True},
    }


def hgx_expect(**over) -> dict:
    base = dict(gpu_count=8, gpu_ids=list(range(8)), transfer_backend="mooncake",
                nics={str(i): f"mlx5_{i}" for i in range(8)})
    return one_gpu_expect(**{**base, **over})


def test_hgx_handmade_finds_fabric_and_nic_faults(hgx_raw):
    problems = pf.judge(hf.collect(hgx_raw), hgx_expect())
    assert lines(problems) == [
        "ERROR gpu5.fabric.state='In Progress': the GPU has not finished NVLink fabric registration "
        "(nvidia-smi -q, Fabric: State must be Completed). Fix: check nvidia-fabricmanager's journal; restart it, "
        "and reset the GPUs if it stays In Progress.",
        "ERROR nic.mlx5_6='port 1: DOWN/Disabled': RDMA device for GPU 6 has no ACTIVE port. Fix: check the cable "
        "and the subnet manager (ibstat; `sminfo` on InfiniBand), then re-run.",
    ]


def test_hgx_fabric_manager_down(hgx_raw):
    hgx_raw["fabricmanager"] = ok("inactive", rc=3)
    problems = pf.judge(hf.collect(hgx_raw), hgx_expect())
    assert ("error", "fabricmanager") in checks(problems)


def test_hgx_crossed_nic_mapping_is_refused_naming_the_nearer_nic(hgx_raw):
    nics = {str(i): f"mlx5_{i}" for i in range(8)}
    nics["0"], nics["4"] = "mlx5_4", "mlx5_0"
    problems = [p for p in pf.judge(hf.collect(hgx_raw), hgx_expect(nics=nics)) if p.check.startswith("nic.mlx5_")
                and p.value == "SYS"]
    assert lines(problems) == [
        "ERROR nic.mlx5_4='SYS': GPU 0 -> mlx5_4 crosses SYS while mlx5_0 is PXB from it (nvidia-smi topo -m). "
        "Fix: map GPU 0 to mlx5_0 in pdnode_ib_devices.",
        "ERROR nic.mlx5_0='SYS': GPU 4 -> mlx5_0 crosses SYS while mlx5_4 is PXB from it (nvidia-smi topo -m). "
        "Fix: map GPU 4 to mlx5_4 in pdnode_ib_devices.",
    ]


def test_a_far_nic_is_only_a_warning_when_no_usable_nic_is_nearer(hgx_raw):
    # GPU 6's own NIC (mlx5_6) has no ACTIVE port in the fixture: the nearest usable one is
    # across the switch, and the map cannot do better
    nics = {str(i): f"mlx5_{i}" for i in range(8)}
    facts = hf.collect(hgx_raw)
    nearest = [r for r in facts["nic_ranking"]["6"] if r["nic"] != "mlx5_6"][0]
    nics["6"] = nearest["nic"]
    assert nearest["link"] not in hf.GOOD_NIC_LINKS, nearest
    problems = [p for p in pf.judge(facts, hgx_expect(nics=nics)) if p.check == f"nic.{nearest['nic']}"]
    assert lines(problems) == [
        f"WARNING nic.{nearest['nic']}='{nearest['link']}': GPU 6 -> {nearest['nic']} crosses {nearest['link']} "
        "(not behind the GPU's PCIe switch: PIX/PXB), and no RDMA NIC of the host is nearer. Fix: expect slower KV "
        "transfers from this GPU; a NIC in a slot behind its PCIe switch would remove the hop.",
    ]


# --- the NIC choice over public topo captures of real 8-GPU hosts (tests/fixtures/nvidia-smi/public)

PUBLIC = FIX / "public"


def retab(text: str) -> str:
    """A post's tab expansion back to the tabs nvidia-smi prints: every cell of these
    captures sits on the 8-column grid, so a run of spaces reaching a stop was a tab."""
    out = []
    for line in text.splitlines():
        chunks = [line[i:i + 8] for i in range(0, len(line), 8)]
        out.append("".join(c.rstrip(" ") + "\t" if len(c) == 8 and c.endswith(" ") else c for c in chunks))
    return "\n".join(out) + "\n"


def public_facts(hgx_raw: dict, name: str) -> dict:
    topo = (PUBLIC / name).read_text()
    nics = hf.parse_topo_matrix(topo)["nic_names"].values()
    ib = "".join(f"/sys/class/infiniband/{n}/ports/1/state:4: ACTIVE\n/sys/class/infiniband/{n}/ports/1/"
                 "link_layer:InfiniBand\n" for n in nics)
    return hf.collect({**hgx_raw, "topo": ok(retab(topo) if "\t" not in topo else topo), "infiniband": ok(ib)})


def nic_lines(facts: dict, nics: dict[str, str]) -> list[str]:
    return [ln for ln in lines(pf.judge(facts, hgx_expect(nics=nics))) if ln.split("=")[0].split(" ")[1].startswith("nic.")]


@pytest.mark.parametrize(("capture", "own"), [
    ("dgx-a100-10nic-topo-m.txt", {g: f"mlx5_{g - g % 2}" for g in range(8)}),  # PXB, two GPUs a NIC
    ("h100-sglang30401-topo-m.txt", {g: f"mlx5_{g}" for g in range(8)}),        # PIX
    ("b300-deepep590-topo-m.txt", {g: f"mlx5_bond_{g}" for g in range(8)}),     # PXB, no PIX on this host
])
def test_real_captures_each_gpu_on_its_nearest_nic_passes(hgx_raw, capture, own):
    facts = public_facts(hgx_raw, capture)
    assert [facts["nic_ranking"][str(g)][0]["link"] for g in range(8)] == \
        [facts["topology"]["links"][f"GPU{g}"][col] for g in range(8)
         for col, name in facts["topology"]["nic_names"].items() if name == own[g]]
    assert nic_lines(facts, {str(g): nic for g, nic in own.items()}) == []


@pytest.mark.parametrize(("capture", "gpu", "far", "near"), [
    ("dgx-a100-10nic-topo-m.txt", 0, "mlx5_8", "mlx5_0 is PXB"),        # a storage NIC on the other socket
    ("h100-sglang30401-topo-m.txt", 0, "mlx5_1", "mlx5_0 is PIX"),       # the same socket, another switch
    ("h100-sglang30401-topo-m.txt", 5, "mlx5_0", "mlx5_5 is PIX"),       # across the socket
    ("b300-deepep590-topo-m.txt", 7, "mlx5_bond_3", "mlx5_bond_7 is PXB"),
])
def test_real_captures_a_far_nic_is_refused_naming_the_near_one(hgx_raw, capture, gpu, far, near):
    facts = public_facts(hgx_raw, capture)
    ranking = facts["nic_ranking"][str(gpu)]
    own = {str(g): r[0]["nic"] for g, r in ((g, facts["nic_ranking"][str(g)]) for g in range(8))}
    link = next(r["link"] for r in ranking if r["nic"] == far)
    (line,) = nic_lines(facts, {**own, str(gpu): far})
    assert line == (f"ERROR nic.{far}='{link}': GPU {gpu} -> {far} crosses {link} while {near} from it "
                    f"(nvidia-smi topo -m). Fix: map GPU {gpu} to {near.split()[0]} in pdnode_ib_devices.")


def test_hgx_missing_nic_and_memlock(hgx_raw):
    hgx_raw["limits"] = ok("Max locked memory         8388608              8388608              bytes\n")
    nics = {str(i): f"mlx5_{i}" for i in range(8)}
    nics["7"] = "mlx5_9"
    problems = pf.judge(hf.collect(hgx_raw), hgx_expect(nics=nics))
    assert ("error", "nic.mlx5_9") in checks(problems)
    assert ("warning", "memlock") in checks(problems)
    assert "present: mlx5_0, mlx5_1" in next(p.line for p in problems if p.check == "nic.mlx5_9")


# --- RoCE: the GID index Mooncake uses (issue 28, field failure 6: sglang#30737) ------------------

@pytest.fixture
def roce_raw(hgx_raw) -> dict:
    return {**hgx_raw, "infiniband": r(HGX / "sys-infiniband-handmade-roce8.txt"),
            "ib_gids": r(HGX / "sys-gids-handmade-roce8.txt")}


def roce_problems(raw: dict, **over) -> list[str]:
    return [ln for ln in lines(pf.judge(hf.collect(raw), hgx_expect(**over))) if "gid" in ln.split(":")[0]]


def test_gid_table_is_read_by_index_with_type_and_netdev(roce_raw):
    gids = hf.collect(roce_raw)["infiniband"]["mlx5_2"]["1"]["gids"]
    assert sorted(gids) == [0, 1, 2, 3]
    assert gids[3] == {"gid": "0000:0000:0000:0000:0000:ffff:0a14:000d", "type": "RoCE v2", "ndev": "ens3f0np0"}
    assert [hf.roce_v2_ipv4(gids[i]) for i in range(4)] == [None, None, None, "10.20.0.13"]


def test_roce_without_mc_gid_index_is_refused_naming_the_index_that_works(roce_raw):
    assert roce_problems(roce_raw) == [
        "ERROR rdma.gid_index=None: RoCE NICs (mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7: "
        "link_layer Ethernet) and no MC_GID_INDEX: Mooncake picks a GID by its own ranking, and a link-local or "
        "another address's GID fails the first KV transfer (sglang#30737). Fix: set pdnode_engine_environment: "
        '{MC_GID_INDEX: "3"} (RoCE v2 with its IPv4 address on mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, '
        "mlx5_6, mlx5_7).",
    ]


def test_roce_with_the_right_index_passes_and_infiniband_needs_none(roce_raw, hgx_raw):
    assert roce_problems(roce_raw, gid_index=3) == []
    assert roce_problems(hgx_raw) == []  # InfiniBand links: no GID index to choose


@pytest.mark.parametrize(("index", "what"), [
    (1, "RoCE v2 fe80:0000:0000:0000:0a5c:2dff:fe3b:1100 (ens1f0np0), not RoCE v2 with an IPv4 address"),
    (2, "IB/RoCE v1 0000:0000:0000:0000:0000:ffff:0a14:000b (ens1f0np0), not RoCE v2 with an IPv4 address"),
    (7, "an empty entry of mlx5_0 port 1's GID table: Mooncake disables the device"),
])
def test_a_wrong_mc_gid_index_is_refused_per_nic(roce_raw, index, what):
    got = roce_problems(roce_raw, gid_index=index)
    assert len(got) == 8 and got[0].startswith(f"ERROR nic.mlx5_0.gid={index}: MC_GID_INDEX {index} ")
    assert what in got[0] and 'Fix: set pdnode_engine_environment: {MC_GID_INDEX: "3"}' in got[0]


def test_a_nic_without_an_ipv4_gid_leaves_no_common_index(roce_raw):
    text = (HGX / "sys-gids-handmade-roce8.txt").read_text()
    kept = "".join(ln + "\n" for ln in text.splitlines() if not re.search(r"mlx5_5/ports/1/\w+(/\w+)?/[23]:", ln))
    raw = {**roce_raw, "ib_gids": ok(kept)}
    (line,) = roce_problems(raw)
    assert "Fix: give each NIC's network device its IPv4 address (ip addr)" in line
    assert roce_problems(raw, gid_index=3) == [
        "ERROR nic.mlx5_5.gid=3: MC_GID_INDEX 3 is an empty entry of mlx5_5 port 1's GID table: Mooncake disables "
        "the device. Fix: give each NIC's network device its IPv4 address (ip addr), so that one GID index is RoCE "
        "v2 with it on every NIC, then set pdnode_engine_environment.MC_GID_INDEX to that index.",
    ]


def test_gid_index_is_not_judged_off_the_rdma_path_or_without_the_table(roce_raw):
    assert roce_problems(roce_raw, kv_path="nvlink") == []
    assert roce_problems(roce_raw, transfer_backend="nixl") == []
    older = {k: v for k, v in roce_raw.items() if k != "ib_gids"}
    assert roce_problems(older) == [
        "WARNING rdma.gid_table='mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7': RoCE NICs whose "
        "GID table the facts do not hold (gathered by an older pdnode): MC_GID_INDEX is not checked. "
        "Fix: re-run the preflight.",
    ]


def test_the_plan_gives_preflight_its_gid_index(gpu01_vars):
    from planvars import changed
    plan = build_plan(changed(gpu01_vars, {"pdnode_engine_environment": {"MC_GID_INDEX": "3"}})).as_dict()
    assert pf.expectations(plan)["gid_index"] == 3
    assert pf.expectations(build_plan(gpu01_vars).as_dict())["gid_index"] is None


def test_rdma_backend_without_any_device(h200_raw):
    (p,) = pf.judge(hf.collect(h200_raw), one_gpu_expect(transfer_backend="mooncake"))
    assert p.check == "rdma.devices" and "mooncake_tcp" in p.fix


# --- ports -----------------------------------------------------------------------------------------

def listen(port: int, inode: int, addr: str = "0100007F") -> str:
    return f"   0: {addr}:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000   997 0 {inode} 1\n"


def test_ports_foreign_and_own(h200_raw):
    h200_raw["tcp"] = ok("  sl  local_address rem_address   st\n" + listen(30000, 501) + listen(8000, 502, "00000000"))
    h200_raw["socket_fds"] = ok("/proc/40/fd socket:[501]\n/proc/41/fd socket:[502]\n")
    h200_raw["cgroups"] = ok("/proc/40/cgroup:0::/system.slice/sglang-pd-prefill.service\n"
                             "/proc/41/cgroup:0::/system.slice/nginx.service\n")
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert lines(problems) == [
        "ERROR port.8000='0.0.0.0:8000': the port pdnode_router_port needs is already in use (pid 41, unit "
        "nginx.service). Fix: stop that process or choose another port for pdnode_router_port."]


def test_ports_unknown_owner(h200_raw):
    h200_raw["tcp"] = ok("  sl  local_address rem_address   st\n" + listen(30000, 501))
    (p,) = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert "(owner unknown)" in p.line


def test_model_and_disk(h200_raw):
    h200_raw["model"] = {"path": "/models/m", "exists": True, "isdir": True, "config_json": False}
    h200_raw["df"] = ok("Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/vda 100 90 1000 90% /opt\n")
    problems = pf.judge(hf.collect(h200_raw), one_gpu_expect())
    assert checks(problems) == [("error", "model.config_json"), ("error", "disk.free")]
    assert problems[1].value == "0.0 GB on /opt"


# --- expectations from the real plan --------------------------------------------------------------

def test_expectations_from_gpu01_plan():
    plan = build_plan(load_inventory(ROOT / "inventories" / "gpu01", "gpu01").variables, "gpu01").as_dict()
    exp = pf.expectations(plan)
    assert exp["gpu_count"] == 8 and exp["gpu_model"] == "NVIDIA H200" and exp["driver_branch"] == 580
    assert exp["gpu_ids"] == list(range(8))
    assert exp["nics"]["0"] == "mlx5_0" and exp["transfer_backend"] == "mooncake"
    assert exp["ports"]["router.port"] == 8000
    assert exp["own_unit_prefix"] == "sglang-pd"
    # explicit values win; unknown names are refused
    assert pf.expectations(plan, {"gpu_count": 1, "gpu_model": None})["gpu_count"] == 1
    with pytest.raises(ValueError, match="unknown preflight expectation 'gpus'"):
        pf.expectations(plan, {"gpus": 1})


def test_expectations_take_the_gpu_ids_from_the_engine_services():
    """The instances plan (N prefill + M decode): GPU ids come from each engine service."""
    plan = {"settings": {"pdnode_gpu_count": 8, "pdnode_gpu_model": "NVIDIA H200"}, "ports": {}, "services": {
        "prefill-0": {"id": "prefill-0", "role": "prefill", "unit": "sglang-pd-prefill-0.service", "gpus": [0, 1]},
        "prefill-1": {"id": "prefill-1", "role": "prefill", "unit": "sglang-pd-prefill-1.service", "gpus": [2, 3]},
        "decode-0": {"id": "decode-0", "role": "decode", "unit": "sglang-pd-decode-0.service", "gpus": [4, 5, 6]},
        "router": {"id": "router", "role": "router", "unit": "sglang-pd-router.service", "gpus": []}}}
    exp = pf.expectations(plan)
    assert exp["gpu_ids"] == [0, 1, 2, 3, 4, 5, 6]
    assert exp["own_units"] == ["sglang-pd-decode-0.service", "sglang-pd-prefill-0.service",
                                "sglang-pd-prefill-1.service", "sglang-pd-router.service"]


def test_expectations_from_the_command_line_are_coerced():
    """-e preflight_require_systemd=false arrives as the string 'false' (seen on the H200 run)."""
    exp = pf.expectations(None, {"require_systemd": "false", "check_cuda": "yes", "gpu_count": "8",
                                 "driver_branch": "580", "min_free_disk_gb": "30", "ports": {"a": "8000"}})
    assert (exp["require_systemd"], exp["check_cuda"], exp["gpu_count"], exp["driver_branch"]) == (False, True, 8, 580)
    assert exp["min_free_disk_gb"] == 30.0 and exp["ports"] == {"a": 8000}
    with pytest.raises(ValueError, match="gpu_count='eight' has the wrong type"):
        pf.expectations(None, {"gpu_count": "eight"})


def test_report_shape(h200_raw):
    raw = copy.deepcopy(h200_raw)
    raw["pid1"], raw["systemd_dir"] = ok("process_api"), ok(rc=1)
    rep = pf.report(hf.collect(raw), one_gpu_expect())
    assert rep["ok"] is False and len(rep["errors"]) == 1 and rep["warnings"] == []
    assert rep["problems"][0]["severity"] == "error" and rep["problems"][0]["line"] == rep["errors"][0]


def test_the_verdict_recorded_on_the_h200_is_what_judge_says():
    """preflight-report.json is the role's own report from the real H200 run
    (docs/hardware-runs.md): its facts, judged again, give the same verdict."""
    import json

    rep = json.loads((FIX / "h200-1gpu-run2" / "preflight-report.json").read_text())
    assert pf.report(rep["facts"], rep["expect"]) == rep["verdict"]
    assert [p["check"] for p in rep["verdict"]["problems"]] == ["init.pid1"]
    assert rep["facts"]["cuda"]["ok"] is True and rep["facts"]["cuda"]["device_count"] == 1


def _two_gpu_raw(smi_q: str | None = None) -> dict:
    two = FIX / "h200-2gpu"
    return {
        "os": {"id": "ubuntu", "version": "24.04", "major": "24"}, "pid1": ok("systemd"), "systemd_dir": ok(),
        "query_gpu": r(two / "query-gpu.txt"), "smi_q": ok(smi_q or (two / "nvidia-smi-q.txt").read_text()),
        "topo": r(two / "topo-m.txt"), "proc_version": r(two / "proc-driver-nvidia-version.txt"),
        "nvswitch_proc": ok(""), "pci": r(two / "pci-scan.txt"),
        "cuda": ok('{"ok": true, "device_count": 2, "devices": [{"ordinal": 0, "ok": true}, {"ordinal": 1, "ok": true}]}'),
        "model": {"path": "/models/m", "exists": True, "isdir": True, "config_json": True},
    }


def test_real_two_gpu_partition_passes():
    assert pf.judge(hf.collect(_two_gpu_raw()), one_gpu_expect(gpu_count=2, gpu_ids=[0, 1])) == []


def test_fabric_state_judged_without_visible_nvswitches():
    """In an NVSwitch partition handed to a VM the switches are invisible; a GPU whose
    fabric registration is not Completed still makes CUDA fail, so it is an error."""
    smi = (FIX / "h200-2gpu" / "nvidia-smi-q.txt").read_text()
    head, _, rest = smi.partition("GPU 00000000:00:07.0")
    rest = rest.replace("State                                          : Completed",
                        "State                                          : In Progress", 1)
    problems = pf.judge(hf.collect(_two_gpu_raw(head + "GPU 00000000:00:07.0" + rest)),
                        one_gpu_expect(gpu_count=2, gpu_ids=[0, 1]))
    assert [(p.check, p.value) for p in problems] == [("gpu1.fabric.state", "In Progress")]


def test_the_verdict_recorded_on_the_two_gpu_machine():
    import json

    rep = json.loads((FIX / "h200-2gpu" / "preflight-report.json").read_text())
    assert rep["verdict"]["ok"] is True
    assert pf.report(rep["facts"], rep["expect"]) == rep["verdict"]


# --- the KV path: NVLink between each prefill GPU and decode GPU (docs/kv-path.md) ------------

def _kv_problems(facts: dict, pairs: list) -> list:
    exp = hgx_expect(kv_path="nvlink", kv_gpu_pairs=pairs)
    return [p for p in pf.judge(facts, exp) if p.check == "kv.nvlink"]


def test_kv_over_nvlink_passes_where_nvlink_joins_every_prefill_and_decode_gpu(hgx_raw):
    assert _kv_problems(hf.collect(hgx_raw), [[[0, 1, 2, 3], [4, 5, 6, 7]]]) == []


def test_kv_over_nvlink_warns_naming_the_gpus_a_pcie_link_joins(hgx_raw):
    facts = hf.collect(hgx_raw)
    facts["topology"]["links"]["GPU0"]["GPU4"] = "PHB"
    facts["topology"]["links"]["GPU1"]["GPU5"] = "SYS"
    (p,) = _kv_problems(facts, [[[0, 1, 2, 3], [4, 5, 6, 7]]])
    assert p.severity == "warning"
    assert p.line.startswith("WARNING kv.nvlink='GPU 0 -> GPU 4: PHB, GPU 1 -> GPU 5: SYS': the plan moves KV over "
                             "Mooncake's intra-node NVLink transport"), p.line
    assert "pdnode_kv_intranode_nvlink: false" in p.fix


def test_the_real_two_h200_host_joins_its_gpus_by_nvlink():
    """The 2 x H200 capture (tests/fixtures/nvidia-smi/h200-2gpu): a prefill on GPU 0 and a
    decode on GPU 1 get the NVLink path, and the topology agrees (NV18)."""
    topo = hf.parse_topo_matrix((FIX / "h200-2gpu" / "topo-m.txt").read_text())
    assert topo["links"]["GPU0"]["GPU1"] == "NV18"
    exp = pf.expectations(None, {"kv_path": "nvlink", "kv_gpu_pairs": [[[0], [1]]], "gpu_count": 2})
    j = pf._J()
    pf._kv_nvlink(j, {"topology": topo}, exp)
    assert j.problems == []


def test_expectations_carry_the_plans_kv_path_and_pairs():
    plan = build_plan(load_inventory(ROOT / "inventories" / "gpu01-2p1d", "gpu01").variables, "gpu01").as_dict()
    exp = pf.expectations(plan)
    assert exp["kv_path"] == "nvlink"
    assert exp["kv_gpu_pairs"] == [[[0, 1], [4, 5, 6, 7]], [[2, 3], [4, 5, 6, 7]]]
