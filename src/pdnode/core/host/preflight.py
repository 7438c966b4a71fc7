"""Preflight judgement: host facts + what the plan needs -> problems, one line each.

``judge(facts, expect)`` is the only place that decides whether a host can take the
plan. ``facts`` comes from :func:`pdnode.core.host.facts.collect`; ``expect`` from
:func:`expectations` (the plan, with explicit overrides). Nothing here touches the host:
the port judgement (``_ports``) is pdnode.node.preflight's, which runs it on the host too.
"""

from __future__ import annotations

from typing import Any

from ...node.preflight import _J, Problem, _ports
from ..plan.managed import own_units
from .facts import GOOD_NIC_LINKS, LINK_RANK, roce_v2_ipv4

DEFAULT_SUPPORTED_OS = ("ubuntu 22.04", "ubuntu 24.04", "debian 12")
RDMA_BACKENDS = ("mooncake", "nixl")
SEVERITIES = ("error", "warning")


# --- expectations ---------------------------------------------------------------------

EXPECT_KEYS = ("gpu_count", "gpu_model", "driver_branch", "gpu_ids", "ports", "nics",
               "transfer_backend", "model_path", "own_unit_prefix", "supported_os",
               "require_systemd", "min_free_disk_gb", "check_cuda", "engine", "own_units",
               "kv_path", "kv_gpu_pairs", "router_package", "gid_index")


def expectations(plan: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan (``Plan.as_dict()`` / the ``pdnode_plan`` filter) -> what the host must offer.

    ``overrides`` win over the plan where they are not None, so an inventory without a
    full plan (a one-GPU test host) can give the expectations directly.
    """
    exp: dict[str, Any] = {k: None for k in EXPECT_KEYS}
    if plan:
        s = plan.get("settings") or {}
        engines = [svc for svc in (plan.get("services") or {}).values()
                   if isinstance(svc, dict) and svc.get("role") in ("prefill", "decode")]
        gpus = {svc.get("id"): svc.get("gpus") or [] for svc in engines} or (plan.get("gpus") or {})
        nics = plan.get("nics")
        if nics is None:
            nics = s.get("pdnode_ib_devices") or {}
        exp.update({
            "gpu_count": s.get("pdnode_gpu_count"),
            "gpu_model": s.get("pdnode_gpu_model"),
            "driver_branch": s.get("pdnode_driver_branch"),
            "gpu_ids": sorted({int(g) for ids in gpus.values() for g in ids}),
            "ports": dict(plan.get("ports") or {}),
            "nics": {str(k): v for k, v in (nics or {}).items()},
            "transfer_backend": s.get("pdnode_transfer_backend"),
            # an hf:// model is not there yet: the model role downloads it, checking the
            # disk first (pdnode.node.model_fetch); a local:// or hand-placed one must be
            "model_path": None if (plan.get("model") or {}).get("scheme") == "hf" else s.get("pdnode_model_path"),
            "own_unit_prefix": s.get("pdnode_service_prefix"),
            "engine": (plan.get("install") or {}).get("engine"),
            "own_units": own_units(plan) or None,
            # the KV path the plan chose, and the GPUs of each prefill -> decode pair on this host
            "kv_path": ((plan.get("cluster") or {}).get("kv") or {}).get("path"),
            "kv_gpu_pairs": [[p.get("gpus") or [], d.get("gpus") or []]
                             for p in engines if p.get("role") == "prefill"
                             for d in engines if d.get("role") == "decode"] or None,
            # every host installs the release venv, router package included
            "router_package": (plan.get("install") or {}).get("router_package"),
            # the GID index Mooncake uses on every RDMA device (one for all: it reads
            # MC_GID_INDEX, then NCCL_IB_GID_INDEX; config.cpp loadGlobalConfig)
            "gid_index": _gid_index(s.get("pdnode_engine_environment") or {}),
        })
    for key, value in (overrides or {}).items():
        if key not in EXPECT_KEYS:
            raise ValueError(f"unknown preflight expectation {key!r} (known: {', '.join(EXPECT_KEYS)})")
        if value is not None:
            exp[key] = _coerce(key, value)
    if exp["nics"]:
        exp["nics"] = {str(k): v for k, v in exp["nics"].items()}
    if exp["supported_os"] is None:
        exp["supported_os"] = list(DEFAULT_SUPPORTED_OS)
    if exp["require_systemd"] is None:
        exp["require_systemd"] = True
    if exp["check_cuda"] is None:
        exp["check_cuda"] = True
    return exp


def _gid_index(environment: dict[str, Any]) -> int | None:
    for name in ("MC_GID_INDEX", "NCCL_IB_GID_INDEX"):
        value = environment.get(name)
        if value is not None and str(value).strip().isdigit():
            return int(str(value).strip())
    return None


_INTS = ("gpu_count", "driver_branch", "gid_index")
_BOOLS = ("require_systemd", "check_cuda")


def _coerce(key: str, value: Any) -> Any:
    """Values given on the command line (``-e key=value``) arrive as strings."""
    try:
        if key in _INTS:
            return int(value)
        if key == "min_free_disk_gb":
            return float(value)
        if key == "gpu_ids":
            return [int(g) for g in value]
        if key in _BOOLS and isinstance(value, str):
            low = value.strip().lower()
            if low in ("true", "yes", "on", "1"):
                return True
            if low in ("false", "no", "off", "0", ""):
                return False
            raise ValueError(value)
        if key == "ports":
            return {str(k): int(v) for k, v in dict(value).items()}
    except (TypeError, ValueError):
        raise ValueError(f"preflight expectation {key}={value!r} has the wrong type") from None
    return value


# --- the checks -------------------------------------------------------------------------

def _os(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    os_ = facts.get("os") or {}
    dist = str(os_.get("id") or "").lower()
    version = str(os_.get("version") or "")
    major = str(os_.get("major") or version.split(".")[0])
    supported = [s.lower() for s in exp["supported_os"]]
    if f"{dist} {version}" not in supported and f"{dist} {major}" not in supported:
        j.error("os", f"{dist} {version}".strip(), f"is not a supported OS ({', '.join(exp['supported_os'])})",
                "install a supported release; the NVIDIA repository URL and the package names depend on it")


# Router packages with wheels for x86_64 only (docs/smg.md: smg 1.13.0 has none for aarch64).
X86_64_ONLY = {"smg": "sglang-router"}


def _arch(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    arch = str((facts.get("os") or {}).get("arch") or "")
    package = exp["router_package"]
    if arch and arch != "x86_64" and package in X86_64_ONLY:
        j.error("router_package", package, f"has no wheel for {arch} (x86_64 only; docs/smg.md)",
                f"set pdnode_router_package: {X86_64_ONLY[package]} for this host")


def _init(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    init = facts.get("init") or {}
    if exp["require_systemd"] and init.get("pid1") != "systemd" and not init.get("systemd_booted"):
        j.error("init.pid1", init.get("pid1"), "systemd is not PID 1 (no /run/systemd/system): the node's "
                "services are systemd units", "run on a host booted with systemd (in a container: systemd as PID 1)")


def _gpus(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> int | None:
    drv = facts.get("driver") or {}
    gpus = facts.get("gpus") or []
    pci_count = (facts.get("pci") or {}).get("nvidia_gpus")
    if drv.get("present") and (gpus or facts.get("gpu_errors")):
        count, source = len(gpus) + len(facts.get("gpu_errors") or []), "nvidia-smi"
    else:
        count, source = pci_count, "PCI scan, no NVIDIA driver loaded"
    if facts.get("gpu_query_header_error"):
        # hostfacts read no row under an unexpected header: its values would sit under other fields' names.
        j.error("gpu.query_header", facts["gpu_query_header_error"],
                "nvidia-smi printed other columns than the preflight asked for, so no GPU row was read",
                "update QUERY_GPU_FIELDS in src/pdnode/core/host/facts.py and the query_gpu probe in "
                "roles/preflight/vars/main.yml together for this driver")
    for line in facts.get("gpu_errors") or []:
        j.error("gpu.nvidia_smi", line, "nvidia-smi cannot query a GPU",
                "check `nvidia-smi -q` and dmesg (Xid errors); reset or reseat the GPU, then re-run the preflight")
    if drv.get("error") and not gpus and drv.get("present"):
        j.error("driver.nvidia_smi", drv["error"], "the NVIDIA driver is installed but nvidia-smi fails",
                "load the driver (reboot after an install or upgrade), see docs/runbooks/driver-and-fabric.md")
    expected = exp["gpu_count"]
    if expected is not None and count is not None and count != expected:
        missing = [g for g in (exp["gpu_ids"] or []) if g >= count]
        extra = f"; the plan uses GPU ids {missing} that do not exist" if missing else ""
        j.error("gpu.count", count, f"the host has {count} NVIDIA GPU(s) ({source}) but the inventory expects "
                f"{expected} (pdnode_gpu_count){extra}",
                "run against the right host, or correct pdnode_gpu_count and the instances' gpus")
    elif count is not None and exp["gpu_ids"]:
        missing = [g for g in exp["gpu_ids"] if g >= count]
        if missing:
            j.error("gpu.ids", missing, f"the plan uses GPU ids that do not exist on a host with {count} GPU(s)",
                    f"use GPU ids 0..{count - 1} in the gpus of pdnode_prefill_instances/pdnode_decode_instances")
    want = exp["gpu_model"]
    if want and gpus:
        wrong = sorted({g["name"] for g in gpus if (g.get("name") or "").lower() != want.lower()})
        if wrong:
            j.error("gpu.model", ", ".join(str(w) for w in wrong), f"GPU model differs from pdnode_gpu_model={want!r}",
                    "set pdnode_gpu_model to the exact name nvidia-smi prints, or use the right host")
    if want and gpus:
        _gpu_memory(j, [g for g in gpus if (g.get("name") or "").lower() == want.lower()], want)
    for g in gpus:
        if g.get("mig_mode") == "Enabled":
            j.error(f"gpu{g['index']}.mig", "Enabled", "MIG is enabled: SGLang needs whole GPUs",
                    f"disable it: nvidia-smi -i {g['index']} -mig 0, then reset the GPU")
    off = [g["index"] for g in gpus if g.get("persistence_mode") == "Disabled"]
    if off:
        j.warn("gpu.persistence_mode", off, "persistence mode is off on these GPUs (slow first CUDA call, "
               "lost state between jobs)", "run the provision phase (nvidia_driver enables nvidia-persistenced)")
    return count if drv.get("present") and gpus else None


# How far the host's memory.total may be from the GPU table's before the capacity check
# that pdnode check ran with the table's value stops being trustworthy. Drivers differ by
# well under 1% for one model (A100 80GB: 81251 MiB before R470, 81920 since).
GPU_MEMORY_TOLERANCE = 0.02


def _gpu_memory(j: _J, gpus: list[dict[str, Any]], model: str) -> None:
    """The host's memory.total against data/gpu-memory.json, which pdnode check's
    capacity check used for pdnode_gpu_model."""
    from ..rules.capacity import GPU_TABLE, gpu_memory_mib

    table_file = GPU_TABLE.relative_to(GPU_TABLE.parents[3]).as_posix()
    seen = sorted({g["memory_total_mib"] for g in gpus if g.get("memory_total_mib")})
    table = gpu_memory_mib(model)
    if table is None:
        host = seen[0] if len(seen) == 1 else "<memory.total in MiB>"
        j.warn("gpu.memory_table", model, f"pdnode_gpu_model is not in {table_file}, so pdnode check could not "
               "judge whether the model's weights fit the GPUs", f'add "{model}": {{"memory_total_mib": {host}, '
               f'"_source": "<where the number comes from>"}} to {table_file} (docs/capacity.md)')
        return
    for mib in seen:
        diff = (mib - table) / table
        if abs(diff) <= GPU_MEMORY_TOLERANCE:
            continue
        ids = [g["index"] for g in gpus if g.get("memory_total_mib") == mib]
        rule = (f"GPUs {ids} report {mib} MiB, {diff:+.1%} from the {table} MiB that {table_file} gives "
                f"{model!r} and that pdnode check's capacity check used")
        # Less memory than the table: the weights that pdnode check let through may not
        # fit. More: the check was only stricter than it had to be.
        if diff < 0:
            j.error("gpu.memory_total", mib, rule, f"check for ECC, MIG or a vGPU slice on the host; if {mib} MiB is "
                    f"the model's full memory, correct its memory_total_mib in {table_file} and run pdnode check")
        else:
            j.warn("gpu.memory_total", mib, rule, f"correct memory_total_mib in {table_file} to {mib}")


def _driver(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    drv = facts.get("driver") or {}
    branch = exp["driver_branch"]
    if not drv.get("present"):
        j.warn("driver", None, "no NVIDIA driver is loaded: GPU model, fabric and CUDA cannot be checked yet",
               "the provision phase installs the pinned branch; run the preflight again after its reboot")
        return
    if branch is not None and drv.get("branch") != int(branch):
        j.error("driver.version", drv.get("version"), f"the loaded driver is not on the pinned branch {branch} "
                "(pdnode_driver_branch)", f"switch with the nvidia_driver role (pins branch {branch}) and reboot, "
                "or pin the branch the host runs")


def _fabric(j: _J, facts: dict[str, Any]) -> None:
    """NVLink fabric. The fabric manager runs where the NVSwitches are visible; in a VM
    given an NVSwitch partition (seen on a 2-GPU H200 machine) the switches are managed
    outside and only the GPUs' fabric state tells: judge it wherever a GPU reports one."""
    if not (facts.get("driver") or {}).get("present"):
        return
    switches = (facts.get("nvswitch") or {}).get("present")
    if switches:
        state = (facts.get("fabricmanager") or {}).get("state")
        if state != "active":
            j.error("fabricmanager", state, "the host has NVSwitches but nvidia-fabricmanager is not active: "
                    "CUDA fails on every GPU until the fabric is up",
                    "install nvidia-fabricmanager at exactly the driver version and start it "
                    "(docs/runbooks/driver-and-fabric.md)")
    for g in facts.get("gpus") or []:
        fab = g.get("fabric") or {}
        if fab.get("state") is None and not switches:
            continue  # a PCIe GPU without NVLink fabric: nothing to register
        if fab.get("state") != "Completed":
            j.error(f"gpu{g['index']}.fabric.state", fab.get("state"), "the GPU has not finished NVLink fabric "
                    "registration (nvidia-smi -q, Fabric: State must be Completed)",
                    "check nvidia-fabricmanager's journal; restart it, and reset the GPUs if it stays In Progress")
        elif fab.get("status") not in (None, "Success"):
            j.error(f"gpu{g['index']}.fabric.status", fab.get("status"), "fabric registration completed with an "
                    "error", "read `journalctl -u nvidia-fabricmanager`; driver and fabric manager versions must match")


def _cuda(j: _J, facts: dict[str, Any], exp: dict[str, Any], smi_count: int | None) -> None:
    cuda = facts.get("cuda") or {}
    if not exp["check_cuda"] or cuda.get("skipped") or not (facts.get("driver") or {}).get("present"):
        return
    if not cuda.get("ok"):
        j.error("cuda.init", cuda.get("error"), "CUDA does not initialise (cuInit through libcuda)",
                "see docs/runbooks/driver-and-fabric.md: driver/library mismatch, fabric manager, or a reboot pending")
        return
    n = cuda.get("device_count")
    if smi_count is not None and n != smi_count:
        j.error("cuda.device_count", n, f"CUDA sees {n} device(s) but nvidia-smi lists {smi_count}",
                "look for CUDA_VISIBLE_DEVICES in the environment, or a GPU that fails to initialise (dmesg Xid)")
    for d in cuda.get("devices") or []:
        if not d.get("ok"):
            j.error(f"cuda.device{d.get('ordinal')}", d.get("error"), "a CUDA context cannot be created on this GPU",
                    "check dmesg for Xid errors and nvidia-smi -q for this GPU; reset it")


def _nics(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    backend = exp["transfer_backend"]
    ib = facts.get("infiniband") or {}
    nics = exp["nics"] or {}
    if backend in RDMA_BACKENDS and not nics and not ib:
        j.error("rdma.devices", 0, f"pdnode_transfer_backend={backend!r} moves the KV cache over RDMA but the host "
                "has no RDMA device (/sys/class/infiniband is empty)",
                "install/enable the NICs and the rdma role, or use pdnode_transfer_backend: mooncake_tcp")
        return
    if backend not in RDMA_BACKENDS or not nics:
        return
    topo_rank = facts.get("nic_ranking") or {}
    links = (facts.get("topology") or {}).get("links") or {}
    names = (facts.get("topology") or {}).get("nic_names") or {}
    column_of = {name: col for col, name in names.items()}
    for gpu, devs in sorted(nics.items(), key=lambda kv: int(kv[0])):
        for dev in [d.strip() for d in str(devs).split(",") if d.strip()]:
            field = f"nic.{dev}"
            if dev not in ib:
                j.error(field, dev, f"RDMA device for GPU {gpu} (pdnode_ib_devices) does not exist under "
                        f"/sys/class/infiniband (present: {', '.join(sorted(ib)) or 'none'})",
                        "correct pdnode_ib_devices, or install the NIC driver (rdma role)")
                continue
            ports = ib[dev]
            if not any(p.get("state") == "ACTIVE" for p in ports.values()):
                states = ", ".join(f"port {n}: {p.get('state')}/{p.get('phys_state')}" for n, p in sorted(ports.items()))
                j.error(field, states, f"RDMA device for GPU {gpu} has no ACTIVE port",
                        "check the cable and the subnet manager (ibstat; `sminfo` on InfiniBand), then re-run")
            link = links.get(f"GPU{gpu}", {}).get(column_of.get(dev, dev))
            if link is None:
                j.warn(field, None, f"`nvidia-smi topo -m` does not place {dev} relative to GPU {gpu}",
                       "check the NIC legend of `nvidia-smi topo -m` and pdnode_ib_devices")
            elif link not in GOOD_NIC_LINKS:
                # The nearest NIC that can carry RDMA (a device with an ACTIVE port); a
                # nearer one than the map's is a refusal: the first KV transfer crosses the
                # socket and can burn SGLang's 300 s waiting timeout (sglang#39584).
                usable = [r for r in topo_rank.get(str(gpu)) or []
                          if any(p.get("state") == "ACTIVE" for p in (ib.get(r["nic"]) or {}).values())]
                best = usable[0] if usable else {}
                if best and LINK_RANK.get(best["link"], 9) < LINK_RANK.get(link, 9):
                    j.error(field, link, f"GPU {gpu} -> {dev} crosses {link} while {best['nic']} is "
                            f"{best['link']} from it (nvidia-smi topo -m)",
                            f"map GPU {gpu} to {best['nic']} in pdnode_ib_devices")
                else:
                    j.warn(field, link, f"GPU {gpu} -> {dev} crosses {link} (not behind the GPU's PCIe switch: "
                           f"PIX/PXB), and no RDMA NIC of the host is nearer",
                           "expect slower KV transfers from this GPU; a NIC in a slot behind its PCIe switch "
                           "would remove the hop")


def _roce_gid(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    """On RoCE (an active port whose link_layer is Ethernet), Mooncake needs the GID index
    that is RoCE v2 with the NIC's IPv4 address; left to itself it ranks the table its own
    way, and a link-local or another address's GID fails the first transfer (sglang#30737:
    "GID is NULL, please check your GID index by specifying MC_GID_INDEX"). One index serves
    every device, and a device where it is wrong is disabled (rdma_transport.cpp), so the
    index must be right on every planned NIC."""
    if exp["transfer_backend"] != "mooncake" or exp["kv_path"] not in (None, "rdma") or not exp["nics"]:
        return
    ib = facts.get("infiniband") or {}
    roce: dict[str, tuple[str, dict[int, dict[str, str]] | None]] = {}
    for devs in exp["nics"].values():
        for dev in [d.strip() for d in str(devs).split(",") if d.strip()]:
            for number, port in sorted((ib.get(dev) or {}).items()):
                if port.get("state") == "ACTIVE" and port.get("link_layer") == "Ethernet":
                    roce.setdefault(dev, (number, port.get("gids")))
    if not roce:
        return
    names = ", ".join(sorted(roce))
    unread = sorted(dev for dev, (_, gids) in roce.items() if gids is None)
    if unread:
        j.warn("rdma.gid_table", ", ".join(unread), "RoCE NICs whose GID table the facts do not hold (gathered by an "
               "older pdnode): MC_GID_INDEX is not checked", "re-run the preflight")
        return
    usable = [{i for i, e in gids.items() if roce_v2_ipv4(e)} for _, gids in roce.values()]  # type: ignore[union-attr]
    common = sorted(set.intersection(*usable))
    if common:
        suggest = f'set pdnode_engine_environment: {{MC_GID_INDEX: "{common[0]}"}} (RoCE v2 with its IPv4 address on {names})'
    else:
        suggest = ("give each NIC's network device its IPv4 address (ip addr), so that one GID index is RoCE v2 with "
                   "it on every NIC, then set pdnode_engine_environment.MC_GID_INDEX to that index")
    index = exp["gid_index"]
    if index is None:
        j.error("rdma.gid_index", None, f"RoCE NICs ({names}: link_layer Ethernet) and no MC_GID_INDEX: Mooncake picks "
                "a GID by its own ranking, and a link-local or another address's GID fails the first KV transfer "
                "(sglang#30737)", suggest)
        return
    for dev, (number, gids) in sorted(roce.items()):
        entry = (gids or {}).get(index)
        if entry is None:
            j.error(f"nic.{dev}.gid", index, f"MC_GID_INDEX {index} is an empty entry of {dev} port {number}'s GID "
                    "table: Mooncake disables the device", suggest)
        elif not roce_v2_ipv4(entry):
            j.error(f"nic.{dev}.gid", index, f"MC_GID_INDEX {index} on {dev} port {number} is "
                    f"{entry.get('type', 'of unknown type')} {entry['gid']}"
                    f"{' (' + entry['ndev'] + ')' if entry.get('ndev') else ''}, not RoCE v2 with an IPv4 address",
                    suggest)


def _kv_nvlink(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    """The plan moves KV over Mooncake's intra-node NVLink transport: each prefill GPU
    and decode GPU of a pair should be joined by NVLink (NV# in `nvidia-smi topo -m`).
    Over a PCIe link the transport still works (CUDA IPC), at PCIe speed: a warning."""
    if exp.get("kv_path") != "nvlink" or not exp.get("kv_gpu_pairs"):
        return
    links = (facts.get("topology") or {}).get("links") or {}
    if not links:
        return  # no topology read (the GPU checks say why)
    slow = sorted({(a, b, links.get(f"GPU{a}", {}).get(f"GPU{b}") or "?")
                   for prefill, decode in exp["kv_gpu_pairs"] for a in prefill for b in decode
                   if not str(links.get(f"GPU{a}", {}).get(f"GPU{b}") or "").startswith("NV")})
    if slow:
        shown = ", ".join(f"GPU {a} -> GPU {b}: {link}" for a, b, link in slow[:4]) + (
            f" (and {len(slow) - 4} more)" if len(slow) > 4 else "")
        j.warn("kv.nvlink", shown, "the plan moves KV over Mooncake's intra-node NVLink transport, but these prefill "
               "-> decode GPUs are not joined by NVLink (it then runs at PCIe speed)",
               "set pdnode_kv_intranode_nvlink: false, or give prefill and decode GPUs that NVLink joins")


def _memlock(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    mem = facts.get("memlock") or {}
    if exp["transfer_backend"] in RDMA_BACKENDS and mem.get("known") and mem.get("soft") is not None:
        j.warn("memlock", mem["soft"], "the locked-memory limit is not unlimited: RDMA memory registration of the "
               "KV cache fails (the units set LimitMEMLOCK=infinity; tools run by hand use this limit)",
               "apply the rdma role (limits.d for the service user) and log in again")


def _model(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    path = exp["model_path"]
    if not path:
        return
    m = facts.get("model") or {}
    if not m.get("exists"):
        j.error("model.path", path, "the model directory does not exist on the host (pdnode_model_path)",
                "copy the model there first (the node stays offline: HF_HUB_OFFLINE=1)")
    elif not m.get("isdir"):
        j.error("model.path", path, "pdnode_model_path is not a directory", "point it at the model's directory")
    elif not m.get("config_json"):
        j.error("model.config_json", f"{path}/config.json", "the model directory has no config.json "
                "(SGLang reads it to resolve the model)", "copy the complete model (config.json, tokenizer, weights)")


def _disk(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    need = exp["min_free_disk_gb"]
    disk = facts.get("disk") or {}
    if need is None or disk.get("avail_bytes") is None:
        return
    free_gb = disk["avail_bytes"] / 1e9
    if free_gb < float(need):
        j.error("disk.free", f"{free_gb:.1f} GB on {disk.get('mount')}", f"less than the {need} GB the virtual "
                "environments need (SGLang with its CUDA stack is several GB per release)",
                "free space there or move the venv root (preflight_disk_path / the sglang role's venv root)")


def judge(facts: dict[str, Any], expect: dict[str, Any]) -> list[Problem]:
    """Every problem the host has for this plan, errors first, in a stable order."""
    exp = expectations(None, expect)
    j = _J()
    _os(j, facts, exp)
    _arch(j, facts, exp)
    _init(j, facts, exp)
    # The stand-in engine (pdnode_engine: sim) runs on hosts without GPUs or RDMA NICs
    # by design: the hardware checks do not apply there.
    if exp.get("engine") != "sim":
        _driver(j, facts, exp)
        smi_count = _gpus(j, facts, exp)
        _fabric(j, facts)
        _cuda(j, facts, exp, smi_count)
        _nics(j, facts, exp)
        _roce_gid(j, facts, exp)
        _kv_nvlink(j, facts, exp)
    _memlock(j, facts, exp)
    _ports(j, facts, exp)
    _model(j, facts, exp)
    _disk(j, facts, exp)
    return sorted(j.problems, key=lambda p: SEVERITIES.index(p.severity))


def report(facts: dict[str, Any], expect: dict[str, Any]) -> dict[str, Any]:
    """judge() as plain data: {ok, errors: [line], warnings: [line], problems: [dict]}."""
    problems = judge(facts, expect)
    return {
        "ok": not any(p.severity == "error" for p in problems),
        "errors": [p.line for p in problems if p.severity == "error"],
        "warnings": [p.line for p in problems if p.severity == "warning"],
        "problems": [p.as_dict() for p in problems],
    }


