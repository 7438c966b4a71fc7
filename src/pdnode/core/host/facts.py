"""Host facts: pure parsers over the raw text that the preflight probes capture.

Every function here takes text (what a command printed, what a /proc or /sys file
held) and returns plain data. Nothing runs a command, nothing judges: the preflight
role registers the raw outputs, :func:`collect` turns them into one facts dict, and
``pdnode.core.host.preflight.judge`` decides what is wrong. The formats were checked against
real output captured on an NVIDIA H200 host (tests/fixtures/nvidia-smi/h200-1gpu/).
"""

from __future__ import annotations

import json
import re
from typing import Any

# /proc/net/tcp and the sockets' owners: parsed where the host's own port check (node) reads them too
from ...node.preflight import listening_sockets, parse_socket_owners, units_per_uid

# nvidia-smi colours/underlines the topology header when it thinks it has a terminal
# (and sometimes when it does not): strip ANSI escapes before parsing anything.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# The --query-gpu fields the preflight asks for, in this order (keep in sync with
# roles/preflight/vars/main.yml, which tests/test_hostfacts.py checks, and
# tests/fixtures/nvidia-smi/capture.sh). memory.total is what the preflight holds
# against data/gpu-memory.json, the table pdnode check's capacity check uses.
QUERY_GPU_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total",
    "persistence_mode", "compute_cap", "compute_mode",
)

# nvidia-smi topo -m link types, best first (for a GPU <-> NIC path).
LINK_RANK = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
GOOD_NIC_LINKS = ("PIX", "PXB")

# PCI: vendor ids and class codes (first 4 hex digits of the 24-bit class).
PCI_VENDOR_NVIDIA = "0x10de"
PCI_VENDOR_MELLANOX = "0x15b3"
PCI_CLASS_GPU = ("0x0300", "0x0302")      # VGA controller, 3D controller
PCI_CLASS_NVSWITCH = ("0x0680",)          # "Bridge: other" -- how NVSwitches enumerate
PCI_CLASS_NIC = ("0x0200", "0x0207")      # Ethernet, InfiniBand


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text or "")


def _na(value: str | None) -> str | None:
    """nvidia-smi's 'N/A', '[N/A]', '[Not Supported]' and '' all mean: no value."""
    if value is None:
        return None
    value = value.strip()
    if value in ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"):
        return None
    return value


def normalize_bus_id(bus_id: str | None) -> str | None:
    """'00000000:00:06.0' (nvidia-smi) and '0000:00:06.0' (sysfs) -> '0000:00:06.0'."""
    if not bus_id:
        return None
    m = re.fullmatch(r"\s*(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\s*", bus_id)
    if not m:
        return bus_id.strip().lower()
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


# --- nvidia-smi --query-gpu -------------------------------------------------------

def _int_or_none(value: str | None) -> int | None:
    value = _na(value)
    if value is None:
        return None
    m = re.match(r"^\s*(-?\d+)", value)
    return int(m.group(1)) if m else None


def _header_names(line: str) -> list[str]:
    """nvidia-smi's CSV header -> field names: 'memory.total [MiB]' -> 'memory.total'."""
    return [re.sub(r"\s*\[[^\]]*\]$", "", c.strip()) for c in line.split(",")]


def parse_query_gpu(text: str, fields: tuple[str, ...] | list[str] = QUERY_GPU_FIELDS,
                    header: bool = True) -> dict[str, Any]:
    """``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`` -> GPUs.

    Returns ``{"gpus": [...], "errors": [...], "header_error": str | None}``. A line that
    is not a CSV row of the expected width (``Unable to determine the device handle for
    GPU ...``, ``No devices were found``, the "couldn't communicate with the NVIDIA
    driver" message) is kept verbatim in ``errors``: one broken GPU must not hide the
    others.

    ``header=True`` (the preflight asks ``--format=csv``): rows are mapped to fields by
    position, so the header must name exactly ``fields`` in that order (units such as
    ``[MiB]`` aside). A driver that renames, drops or reorders a column would otherwise
    put one field's values under another's name; then no row is read and
    ``header_error`` says expected vs got in one line. Lines without a comma before the
    header are nvidia-smi's messages in place of the CSV and go to ``errors``.
    ``header=False``: ``noheader`` output, rows only.
    """
    fields = tuple(fields)
    gpus: list[dict[str, Any]] = []
    errors: list[str] = []
    header_error = None
    header_seen = not header
    for line in strip_ansi(text).splitlines():
        if not line.strip():
            continue
        if not header_seen:
            if "," not in line:
                errors.append(line.strip())
                continue
            got = _header_names(line)
            if tuple(got) != fields:
                header_error = f"nvidia-smi --query-gpu header: expected '{', '.join(fields)}', got '{', '.join(got)}'"
                break
            header_seen = True
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            errors.append(line.strip())
            continue
        row = dict(zip(fields, cells))
        gpu: dict[str, Any] = {
            "index": _int_or_none(row.get("index")),
            "name": _na(row.get("name")),
            "uuid": _na(row.get("uuid")),
            "bus_id": normalize_bus_id(_na(row.get("pci.bus_id"))),
            "driver_version": _na(row.get("driver_version")),
            "memory_total_mib": _int_or_none(row.get("memory.total")),
            "persistence_mode": _na(row.get("persistence_mode")),
            "compute_cap": _na(row.get("compute_cap")),
            "compute_mode": _na(row.get("compute_mode")),
        }
        for key, value in row.items():  # any extra field asked for, raw
            if key not in QUERY_GPU_FIELDS:
                gpu[key.replace(".", "_")] = _na(value)
        if gpu["index"] is None:
            errors.append(line.strip())
            continue
        gpus.append(gpu)
    gpus.sort(key=lambda g: g["index"])
    return {"gpus": gpus, "errors": errors, "header_error": header_error}


# --- nvidia-smi -q ------------------------------------------------------------------

_Q_LINE = re.compile(r"^(\s*)(\S.*?)\s+:\s?(.*)$")


def parse_smi_q(text: str) -> dict[str, Any]:
    """``nvidia-smi -q`` -> nested dict by indentation.

    Top-level keys hold the header (``Driver Version``, ``CUDA Version``, ...); each
    GPU is a section ``GPU 00000000:00:06.0``. Use :func:`smi_q_gpus` for the GPUs.
    Repeated keys within one section keep the first value.
    """
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for raw in strip_ansi(text).splitlines():
        if not raw.strip() or raw.strip().startswith("=="):
            continue
        indent = len(raw) - len(raw.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        m = _Q_LINE.match(raw)
        if m:
            key, value = m.group(2).strip(), m.group(3).strip()
            parent.setdefault(key, value)
        else:
            key = raw.strip()
            section: dict[str, Any] = {}
            if key in parent and isinstance(parent[key], dict):
                section = parent[key]
            else:
                parent[key] = section
            stack.append((indent, section))
    return root


def smi_q_gpus(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The GPU sections of a parsed ``nvidia-smi -q``, keyed by normalized bus id."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in tree.items():
        if key.startswith("GPU ") and isinstance(value, dict):
            out[normalize_bus_id(key[4:]) or key[4:]] = value
    return out


def smi_q_summary(text: str) -> dict[str, Any]:
    """The parts of ``nvidia-smi -q`` the preflight judges: versions, and per GPU the
    product name, persistence mode, MIG mode and the Fabric section."""
    tree = parse_smi_q(text)
    gpus = {}
    for bus, sec in smi_q_gpus(tree).items():
        fabric = sec.get("Fabric") if isinstance(sec.get("Fabric"), dict) else {}
        health = fabric.get("Health") if isinstance(fabric.get("Health"), dict) else {}
        mig = sec.get("MIG Mode") if isinstance(sec.get("MIG Mode"), dict) else {}
        gpus[bus] = {
            "name": _na(sec.get("Product Name")),
            "architecture": _na(sec.get("Product Architecture")),
            "uuid": _na(sec.get("GPU UUID")),
            "minor_number": _int_or_none(sec.get("Minor Number")),
            "persistence_mode": _na(sec.get("Persistence Mode")),
            "mig_mode": _na(mig.get("Current")),
            "fabric": {
                "state": _na(fabric.get("State")),
                "status": _na(fabric.get("Status")),
                "clique_id": _na(fabric.get("CliqueId")),
                "cluster_uuid": _na(fabric.get("ClusterUUID")),
                "health": _na(health.get("Summary")),
            },
        }
    return {
        "driver_version": _na(tree.get("Driver Version")),
        "cuda_version": _na(tree.get("CUDA Version")),
        "attached_gpus": _int_or_none(tree.get("Attached GPUs")),
        "gpus": gpus,
    }


# --- nvidia-smi topo -m ---------------------------------------------------------------

_DEVICE_COL = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|[A-Za-z]+\d*_\d+)$")


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """``nvidia-smi topo -m`` -> device list, link matrix, affinities, NIC legend.

    ``links[a][b]`` is the link type (``X``, ``NV18``, ``PIX``, ``PXB``, ``PHB``,
    ``NODE``, ``SYS``); ``affinity["GPU0"]`` has ``cpu_affinity``, ``numa_affinity``
    and ``gpu_numa_id`` (None where N/A); ``nic_names["NIC0"]`` is ``mlx5_0``.
    Cells are tab-separated; empty cells (the driver prints a double tab before
    ``GPU NUMA ID``) are dropped.
    """
    lines = strip_ansi(text).splitlines()
    devices: list[str] = []
    extra_cols: list[str] = []
    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str | None]] = {}
    nic_names: dict[str, str] = {}
    header_seen = False
    in_matrix = False
    for line in lines:
        stripped = line.strip()
        m = re.match(r"^(NIC\d+)\s*:\s*(\S+)$", stripped)
        if m:
            nic_names[m.group(1)] = m.group(2)
            continue
        if not header_seen:
            cells = [c.strip() for c in line.split("\t") if c.strip()]
            if cells and cells[0] == "GPU0" and line[:1] in ("\t", " "):
                devices = [c for c in cells if _DEVICE_COL.match(c)]
                extra_cols = [c for c in cells if not _DEVICE_COL.match(c)]
                header_seen = in_matrix = True
            continue
        if not in_matrix:
            continue
        if not stripped or stripped.startswith("Legend"):
            in_matrix = False
            continue
        cells = [c.strip() for c in line.split("\t") if c.strip()]
        if len(cells) < 1 + len(devices):
            continue
        name = cells[0]
        links[name] = dict(zip(devices, cells[1:1 + len(devices)]))
        rest = cells[1 + len(devices):]
        if name.startswith("GPU") and rest:
            vals = dict(zip(extra_cols, rest))
            affinity[name] = {
                "cpu_affinity": _na(vals.get("CPU Affinity")),
                "numa_affinity": _na(vals.get("NUMA Affinity")),
                "gpu_numa_id": _na(vals.get("GPU NUMA ID")),
            }
    return {"devices": devices, "links": links, "affinity": affinity, "nic_names": nic_names}


def nic_ranking(topo: dict[str, Any]) -> dict[int, list[dict[str, str]]]:
    """For each GPU index, its NICs from closest to farthest: ``[{nic, link}, ...]``.

    NIC columns are named by their RDMA device (``mlx5_0``) via the NIC legend when the
    matrix uses ``NIC0``-style names.
    """
    names = topo.get("nic_names", {})
    out: dict[int, list[dict[str, str]]] = {}
    for dev, row in topo.get("links", {}).items():
        if not dev.startswith("GPU"):
            continue
        ranked = []
        for col, link in row.items():
            if col.startswith("GPU"):
                continue
            ranked.append({"nic": names.get(col, col), "link": link})
        ranked.sort(key=lambda r: (LINK_RANK.get(r["link"], 9), r["nic"]))
        out[int(dev[3:])] = ranked
    return out


# --- RDMA devices -----------------------------------------------------------------------

def parse_sys_infiniband(text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``grep -H . /sys/class/infiniband/*/ports/*/{state,phys_state,link_layer,rate}``
    -> ``{device: {port: {state, phys_state, link_layer, rate}}}`` (state 'ACTIVE',
    phys_state 'LinkUp', link_layer 'InfiniBand' | 'Ethernet')."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for line in (text or "").splitlines():
        m = re.match(r"^/sys/class/infiniband/([^/]+)/ports/(\d+)/(\w+):(.*)$", line.strip())
        if not m:
            continue
        dev, port, attr, value = m.group(1), m.group(2), m.group(3), m.group(4).strip()
        if attr in ("state", "phys_state"):
            value = value.split(":", 1)[-1].strip()  # "4: ACTIVE" -> "ACTIVE"
        out.setdefault(dev, {}).setdefault(port, {})[attr] = value
    return out


_GID_LINE = re.compile(r"^/sys/class/infiniband/([^/]+)/ports/(\d+)/(gids|gid_attrs/types|gid_attrs/ndevs)/(\d+):(.*)$")
_GID_ATTR = {"gids": "gid", "gid_attrs/types": "type", "gid_attrs/ndevs": "ndev"}


def parse_sys_gids(text: str) -> dict[str, dict[str, dict[int, dict[str, str]]]]:
    """``grep -H . /sys/class/infiniband/*/ports/*/{gids,gid_attrs/types,gid_attrs/ndevs}/*``
    -> ``{device: {port: {index: {gid, type, ndev}}}}``: gid as the kernel prints it
    (eight colon-separated groups of four hex digits), type 'IB/RoCE v1' | 'RoCE v2', ndev
    the network device (kernel drivers/infiniband/core/sysfs.c). An all-zero GID is an
    empty entry and is left out."""
    out: dict[str, dict[str, dict[int, dict[str, str]]]] = {}
    for line in (text or "").splitlines():
        m = _GID_LINE.match(line.strip())
        if not m:
            continue
        dev, port, attr, index, value = m.groups()
        if attr == "gids" and set(value.replace(":", "")) <= {"0"}:
            continue
        out.setdefault(dev, {}).setdefault(port, {}).setdefault(int(index), {})[_GID_ATTR[attr]] = value.strip()
    return {dev: {port: {i: e for i, e in entries.items() if "gid" in e} for port, entries in ports.items()}
            for dev, ports in out.items()}


def roce_v2_ipv4(entry: dict[str, str]) -> str | None:
    """The IPv4 address of a RoCE v2 GID entry whose GID is IPv4-mapped (::ffff:a.b.c.d),
    else None: the entry an operator points MC_GID_INDEX at on RoCE."""
    groups = entry.get("gid", "").lower().split(":")
    if entry.get("type") != "RoCE v2" or len(groups) != 8 or groups[:6] != ["0000"] * 5 + ["ffff"]:
        return None
    raw = groups[6] + groups[7]
    return ".".join(str(int(raw[i:i + 2], 16)) for i in range(0, 8, 2))


# --- driver, PCI, CUDA, limits, disk -----------------------------------------------------

def parse_proc_driver_version(text: str) -> dict[str, Any]:
    """/proc/driver/nvidia/version -> ``{version, flavor}`` (flavor open | proprietary)."""
    first = next((l for l in (text or "").splitlines() if l.startswith("NVRM")), "")
    if not first:
        return {"version": None, "flavor": None}
    m = re.search(r"\s(\d{3,}\.\d+(?:\.\d+)?)\s", first + " ")
    return {"version": m.group(1) if m else None,
            "flavor": "open" if "Open Kernel Module" in first else "proprietary"}


def parse_pci_scan(text: str) -> dict[str, list[dict[str, str]]]:
    """Lines ``<sysfs path> <vendor> <class> <device>`` (from /sys/bus/pci/devices/*)
    -> NVIDIA GPUs, NVSwitches and Mellanox NICs. Works before any driver is loaded."""
    out: dict[str, list[dict[str, str]]] = {"nvidia_gpus": [], "nvswitches": [], "mellanox_nics": []}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        path, vendor, klass, device = parts[0], parts[1].lower(), parts[2].lower(), parts[3].lower()
        entry = {"bus_id": normalize_bus_id(path.rsplit("/", 1)[-1]) or path, "device_id": device}
        cls = klass[:6]
        if vendor == PCI_VENDOR_NVIDIA and cls in PCI_CLASS_GPU:
            out["nvidia_gpus"].append(entry)
        elif vendor == PCI_VENDOR_NVIDIA and cls in PCI_CLASS_NVSWITCH:
            out["nvswitches"].append(entry)
        elif vendor == PCI_VENDOR_MELLANOX and cls in PCI_CLASS_NIC:
            out["mellanox_nics"].append(entry)
    return out


def parse_cuda_probe(text: str) -> dict[str, Any]:
    """The JSON line printed by roles/preflight/files/cuda_probe.py."""
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    return {"ok": False, "error": (text or "").strip()[-300:] or "no output"}


def parse_limits(text: str) -> dict[str, Any]:
    """/proc/<pid>/limits -> memlock soft/hard in bytes (None = unlimited)."""
    for line in (text or "").splitlines():
        if line.startswith("Max locked memory"):
            parts = line[len("Max locked memory"):].split()
            def val(v: str) -> int | None:
                return None if v == "unlimited" else int(v)
            try:
                return {"soft": val(parts[0]), "hard": val(parts[1]), "known": True}
            except (IndexError, ValueError):
                break
    return {"soft": None, "hard": None, "known": False}


def parse_df(text: str) -> dict[str, Any]:
    """``df -Pk PATH`` -> ``{mount, avail_bytes, size_bytes}`` of the last row."""
    rows = [l.split() for l in (text or "").splitlines()[1:] if l.strip()]
    if not rows or len(rows[-1]) < 6:
        return {"mount": None, "avail_bytes": None, "size_bytes": None}
    r = rows[-1]
    try:
        return {"mount": r[5], "avail_bytes": int(r[3]) * 1024, "size_bytes": int(r[1]) * 1024}
    except ValueError:
        return {"mount": None, "avail_bytes": None, "size_bytes": None}


# --- the OS ---------------------------------------------------------------------------------

# Ansible's setup names these distributions otherwise than os-release's ID does
# (ansible.module_utils.common.sys_info.get_distribution); the verdict's "os" line prints the
# name, so the preflight names them as a gathered run did.
_ANSIBLE_DISTRIBUTION = {"amzn": "amazon", "rhel": "redhat", "": "otherlinux"}


def parse_os_release(text: str) -> dict[str, str]:
    """``/etc/os-release`` (KEY=value lines, values optionally quoted) -> dict."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def parse_os(os_release: str, debian_version: str = "", machine: str = "") -> dict[str, str]:
    """The OS as Ansible's setup reports it (distribution lower-cased, distribution_version,
    distribution_major_version, architecture) from ``/etc/os-release``, ``/etc/debian_version``
    and ``uname -m``, so the preflight needs no fact gathering. Debian's os-release carries
    only the major release; Ansible takes the most precise of os-release's VERSION_ID and
    /etc/debian_version (12 -> 12.11), as here. tests/test_hostfacts.py holds it against
    Ansible's own reading of the same files; molecule/preflight against setup on a host."""
    rel = parse_os_release(os_release)
    dist_id = rel.get("ID", "").strip().lower()
    dist_id = _ANSIBLE_DISTRIBUTION.get(dist_id, dist_id)
    version = rel.get("VERSION_ID", "").strip()
    if dist_id == "debian":
        m = re.match(r"\s*(\d+(?:\.\d+)*)\s*$", debian_version or "")
        if m and m.group(1).count(".") > version.count("."):
            version = m.group(1)
    return {"id": dist_id, "version": version, "major": version.split(".")[0], "arch": (machine or "").strip()}


# --- everything together --------------------------------------------------------------------

def _out(raw: dict[str, Any], key: str) -> tuple[int | None, str, str]:
    """(rc, stdout, stderr) of a registered probe; (None, '', '') when it did not run."""
    r = raw.get(key)
    if not isinstance(r, dict) or r.get("skipped"):
        return None, "", ""
    rc = r.get("rc")
    return (rc if isinstance(rc, int) else None), r.get("stdout") or "", r.get("stderr") or ""


def collect(raw: dict[str, Any]) -> dict[str, Any]:
    """Registered probe results (``{name: {rc, stdout, stderr}}``) -> one facts dict.

    Probe names: os_release, debian_version, machine (or os: a dict as parse_os returns), pid1, systemd_dir, query_gpu, smi_q,
    topo, proc_version, nvswitch_proc, pci, fabricmanager, cuda, infiniband, ib_gids, tcp, tcp6,
    socket_fds, cgroups, limits, df, model (a dict: path, exists, isdir, config_json).
    Missing probes give empty facts, never an exception.
    """
    if raw.get("os"):  # given as a dict (tests, callers with facts gathered)
        os_facts = dict(raw["os"])
    else:  # read on the host by the probes
        os_facts = parse_os(_out(raw, "os_release")[1], _out(raw, "debian_version")[1], _out(raw, "machine")[1])
    facts: dict[str, Any] = {"os": os_facts}

    _, pid1, _ = _out(raw, "pid1")
    sd_rc, _, _ = _out(raw, "systemd_dir")
    facts["init"] = {"pid1": pid1.strip() or None, "systemd_booted": sd_rc == 0}

    # Driver and GPUs
    q_rc, q_out, q_err = _out(raw, "query_gpu")
    query = parse_query_gpu(q_out) if q_rc is not None else {"gpus": [], "errors": [], "header_error": None}
    smi_q_rc, smi_q_out, _ = _out(raw, "smi_q")
    summary = smi_q_summary(smi_q_out) if smi_q_rc == 0 else {"gpus": {}}
    _, pv_out, _ = _out(raw, "proc_version")
    proc = parse_proc_driver_version(pv_out)
    _, topo_out, _ = _out(raw, "topo")
    topo = parse_topo_matrix(topo_out)
    smi_missing = q_rc in (127, 2) and not query["gpus"] and ("not found" in q_err or "No such file" in q_err
                                                             or q_rc == 127)
    version = next((g["driver_version"] for g in query["gpus"] if g["driver_version"]), None) \
        or summary.get("driver_version") or proc["version"]
    driver_error = None
    if q_rc not in (None, 0):
        driver_error = " ".join((q_err or q_out).split())[:300] or f"nvidia-smi exited {q_rc}"
    facts["driver"] = {
        "present": bool(version) or bool(query["gpus"]),
        "nvidia_smi": q_rc is not None and not smi_missing,
        "version": version,
        "branch": int(version.split(".")[0]) if version and version.split(".")[0].isdigit() else None,
        "flavor": proc["flavor"],
        "cuda_version": summary.get("cuda_version"),
        "error": driver_error,
    }
    gpus = []
    for g in query["gpus"]:
        extra = summary["gpus"].get(g["bus_id"], {})
        aff = topo["affinity"].get(f"GPU{g['index']}", {})
        gpus.append({**g, "fabric": extra.get("fabric", {}), "mig_mode": extra.get("mig_mode"),
                     "architecture": extra.get("architecture"), **aff})
    facts["gpus"] = gpus
    facts["gpu_errors"] = query["errors"]
    facts["gpu_query_header_error"] = query["header_error"]

    # PCI view (works without a driver), NVSwitch and fabric manager
    _, pci_out, _ = _out(raw, "pci")
    pci = parse_pci_scan(pci_out)
    facts["pci"] = {k: len(v) for k, v in pci.items()}
    ns_rc, ns_out, _ = _out(raw, "nvswitch_proc")
    proc_switches = [l.strip() for l in ns_out.splitlines() if l.strip()] if ns_rc == 0 else []
    facts["nvswitch"] = {
        "present": bool(proc_switches) or bool(pci["nvswitches"]),
        "proc_devices": proc_switches,
        "pci_devices": len(pci["nvswitches"]),
    }
    fm_rc, fm_out, _ = _out(raw, "fabricmanager")
    facts["fabricmanager"] = {"state": (fm_out.strip().splitlines() or ["unknown"])[0] if fm_rc is not None else None}

    # CUDA
    c_rc, c_out, c_err = _out(raw, "cuda")
    facts["cuda"] = parse_cuda_probe(c_out or c_err) if c_rc is not None else {"ok": None, "skipped": True}

    # Topology and NICs
    facts["topology"] = topo
    facts["nic_ranking"] = {str(k): v for k, v in nic_ranking(topo).items()}
    _, ib_out, _ = _out(raw, "infiniband")
    facts["infiniband"] = parse_sys_infiniband(ib_out)
    gid_rc, gid_out, _ = _out(raw, "ib_gids")
    if gid_rc is not None:  # an older facts file has no GID table: unknown, not empty
        for dev, ports in parse_sys_gids(gid_out).items():
            for port, gids in ports.items():
                facts["infiniband"].setdefault(dev, {}).setdefault(port, {})["gids"] = gids
        for ports in facts["infiniband"].values():
            for port in ports.values():
                port.setdefault("gids", {})

    # Ports
    _, tcp, _ = _out(raw, "tcp")
    _, tcp6, _ = _out(raw, "tcp6")
    _, fds, _ = _out(raw, "socket_fds")
    _, cgs, _ = _out(raw, "cgroups")
    _, uids, _ = _out(raw, "proc_uids")
    owners = parse_socket_owners(fds, cgs)
    units_by_uid = units_per_uid(uids, cgs)
    listeners = []
    for s in listening_sockets(tcp, tcp6):
        owner = owners.get(s["inode"], {})
        listeners.append({"address": s["address"], "port": s["port"], "inode": s["inode"],
                          "pid": owner.get("pid"), "unit": owner.get("unit"),
                          "uid_units": units_by_uid.get(s["uid"], [])})
    listeners.sort(key=lambda s: (s["port"], s["address"]))
    facts["listeners"] = listeners

    # Limits, disk, model
    _, lim, _ = _out(raw, "limits")
    facts["memlock"] = parse_limits(lim)
    _, df, _ = _out(raw, "df")
    facts["disk"] = parse_df(df)
    facts["model"] = dict(raw.get("model") or {})
    return facts
