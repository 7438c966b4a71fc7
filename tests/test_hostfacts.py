"""pdnode.core.host.facts over real output captured on an H200 host (tests/fixtures/nvidia-smi/
h200-1gpu/, made with capture.sh on 2026-11-29) and over the clearly labelled hand-made
8-GPU fixtures (handmade/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdnode.core.host import facts as hf
from pdnode.node import preflight as node_pf  # the /proc/net/tcp and socket-owner parsers

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi"
H200 = FIX / "h200-1gpu"
HGX = FIX / "handmade"


def text(path: Path) -> str:
    return path.read_text()


def probe(path: Path, rc: int | None = None) -> dict:
    """A registered-result dict as Ansible would hand it over, from a capture file."""
    rc_file = path.with_suffix(".rc")
    err_file = path.with_suffix(".err")
    return {"rc": rc if rc is not None else (int(rc_file.read_text()) if rc_file.exists() else 0),
            "stdout": path.read_text().rstrip("\n"),
            "stderr": err_file.read_text().rstrip("\n") if err_file.exists() else ""}


# --- the real H200 capture ---------------------------------------------------------------

def test_query_gpu_real_with_header_and_units():
    out = hf.parse_query_gpu(text(H200 / "query-gpu.txt"))
    assert out["errors"] == [] and out["header_error"] is None
    (gpu,) = out["gpus"]
    assert gpu == {
        "index": 0, "name": "NVIDIA H200", "uuid": "GPU-76dc57cc-d891-eb47-19ee-6e9da8f0a68c",
        "bus_id": "0000:00:06.0", "driver_version": "580.159.04", "memory_total_mib": 143771,
        "persistence_mode": "Enabled", "compute_cap": "9.0", "compute_mode": "Default",
    }


def test_query_gpu_real_noheader_same_result():
    assert hf.parse_query_gpu(text(H200 / "query-gpu-noheader.txt"), header=False) == \
        hf.parse_query_gpu(text(H200 / "query-gpu.txt"))


@pytest.mark.parametrize("capture", sorted(FIX.glob("h200-*/query-gpu.txt")), ids=lambda p: p.parent.name)
def test_query_gpu_real_headers_match_the_fields(capture):
    """Every real `--format=csv` capture's header names QUERY_GPU_FIELDS in order."""
    out = hf.parse_query_gpu(text(capture))
    assert out["header_error"] is None and out["errors"] == [] and out["gpus"]


@pytest.mark.parametrize("mutate, got", [
    # two columns swapped: same width, every row would parse with names and UUIDs crossed
    (lambda h: h.replace("name, uuid", "uuid, name"), "index, uuid, name, pci.bus_id"),
    # a column renamed
    (lambda h: h.replace("compute_mode", "compute_policy"), "compute_cap, compute_policy'"),
    # a column dropped (rows one cell short)
    (lambda h: h.replace(", persistence_mode", ""), "memory.total, compute_cap"),
    # memory.total dropped: the capacity comparison must not read another column as MiB
    (lambda h: h.replace(", memory.total [MiB]", ""), "driver_version, persistence_mode"),
])
def test_query_gpu_header_that_differs_is_refused_in_one_line(mutate, got):
    head, rows = text(H200 / "query-gpu.txt").split("\n", 1)
    out = hf.parse_query_gpu(mutate(head) + "\n" + rows)
    assert out["gpus"] == [] and out["errors"] == []
    assert out["header_error"].startswith(
        "nvidia-smi --query-gpu header: expected 'index, name, uuid, pci.bus_id, driver_version, memory.total, "
        "persistence_mode, compute_cap, compute_mode', got '")
    assert got in out["header_error"] and "\n" not in out["header_error"]


def test_query_gpu_rows_without_the_header_asked_for_are_refused():
    """A noheader capture where a header is expected: the first row is not a header."""
    out = hf.parse_query_gpu(text(H200 / "query-gpu-noheader.txt"))
    assert out["gpus"] == [] and out["header_error"].endswith("got '0, NVIDIA H200, "
                                                              "GPU-76dc57cc-d891-eb47-19ee-6e9da8f0a68c, "
                                                              "00000000:00:06.0, 580.159.04, 143771 MiB, "
                                                              "Enabled, 9.0, Default'")


def test_the_role_asks_for_the_fields_the_parser_checks():
    """roles/preflight/vars/main.yml queries QUERY_GPU_FIELDS with the header (--format=csv)."""
    import yaml

    role_vars = yaml.safe_load((Path(__file__).parents[1] / "roles/preflight/vars/main.yml").read_text())
    assert tuple(role_vars["_preflight_query_gpu_fields"].split(",")) == hf.QUERY_GPU_FIELDS
    assert role_vars["_preflight_probes"]["query_gpu"] == \
        "nvidia-smi --query-gpu={{ _preflight_query_gpu_fields }} --format=csv"


def test_query_gpu_fabric_fields_real_are_na():
    out = hf.parse_query_gpu(text(H200 / "query-gpu-fabric.txt"), ["index", "fabric.state", "fabric.status"])
    assert out["header_error"] is None
    assert out["gpus"] == [{"index": 0, "name": None, "uuid": None, "bus_id": None, "driver_version": None,
                            "memory_total_mib": None, "persistence_mode": None, "compute_cap": None,
                            "compute_mode": None, "fabric_state": None, "fabric_status": None}]


def test_query_gpu_keeps_broken_gpu_lines_as_errors():
    broken = (text(H200 / "query-gpu.txt").splitlines()[0] + "\n"
              "0, NVIDIA H200, GPU-a, 00000000:18:00.0, 580.159.04, 143771, Enabled, 9.0, Default\n"
              "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error\n")
    out = hf.parse_query_gpu(broken)
    assert [g["index"] for g in out["gpus"]] == [0]
    assert out["errors"] == ["Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error"]


def test_query_gpu_driver_not_loaded_message_is_an_error():
    msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.")
    assert hf.parse_query_gpu(msg) == {"gpus": [], "errors": [msg], "header_error": None}


def test_smi_q_real_header_and_gpu_section():
    s = hf.smi_q_summary(text(H200 / "nvidia-smi-q.txt"))
    assert (s["driver_version"], s["cuda_version"], s["attached_gpus"]) == ("580.159.04", "13.0", 1)
    gpu = s["gpus"]["0000:00:06.0"]
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["architecture"] == "Hopper"
    assert gpu["persistence_mode"] == "Enabled"
    assert gpu["mig_mode"] == "Disabled"
    # A single PCIe-attached H200 has no NVLink fabric: every Fabric field is N/A.
    assert gpu["fabric"] == {"state": None, "status": None, "clique_id": None, "cluster_uuid": None, "health": None}


def test_smi_q_tree_nesting_real():
    tree = hf.parse_smi_q(text(H200 / "nvidia-smi-q.txt"))
    gpu = hf.smi_q_gpus(tree)["0000:00:06.0"]
    assert gpu["PCI"]["GPU Link Info"]["Link Width"]["Max"] == "16x"
    assert gpu["FB Memory Usage"]["Total"] == "143771 MiB"
    assert gpu["Clocks Event Reasons"]["HW Slowdown"] == "Not Active"
    assert tree["Timestamp"] == "Sun Nov 29 16:06:59 2026"  # value with colons survives


def test_topo_real_strips_ansi_and_reads_affinity():
    topo = hf.parse_topo_matrix(text(H200 / "topo-m.txt"))
    assert topo["devices"] == ["GPU0"]
    assert topo["links"] == {"GPU0": {"GPU0": "X"}}
    assert topo["affinity"] == {"GPU0": {"cpu_affinity": "0-15", "numa_affinity": "0", "gpu_numa_id": None}}
    assert topo["nic_names"] == {}
    assert hf.nic_ranking(topo) == {0: []}


def test_proc_driver_version_real_open_module():
    assert hf.parse_proc_driver_version(text(H200 / "proc-driver-nvidia-version.txt")) == \
        {"version": "580.159.04", "flavor": "open"}


def test_proc_driver_version_proprietary():
    line = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    assert hf.parse_proc_driver_version(line) == {"version": "550.54.15", "flavor": "proprietary"}
    assert hf.parse_proc_driver_version("") == {"version": None, "flavor": None}


def test_proc_net_tcp_real_listener():
    socks = node_pf.parse_proc_net_tcp(text(H200 / "proc-net-tcp.txt"))
    assert socks[0] == {"address": "0.0.0.0", "port": 2024, "state": "0A", "uid": 0, "inode": 4130}
    # the two others are loopback connections (state 06 TIME_WAIT) on 8099
    assert {(s["address"], s["port"], s["state"]) for s in socks[1:]} == {("127.0.0.1", 8099, "06")}
    assert node_pf.listening_sockets(text(H200 / "proc-net-tcp.txt"), text(H200 / "proc-net-tcp6.txt")) == [socks[0]]


def test_proc_net_tcp6_addresses():
    table = ("  sl  local_address                         remote_address                        st\n"
             "   0: 00000000000000000000000001000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 "
             "00:00000000 00000000   997        0 77 1 0 100 0 0 10 0\n"
             "   1: 0000000000000000FFFF00000100007F:22C6 00000000000000000000000000000000:0000 0A 00000000:00000000 "
             "00:00000000 00000000     0        0 78 1 0 100 0 0 10 0\n")
    socks = node_pf.parse_proc_net_tcp(table)
    assert [(s["address"], s["port"], s["uid"], s["inode"]) for s in socks] == [("::1", 30000, 997, 77),
                                                                               ("127.0.0.1", 8902, 0, 78)]


def test_socket_owners_with_units():
    fds = "/proc/412/fd socket:[77]\n/proc/412/fd socket:[79]\n/proc/9/fd socket:[78]\n"
    cg = ("/proc/412/cgroup:0::/system.slice/sglang-pd-prefill.service\n"
          "/proc/9/cgroup:12:name=systemd:/system.slice/nginx.service\n"
          "/proc/9/cgroup:0::/\n")
    owners = node_pf.parse_socket_owners(fds, cg)
    assert owners[77] == {"pid": 412, "unit": "sglang-pd-prefill.service"}
    assert owners[78] == {"pid": 9, "unit": "nginx.service"}


def test_limits_df_real():
    assert hf.parse_limits("Max locked memory         unlimited            unlimited            bytes\n") == \
        {"soft": None, "hard": None, "known": True}
    assert hf.parse_limits("Max locked memory         8388608              8388608              bytes\n") == \
        {"soft": 8388608, "hard": 8388608, "known": True}
    assert hf.parse_df(text(H200 / "df.txt")) == {"mount": "/", "avail_bytes": 67091940 * 1024,
                                                  "size_bytes": 264212084 * 1024}


def test_normalize_bus_id():
    assert hf.normalize_bus_id("00000000:2A:00.0") == "0000:2a:00.0"
    assert hf.normalize_bus_id("0000:2a:00.0") == "0000:2a:00.0"
    assert hf.normalize_bus_id("2a:00.0") == "0000:2a:00.0"


def test_collect_real_h200():
    raw = {
        "os": {"id": "ubuntu", "version": "24.04", "major": "24"},
        "pid1": {"rc": 0, "stdout": "process_api", "stderr": ""},
        "systemd_dir": {"rc": 1, "stdout": "", "stderr": ""},
        "query_gpu": probe(H200 / "query-gpu.txt"),
        "smi_q": probe(H200 / "nvidia-smi-q.txt"),
        "topo": probe(H200 / "topo-m.txt"),
        "proc_version": probe(H200 / "proc-driver-nvidia-version.txt"),
        "nvswitch_proc": {"rc": 0, "stdout": "", "stderr": ""},
        "tcp": probe(H200 / "proc-net-tcp.txt"),
        "tcp6": probe(H200 / "proc-net-tcp6.txt"),
        "limits": probe(H200 / "ulimit-l.txt"),
        "df": probe(H200 / "df.txt"),
        "cuda": {"rc": 0, "stdout": '{"ok": true, "device_count": 1, "driver_version": 13000, "devices": '
                                    '[{"ordinal": 0, "ok": true, "name": "NVIDIA H200"}]}', "stderr": ""},
    }
    facts = hf.collect(raw)
    assert facts["driver"] == {"present": True, "nvidia_smi": True, "version": "580.159.04", "branch": 580,
                               "flavor": "open", "cuda_version": "13.0", "error": None}
    (gpu,) = facts["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["cpu_affinity"] == "0-15" and gpu["numa_affinity"] == "0"
    assert gpu["fabric"]["state"] is None
    assert facts["nvswitch"] == {"present": False, "proc_devices": [], "pci_devices": 0}
    assert facts["init"] == {"pid1": "process_api", "systemd_booted": False}
    assert facts["listeners"] == [{"address": "0.0.0.0", "port": 2024, "inode": 4130, "pid": None, "unit": None,
                                    "uid_units": []}]
    assert facts["memlock"]["known"] is True  # ulimit -l text has the /proc limits line too
    assert facts["cuda"]["device_count"] == 1


def test_collect_without_driver_uses_pci():
    raw = {"query_gpu": {"rc": 127, "stdout": "", "stderr": "/bin/bash: line 1: nvidia-smi: command not found"},
           "pci": {"rc": 0, "stdout": text(HGX / "pci-handmade-hgx8.txt"), "stderr": ""},
           "nvswitch_proc": {"rc": 2, "stdout": "", "stderr": "No such file or directory"}}
    facts = hf.collect(raw)
    assert facts["driver"]["present"] is False and facts["driver"]["nvidia_smi"] is False
    assert facts["pci"] == {"nvidia_gpus": 8, "nvswitches": 4, "mellanox_nics": 8}
    assert facts["nvswitch"]["present"] is True  # seen on PCI before any driver exists


def test_collect_tolerates_no_probes():
    facts = hf.collect({})
    assert facts["gpus"] == [] and facts["listeners"] == [] and facts["driver"]["present"] is False


# --- hand-made 8-GPU fixtures (labelled as such) ---------------------------------------------

def test_topo_handmade_hgx8_nic_legend_and_ranking():
    topo = hf.parse_topo_matrix(text(HGX / "topo-m-handmade-hgx8.txt"))
    assert topo["devices"] == [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(8)]
    assert topo["nic_names"]["NIC3"] == "mlx5_3"
    assert topo["links"]["GPU0"]["GPU7"] == "NV18"
    assert topo["links"]["GPU5"]["NIC1"] == "SYS"
    assert topo["affinity"]["GPU6"] == {"cpu_affinity": "56-111,168-223", "numa_affinity": "1", "gpu_numa_id": None}
    ranking = hf.nic_ranking(topo)
    assert ranking[5][0] == {"nic": "mlx5_5", "link": "PXB"}
    assert [r["link"] for r in ranking[5]] == ["PXB", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]


def test_smi_q_handmade_fabric_states():
    s = hf.smi_q_summary(text(HGX / "nvidia-smi-q-handmade-hgx8.txt"))
    states = {bus: g["fabric"]["state"] for bus, g in s["gpus"].items()}
    assert len(states) == 8
    assert states["0000:ab:00.0"] == "In Progress"
    assert {v for k, v in states.items() if k != "0000:ab:00.0"} == {"Completed"}
    assert s["gpus"]["0000:18:00.0"]["fabric"]["status"] == "Success"


def test_sys_infiniband_handmade():
    ib = hf.parse_sys_infiniband(text(HGX / "sys-infiniband-handmade-hgx8.txt"))
    assert ib["mlx5_0"]["1"] == {"state": "ACTIVE", "phys_state": "LinkUp", "link_layer": "InfiniBand",
                                 "rate": "400 Gb/sec (4X NDR)"}
    assert ib["mlx5_6"]["1"]["state"] == "DOWN"


@pytest.mark.parametrize("line,want", [
    ("/sys/bus/pci/devices/0000:00:06.0 0x10de 0x030200 0x2335", "nvidia_gpus"),
    ("/sys/bus/pci/devices/0000:05:00.0 0x10de 0x068000 0x22a3", "nvswitches"),
    ("/sys/bus/pci/devices/0000:1a:00.0 0x15b3 0x020700 0x1021", "mellanox_nics"),
])
def test_pci_scan_classes(line, want):
    out = hf.parse_pci_scan(line)
    assert [k for k, v in out.items() if v] == [want]


# --- the Mooncake build the facts call for (pdnode.core.rules.mooncake_select) -------------------------

from pdnode.core.rules import mooncake_select as ms  # noqa: E402


def test_mooncake_build_for_the_real_h200():
    cuda = hf.smi_q_summary(text(H200 / "nvidia-smi-q.txt"))["cuda_version"]  # "13.0", driver 580
    assert ms.select(cuda) == {"flavor": "cuda13", "package": "mooncake-transfer-engine-cuda13",
                               "version": "0.3.14", "requirement": "mooncake-transfer-engine-cuda13==0.3.14",
                               "reason": "the driver's CUDA 13.0 (driver supports CUDA 13.0)"}
    # a CUDA-12 Python stack on the same driver gets the CUDA-12 build
    assert ms.select(cuda, stack_cuda="12.9")["package"] == "mooncake-transfer-engine"


def test_mooncake_build_without_driver_and_overrides():
    assert ms.select(None)["requirement"] == "mooncake-transfer-engine-non-cuda==0.3.13.post1"
    assert ms.select("12.4", override="non-cuda")["flavor"] == "non-cuda"
    assert ms.select(None, versions={"non-cuda": "0.3.12"})["version"] == "0.3.12"
    with pytest.raises(ms.SelectionError, match="needs an NVIDIA driver"):
        ms.select(None, override="cuda13")
    with pytest.raises(ms.SelectionError, match="upgrade the driver branch"):
        ms.select("12.8", stack_cuda=13)
    with pytest.raises(ms.SelectionError, match="unknown Mooncake build"):
        ms.select("13.0", override="cuda11")


# --- the second capture: the exact probes the preflight role runs ---------------------------

RUN2 = FIX / "h200-1gpu-run2"


def test_run2_query_exactly_as_the_role_asks():
    """--format=csv with roles/preflight/vars/main.yml's field list (the role's probe)."""
    (gpu,) = hf.parse_query_gpu(text(RUN2 / "query-gpu.txt"))["gpus"]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["driver_version"], gpu["bus_id"]) == \
        ("NVIDIA H200", 143771, "580.159.04", "0000:00:06.0")


def test_run2_query_as_the_role_asked_before():
    """--format=csv,noheader,nounits: what the role asked before it checked the header."""
    (gpu,) = hf.parse_query_gpu(text(RUN2 / "query-gpu-nounits.txt"), header=False)["gpus"]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["driver_version"], gpu["bus_id"]) == \
        ("NVIDIA H200", 143771, "580.159.04", "0000:00:06.0")


def test_run2_pci_scan_sees_the_gpu_without_asking_the_driver():
    pci = hf.parse_pci_scan(text(RUN2 / "pci-scan.txt"))
    assert pci == {"nvidia_gpus": [{"bus_id": "0000:00:06.0", "device_id": "0x2335"}], "nvswitches": [],
                   "mellanox_nics": []}


def test_run2_compute_section_feeds_the_mooncake_choice():
    summary = hf.smi_q_summary(text(RUN2 / "nvidia-smi-q-d-compute.txt"))
    assert (summary["driver_version"], summary["cuda_version"]) == ("580.159.04", "13.0")
    assert ms.select(summary["cuda_version"])["package"] == "mooncake-transfer-engine-cuda13"
    assert text(RUN2 / "sys-module-nvidia-version.txt").strip() == summary["driver_version"]


# --- a real 2-GPU capture: two NVLinked H200s of an NVSwitch partition in a VM ---------------

TWO = FIX / "h200-2gpu"


def test_two_gpu_topology_real():
    topo = hf.parse_topo_matrix(text(TWO / "topo-m.txt"))
    assert topo["devices"] == ["GPU0", "GPU1"]
    assert topo["links"]["GPU0"]["GPU1"] == "NV18" and topo["links"]["GPU1"]["GPU0"] == "NV18"
    assert topo["affinity"]["GPU1"] == {"cpu_affinity": "0-31", "numa_affinity": "0", "gpu_numa_id": None}


def test_two_gpu_fabric_completed_real():
    s = hf.smi_q_summary(text(TWO / "nvidia-smi-q.txt"))
    assert s["attached_gpus"] == 2
    for bus in ("0000:00:06.0", "0000:00:07.0"):
        fab = s["gpus"][bus]["fabric"]
        assert (fab["state"], fab["status"], fab["clique_id"]) == ("Completed", "Success", "0")
    # the switches are managed outside the VM: none visible here
    assert text(TWO / "nvswitch-devices.txt").count("nvidia-nvswitch") == 0


def test_units_per_uid_tells_whose_socket_it_is_without_fd_links():
    cgroups = ("/proc/10/cgroup:0::/system.slice/sglang-pd-prefill.service\n"
               "/proc/11/cgroup:0::/system.slice/sglang-pd-router.service\n"
               "/proc/12/cgroup:0::/user.slice/user-0.slice/session-1.scope\n")
    uids = "/proc/10/status:Uid:\t999\t999\t999\t999\n/proc/11/status:Uid:\t999\t999\t999\t999\n" \
           "/proc/12/status:Uid:\t0\t0\t0\t0\n/proc/13/status:Uid:\t0\t0\t0\t0\n"
    assert node_pf.units_per_uid(uids, cgroups) == {
        999: ["sglang-pd-prefill.service", "sglang-pd-router.service"], 0: ["?", "session-1.scope"]}


# --- the OS, read by the probes instead of gathered facts -------------------------------------

OS_RELEASES = {
    "debian-12": ({"etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
                                     'VERSION_ID="12"\nVERSION="12 (bookworm)"\nVERSION_CODENAME=bookworm\nID=debian\n',
                   "etc/debian_version": "12.11\n"}, ("debian", "12.11", "12")),
    "debian-13": ({"etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nVERSION_ID="13"\nID=debian\n',
                   "etc/debian_version": "13.1\n"}, ("debian", "13.1", "13")),
    "ubuntu-24.04": ({"etc/os-release": 'PRETTY_NAME="Ubuntu 24.04.2 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
                                        'VERSION="24.04.2 LTS (Noble Numbat)"\nID=ubuntu\nID_LIKE=debian\n',
                      "etc/debian_version": "trixie/sid\n"}, ("ubuntu", "24.04", "24")),
    "ubuntu-22.04": ({"etc/os-release": 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n',
                      "etc/debian_version": "bookworm/sid\n"}, ("ubuntu", "22.04", "22")),
    "rhel-9.4": ({"etc/os-release": 'NAME="Red Hat Enterprise Linux"\nVERSION_ID="9.4"\nID="rhel"\n'
                                    'ID_LIKE="fedora"\n'}, ("redhat", "9.4", "9")),
    "rocky-9.5": ({"etc/os-release": 'NAME="Rocky Linux"\nVERSION_ID="9.5"\nID="rocky"\n'}, ("rocky", "9.5", "9")),
}


def ansible_setup_os(root: Path, monkeypatch) -> tuple[str, str, str]:
    """What Ansible's setup reports (distribution lower-cased, version, major) for a host with
    these files: its own functions (ansible.module_utils.common.sys_info) over its bundled
    distro module, pointed at the directory instead of /."""
    from ansible.module_utils import distro
    from ansible.module_utils.common import sys_info

    d = distro.LinuxDistribution(root_dir=str(root), include_lsb=False, include_uname=False,
                                  include_oslevel=False)
    monkeypatch.setattr(sys_info, "distro", d)
    version = sys_info.get_distribution_version()
    return sys_info.get_distribution().lower(), version, version.split(".")[0]


@pytest.mark.parametrize("name", sorted(OS_RELEASES))
def test_the_os_is_named_as_ansibles_setup_names_it(name, tmp_path, monkeypatch):
    files, expected = OS_RELEASES[name]
    for rel, content in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    assert ansible_setup_os(tmp_path, monkeypatch) == expected  # the judge, on these files
    got = hf.parse_os(files["etc/os-release"], files.get("etc/debian_version", ""), "x86_64\n")
    assert (got["id"], got["version"], got["major"]) == expected and got["arch"] == "x86_64"


def test_collect_reads_the_os_from_the_probes_and_keeps_a_given_os():
    raw = {"os_release": {"rc": 0, "stdout": OS_RELEASES["debian-12"][0]["etc/os-release"], "stderr": ""},
           "debian_version": {"rc": 0, "stdout": "12.11", "stderr": ""},
           "machine": {"rc": 0, "stdout": "aarch64", "stderr": ""}}
    assert hf.collect(raw)["os"] == {"id": "debian", "version": "12.11", "major": "12", "arch": "aarch64"}
    given = {"id": "ubuntu", "version": "24.04", "major": "24"}
    assert hf.collect({**raw, "os": given})["os"] == given
    # no os-release at all: nothing to name (the verdict then says the OS is not supported)
    assert hf.collect({})["os"] == {"id": "otherlinux", "version": "", "major": "", "arch": ""}


def test_the_roles_gid_probe_reads_a_sysfs_tree_into_the_table(tmp_path):
    """The role's ib_gids command, run by bash over a tree laid out as the kernel's sysfs
    (an empty entry's type unreadable, as EINVAL makes it), parses to the table."""
    import os
    import subprocess

    import yaml

    command = yaml.safe_load((Path(__file__).parents[1] / "roles/preflight/vars/main.yml").read_text()
                             )["_preflight_probes"]["ib_gids"]
    root = tmp_path / "sys/class/infiniband"
    port = root / "mlx5_0/ports/1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    entries = {0: ("fe80:0000:0000:0000:0a5c:2dff:fe3b:1100", "IB/RoCE v1"),
               3: ("0000:0000:0000:0000:0000:ffff:0a14:000b", "RoCE v2")}
    for i in range(5):
        gid, kind = entries.get(i, ("0000:0000:0000:0000:0000:0000:0000:0000", None))
        (port / f"gids/{i}").write_text(gid + "\n")
        for sub, value in (("gid_attrs/types", kind), ("gid_attrs/ndevs", "ens1f0np0" if kind else None)):
            f = port / sub / str(i)
            f.write_text((value or "") + "\n")
            if value is None:
                os.chmod(f, 0)  # unreadable (EINVAL on a host); root still reads it: empty then
    run = subprocess.run(["bash", "-c", command.replace("/sys/class/infiniband", str(root))],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    table = hf.parse_sys_gids(run.stdout.replace(str(root), "/sys/class/infiniband"))
    assert table == {"mlx5_0": {"1": {
        0: {"gid": entries[0][0], "type": "IB/RoCE v1", "ndev": "ens1f0np0"},
        3: {"gid": entries[3][0], "type": "RoCE v2", "ndev": "ens1f0np0"}}}}
    # and a host without RDMA devices: nothing, and no failure
    assert subprocess.run(["bash", "-c", command.replace("/sys/class/infiniband", str(tmp_path / "none"))],
                          capture_output=True, text=True, timeout=30).returncode == 0
