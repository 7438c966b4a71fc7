"""How each request's KV cache moves from a prefill to a decode: the path the plan
chooses, its expected speed, and what the engines need for it (docs/kv-path.md).

One transport per engine. Mooncake's transfer engine installs a single transport when
it starts: with MC_INTRANODE_NVLINK set it installs the intra-node NVLink transport
(CUDA IPC) *instead of* RDMA or TCP, ahead of HCA detection (Mooncake,
mooncake-transfer-engine/src/transfer_engine_impl.cpp: "Explicit env var overrides take
priority over HCA auto-detection"); only MC_FORCE_TCP comes before it (0.3.14: "MC_FORCE_TCP
is set, using TCP transport only"). That transport reaches GPUs of its own host only. The router sends any prefill's KV to any decode, so the path is the
layout's: NVLink when every instance runs on one host (whose GPUs NVLink joins),
otherwise RDMA over the NICs, or TCP without them.

SGLang 0.5.23's side of NVLink: SGLANG_MOONCAKE_CUSTOM_MEM_POOL=INTRA_NODE_NVLINK makes
no custom pool (srt/disaggregation/mooncake/utils.py) and puts the hand-off's metadata
buffers on the GPU, where CUDA IPC reaches them (srt/disaggregation/utils.py). The
backend must be `mooncake`: `mooncake_tcp` sets MC_FORCE_TCP
(srt/arg_groups/pd_disaggregation_hook.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from ..rules.environment_types import TRUTH

# Expected hand-off speed per path, GB/s (1e9 bytes), and where the number comes from.
SPEEDS: dict[str, tuple[float, str]] = {
    "nvlink": (385.0, "NVLink between two H200s (torch peer copy); Mooncake's intra-node transport moved 1 GiB at "
                      "2,018-2,071 GB/s within one H200 (docs/hardware-runs.md)"),
    "rdma": (25.0, "nominal: one 200-400 Gb/s NIC per GPU; measure it with the Mooncake check"),
    "tcp": (1.8, "measured: Mooncake over TCP on an H200 host without NICs, 1.8-2.0 GB/s (docs/hardware-runs.md)"),
    "nixl": (25.0, "nominal: UCX over the per-GPU NICs"),
}
NVLINK_ENVIRONMENT = {"MC_INTRANODE_NVLINK": "1", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "INTRA_NODE_NVLINK"}
# On RDMA, Mooncake without a usable NIC installs TCP and says only "no HCA detected"
# (field failures 7c and 8). MC_FORCE_HCA (Mooncake#1259, made for this; tested for
# presence) makes it install RDMA anyway, which then fails the engine's start with
# "RdmaTransport: No available RNIC": a deploy that stops naming the engine, not a node
# that serves at TCP's speed. Where the NICs are there it changes nothing.
RDMA_ENVIRONMENT = {"MC_FORCE_HCA": "1"}
PATH_ENVIRONMENT = {"nvlink": NVLINK_ENVIRONMENT, "rdma": RDMA_ENVIRONMENT}
# What a path silently falls back to when its transport cannot start (Mooncake without
# MC_INTRANODE_NVLINK in one process, or without a usable HCA: "Using TCP transport").
# TCP has nothing slower below it.
FALLBACK = {"nvlink": "tcp", "rdma": "tcp", "nixl": "tcp", "tcp": None}
# TCP measured 1.4-2.0 GB/s (docs/hardware-runs.md): the verify's default KV-speed floor
# sits 2.5x above its highest measurement for a path that falls back to it, so a fall-back
# FAILs while a working link's small-prompt overheads do not; on TCP itself the floor is
# a quarter of its lowest measurement (a stalled or shared link, not a slow prompt).
TCP_MEASURED_GB_S = (1.4, 2.0)


def kv_bytes_from_config(cfg: Any) -> int | None:
    """KV cache bytes per token of a model's config.json (bf16 cache): MLA stores the
    compressed latent plus the rope key per layer, GQA a key and a value per KV head."""
    if not isinstance(cfg, dict):
        return None
    text = cfg.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in cfg:
        cfg = text
    layers = cfg.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        return None
    if isinstance(cfg.get("kv_lora_rank"), int):
        return layers * (cfg["kv_lora_rank"] + int(cfg.get("qk_rope_head_dim") or 0)) * 2
    heads = cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim")
    if not isinstance(head_dim, int) and isinstance(cfg.get("hidden_size"), int) and isinstance(heads, int) and heads:
        head_dim = cfg["hidden_size"] // heads
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        return None
    return 2 * layers * kv_heads * head_dim * 2


def kv_bytes_per_token(v: dict[str, Any], repo: Path) -> tuple[int | None, str]:
    """The model's KV bytes per prompt token, and where the number comes from (a
    relative pdnode_model_controller_path is relative to ``repo``, as for capacity)."""
    if v.get("pdnode_engine") == "sim":
        return v.get("pdnode_sim_kv_bytes_per_token"), "the stand-in's pdnode_sim_kv_bytes_per_token"
    if isinstance(v.get("pdnode_model_kv_bytes_per_token"), int):
        return v["pdnode_model_kv_bytes_per_token"], "pdnode_model_kv_bytes_per_token"
    path = v.get("pdnode_model_controller_path")
    if isinstance(path, str) and path:
        try:
            value = kv_bytes_from_config(json.loads((repo / path / "config.json").read_text(encoding="utf-8")))
        except (OSError, ValueError):
            value = None
        if value:
            return value, f"{path}/config.json"
    return None, "unknown (set pdnode_model_kv_bytes_per_token)"


def choose(v: dict[str, Any], multi_host: bool, nic_map: bool) -> dict[str, Any]:
    """The layout's KV path: {path, gb_s, source, why, environment, backend}."""
    backend = v["pdnode_transfer_backend"]
    mooncake = backend in ("mooncake", "mooncake_tcp")
    if mooncake and not multi_host and v["pdnode_kv_intranode_nvlink"]:
        path, why = "nvlink", ("every instance runs on this host: Mooncake's intra-node NVLink transport "
                               "(pdnode_kv_intranode_nvlink)")
    elif backend == "nixl":
        path, why = "nixl", "pdnode_transfer_backend: nixl (UCX chooses its transport)"
    elif backend == "mooncake":
        path = "rdma"
        why = "RDMA over " + ("the per-GPU NIC map (pdnode_ib_devices)" if nic_map else "the NICs Mooncake finds")
    else:
        path, why = "tcp", "pdnode_transfer_backend: mooncake_tcp (no RDMA NICs)"
    if mooncake and multi_host and v["pdnode_kv_intranode_nvlink"]:
        why += ("; not NVLink: the layout spans hosts, and a Mooncake engine runs one transport, which for NVLink "
                "reaches its own host only")
    elif mooncake and not multi_host and not v["pdnode_kv_intranode_nvlink"]:
        why += " (pdnode_kv_intranode_nvlink: false)"
    if v.get("pdnode_engine") == "sim":
        why += ("; the stand-in engine renders the same settings; its non-CUDA Mooncake build moves the bytes "
                "over loopback TCP, paced to the path's speed (PDNODE_SIM_KV_GB_S)")
    gb_s, source = SPEEDS[path]
    return {"path": path, "gb_s": gb_s, "source": source, "why": why,
            "environment": dict(PATH_ENVIRONMENT.get(path, {})),
            # mooncake_tcp would force TCP (MC_FORCE_TCP) under the NVLink transport
            "backend": "mooncake" if path == "nvlink" else backend}


def floor_gb_s(path: str) -> tuple[float, str]:
    """The verify's default KV-speed floor for a path (the mean of
    sglang:kv_transfer_speed_gb_s over the verification's requests), and why."""
    low, high = TCP_MEASURED_GB_S
    if FALLBACK[path] == "tcp":
        return round(2.5 * high, 3), (f"2.5x TCP's highest measured {high:g} GB/s: a {path} hand-off that fell "
                                      "back to TCP fails it")
    return round(low / 4, 3), f"a quarter of TCP's lowest measured {low:g} GB/s: a stalled or shared link fails it"


def link_checks(path: str, pairs: list[tuple[str, int, str, int]], ib_map: dict[int, str]) -> list[dict[str, Any]]:
    """The Mooncake transfer check (roles/mooncake/files/mooncake_loopback_check.py) that
    measures the layout's path on the host, one per distinct (prefill GPU, decode GPU)
    pair: ``pairs`` holds (prefill id, its first GPU, decode id, its first GPU). Only a
    path one host can measure (the check's two processes run on one host)."""
    if path not in ("nvlink", "rdma", "tcp"):
        return []
    checks: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for prefill, src, decode, dst in pairs:
        if (src, dst) in seen:
            continue
        seen.add((src, dst))
        args = ["--src-gpu", str(src), "--dst-gpu", str(dst)]
        if path == "nvlink":
            args.append("--intranode-nvlink")
        elif path == "rdma":
            args += ["--protocol", "rdma", "--device-name", ib_map.get(src, "")]
        else:
            args += ["--protocol", "tcp"]
        checks.append({"pair": f"{prefill} -> {decode}", "src_gpu": src, "dst_gpu": dst, "args": args})
    return checks


def handoff_seconds(bytes_per_token: int | None, prompt_tokens: int, gb_s: float) -> float | None:
    """What the hand-off adds to TTFT for one prompt of ``prompt_tokens``."""
    if not bytes_per_token:
        return None
    return bytes_per_token * prompt_tokens / (gb_s * 1e9)


# --- The engines' environment judged against the path (issue 28, item 7; docs/kv-path.md) ---
# pdnode_engine_environment reaches every prefill and decode; these variables choose
# Mooncake's transport or SGLang's KV memory pool, so a value there can make the engines do
# something else than the path the plan chose (and `explain`, the verify floor and the
# planner's hand-off term describe). Read from the pinned releases as SGLang 0.5.23 starts
# Mooncake 0.3.14: TransferEngine.initialize(host, "P2PHANDSHAKE", MOONCAKE_PROTOCOL, device)
# with topology auto-discovery, so the transport comes from the MC_* switches and the NICs
# found (transfer_engine_impl.cpp), never from the protocol argument, which only picks the
# buffer allocator (transfer_engine_py.cpp, initMemoryAllocator). A verdict per variable:
#   owned        the plan renders it for the path: a second value would be replaced unseen
#   contradicts  the engines would run another transport or memory pool than the plan says
#   surprising   it does nothing on this path, or steers it where pdnode checks nothing
# What Mooncake's CUDA builds log when the transfer engine starts: the transport it
# installed (transfer_engine_impl.cpp; the lines read in the 0.3.14 cuda13 wheel's
# engine.so). "no HCA detected" is the silent fall-back of field failure 8 (vllm#51518);
# NVLink "forced or no HCA" is the cross-node (MNNVL) transport, no path of the plan's.
MOONCAKE_FORCED_TCP = "MC_FORCE_TCP is set, using TCP transport only"
MOONCAKE_INTRANODE_NVLINK = "Using Intra-Node NVLink transport (MC_INTRANODE_NVLINK set)"
MOONCAKE_RDMA = "Using RDMA transport (RoCE/iWARP)"
MOONCAKE_NO_HCA_TCP = "Using TCP transport (no HCA detected)"
# ...and what it logs when MC_FORCE_HCA asks for RDMA on a host without a usable NIC
# (0.3.14 cuda13 engine.so; initialize() then returns -1 and SGLang's start fails).
MOONCAKE_NO_RNIC = "RdmaTransport: No available RNIC"
MOONCAKE_RDMA_INSTALL_FAILED = "Failed to install RDMA transport"
MOONCAKE_TRANSPORT_LINES = {
    MOONCAKE_FORCED_TCP: "tcp",
    MOONCAKE_INTRANODE_NVLINK: "nvlink",
    "Using NVLink transport (forced or no HCA detected)": "mnnvl",
    MOONCAKE_RDMA: "rdma",
    MOONCAKE_NO_HCA_TCP: "tcp",
}


def logged_transport(text: str) -> tuple[str, str] | None:
    """(path, the line's message) of the last transport line Mooncake logged in TEXT (an
    engine's log since its start), or None when there is none."""
    found = None
    for line in text.splitlines():
        for message, path in MOONCAKE_TRANSPORT_LINES.items():
            if message in line:
                found = (path, message)
    return found


MOONCAKE_PATHS = ("nvlink", "rdma", "tcp")  # the nixl backend never starts Mooncake
# The address every rank advertises for the hand-off (SGLang's get_local_ip_auto reads it
# first, then HOST_IP, then SGLANG_LOCAL_IP_NIC): the plan sets it on a layout over hosts.
ADDRESS_VARIABLE = "SGLANG_HOST_IP"
# SGLang 0.5.23's custom pool types (srt/disaggregation/mooncake/utils.py; "true" is NVLINK),
# and what each does to the engines (srt/mem_cache/utils.py makes the pool whatever the
# backend; srt/disaggregation/utils.py moves the metadata buffers).
CUSTOM_MEM_POOL_TYPES = {
    "NVLINK": "makes the KV cache a fabric-memory pool (Mooncake's NVLinkAllocator) for the multi-node NVLink "
              "transport (MNNVL)",
    "BAREX": "makes the KV cache a pool for Mooncake's Barex transport",
    "INTRA_NODE_NVLINK": "puts the hand-off's metadata buffers on the GPU for the intra-node NVLink transport's "
                         "CUDA IPC",
}
# Read by Mooncake's RDMA transport only (config.cpp: the IB port and GID index;
# rdma_transport.cpp: the RDMA-side address).
RDMA_ONLY = ("MC_GID_INDEX", "MC_IB_PORT", "MC_RDMA_BIND_ADDRESS")
# Read only when Mooncake runs: the backend nixl makes them do nothing.
MOONCAKE_ONLY = ("MC_FORCE_TCP", "MC_INTRANODE_NVLINK", "MC_FORCE_MNNVL", "MC_FORCE_HCA", "MC_USE_TENT",
                 "MC_USE_TEV1", "MC_TE_FILTERS", "MC_CUSTOM_TOPO_JSON", "MC_TCP_BIND_ADDRESS", *RDMA_ONLY,
                 "MOONCAKE_PROTOCOL", "SGLANG_MOONCAKE_SEND_AUX_TCP", "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE")
NIXL_ONLY = ("SGLANG_DISAGGREGATION_NIXL_BACKEND", "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS")
# SGLang's EnvBool (srt/environ.py); a value in neither is refused whatever the path
# (environment-value-parses: pdnode.core.rules.environment_types).
ENV_TRUE, ENV_FALSE = TRUTH["EnvBool"]
# Every variable judged here (tests/test_kv_environment.py holds a refused or warned case and
# an accepted one for each).
JUDGED_ENVIRONMENT = frozenset((*NVLINK_ENVIRONMENT, *RDMA_ENVIRONMENT, ADDRESS_VARIABLE, "HOST_IP",
                                "SGLANG_LOCAL_IP_NIC", *MOONCAKE_ONLY, *NIXL_ONLY))


class EnvironmentFinding(NamedTuple):
    verdict: str  # owned | contradicts | surprising
    variable: str
    why: str
    fix: str


def judge_environment(env: dict[str, Any], path: str, multi_host: bool,
                      ib_map: dict[int, str]) -> list[EnvironmentFinding]:
    """Every variable of ``env`` (pdnode_engine_environment, values as the plan renders
    them) that steers the KV transport or its memory pool against the layout's ``path``;
    ``ib_map``: this host's GPU -> its NICs (pdnode_ib_devices, empty when unset)."""
    found = []
    for name, value in env.items():
        verdict = _judge(str(name), str(value), path, multi_host, ib_map)
        if verdict is not None:
            found.append(EnvironmentFinding(verdict[0], str(name), *verdict[1:]))
    return found


def _judge(name: str, value: str, path: str, multi_host: bool,
           ib_map: dict[int, str]) -> tuple[str, str, str] | None:
    on = f"the plan's KV path is {path}"
    if name in NVLINK_ENVIRONMENT and path == "nvlink":
        return ("owned", f"the plan sets {name}={NVLINK_ENVIRONMENT[name]} in every engine for its NVLink path",
                "remove it (pdnode_kv_intranode_nvlink chooses the path)")
    if name in RDMA_ENVIRONMENT and path == "rdma":
        return ("owned", f"the plan sets {name}={RDMA_ENVIRONMENT[name]} in every engine for its RDMA path (an "
                "engine without a usable NIC then fails its start instead of moving KV over TCP)", "remove it")
    if name == ADDRESS_VARIABLE and multi_host:
        return ("owned", "the plan sets it in every engine to the host's pdnode_node_address, the address its "
                "peers and the firewall know", "remove it and set pdnode_node_address of the host")
    if name == "SGLANG_MOONCAKE_CUSTOM_MEM_POOL":  # SGLang makes the pool whatever the backend
        kind = "NVLINK" if value.lower() == "true" else value
        if kind in CUSTOM_MEM_POOL_TYPES:
            return ("contradicts", f"{CUSTOM_MEM_POOL_TYPES[kind]}; {on}, which does not use it",
                    "remove it (the plan sets it itself on the NVLink path)")
        return ("surprising", "is not a pool type SGLang 0.5.23 knows (NVLINK, BAREX, INTRA_NODE_NVLINK, true): "
                "ignored", "remove it")
    if name in ("HOST_IP", "SGLANG_LOCAL_IP_NIC", ADDRESS_VARIABLE):  # SGLANG_HOST_IP: one host here
        if multi_host:
            return ("surprising", f"SGLang reads it only without {ADDRESS_VARIABLE}, which the plan sets on a layout "
                    "over several hosts: it does nothing", "remove it")
        return ("surprising", "the engines advertise this address (or this NIC's) to their peers for the hand-off "
                "instead of the one they find, and pdnode checks it nowhere: one not on this host fails every "
                "hand-off", "remove it: on one host the engines find their own address")
    if name in MOONCAKE_ONLY and path not in MOONCAKE_PATHS:
        return ("surprising", f"only Mooncake reads it, and {on} (the backend nixl does not start Mooncake)",
                "remove it")
    if name in NIXL_ONLY:
        if path != "nixl":
            return ("surprising", f"only the nixl backend reads it, and {on} over Mooncake", "remove it")
        if name == "SGLANG_DISAGGREGATION_NIXL_BACKEND" and value != "UCX":
            return ("surprising", "the plan's nixl path is UCX's choice (SGLang's default NIXL backend); another "
                    "backend is neither planned nor measured", "remove it, or measure the hand-off yourself")
        return None
    return _judge_mooncake(name, value, path, multi_host, ib_map, on)


def _judge_mooncake(name: str, value: str, path: str, multi_host: bool, ib_map: dict[int, str],
                    on: str) -> tuple[str, str, str] | None:
    """A variable Mooncake or SGLang's Mooncake backend reads, on one of MOONCAKE_PATHS.
    Mooncake tests its switches for presence: any value, "0" included, turns them on."""
    nvlink_fix = "remove it; for NVLink keep every instance on one host with pdnode_kv_intranode_nvlink: true"
    if name == "MC_FORCE_TCP" and path != "tcp":
        fix = "remove it; for TCP set pdnode_transfer_backend: mooncake_tcp"
        return ("contradicts", f"Mooncake then installs only TCP, whatever the value, ahead of every other choice "
                f"(0.3.14: 'MC_FORCE_TCP is set, using TCP transport only'): the hand-off would run at about "
                f"{SPEEDS['tcp'][0]:g} GB/s while {on}",
                fix + (" and pdnode_kv_intranode_nvlink: false" if path == "nvlink" else ""))
    if name == "MC_INTRANODE_NVLINK":  # path is rdma or tcp: on nvlink the plan owns it
        if path == "tcp":
            why = (f"asks for Mooncake's intra-node NVLink transport while {on} (MC_FORCE_TCP, which SGLang sets "
                   "for mooncake_tcp, wins in Mooncake 0.3.14)")
        elif multi_host:
            why = ("Mooncake then installs its intra-node NVLink transport, whatever the value, which reaches GPUs "
                   f"of its own host only: every hand-off between the layout's hosts fails ({on})")
        else:
            why = (f"Mooncake then installs its intra-node NVLink transport, whatever the value, while {on} "
                   "(pdnode_kv_intranode_nvlink: false)")
        return "contradicts", why, "remove it" if multi_host else nvlink_fix
    if name == "MC_FORCE_MNNVL":
        why = ("asks for Mooncake's multi-node NVLink transport (MNNVL), which no pdnode layout uses and the PyPI "
               "builds pdnode installs do not include (0.3.14: 'transport was requested but is not compiled in, "
               f"falling back to RDMA/TCP'); {on}")
        if path == "nvlink":
            why += ("; SGLang's PR 17866: never together with MC_INTRANODE_NVLINK, which the plan sets on this "
                    "path")
        return "contradicts", why, "remove it"
    if name == "MC_FORCE_HCA" and path != "rdma":
        first = "MC_INTRANODE_NVLINK (the plan's)" if path == "nvlink" else "MC_FORCE_TCP (SGLang's for mooncake_tcp)"
        return "surprising", f"{first} is chosen before it: it does nothing while {on}", "remove it"
    if name in ("MC_USE_TENT", "MC_USE_TEV1"):
        return ("contradicts", "replaces Mooncake's transfer engine by TENT, which picks transports by its own "
                f"policy and does not read MC_INTRANODE_NVLINK: {on}, chosen, checked and measured for the classic "
                "engine", "remove it")
    if name in RDMA_ONLY and path != "rdma":
        return "surprising", f"only Mooncake's RDMA transport reads it: it does nothing while {on}", "remove it"
    if name in ("MC_TE_FILTERS", "MC_CUSTOM_TOPO_JSON"):
        return _judge_nic_choice(name, value, path, ib_map, on)
    if name == "MC_TCP_BIND_ADDRESS":
        return ("surprising", "Mooncake reads it only with a metadata server; SGLang starts it with P2PHANDSHAKE, "
                f"where the address is the one the engine advertises ({ADDRESS_VARIABLE}): it does nothing",
                "remove it")
    if name == "MOONCAKE_PROTOCOL" and value.lower() != "rdma":
        return ("surprising", "SGLang passes it to Mooncake's initialize(), where it picks the buffer allocator, "
                f"not the transport (the MC_* switches and the NICs found do): {on} whatever it says",
                "remove it; the path is pdnode_transfer_backend's and pdnode_kv_intranode_nvlink's")
    if name in ("SGLANG_MOONCAKE_SEND_AUX_TCP", "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE"):
        if value.lower() not in ENV_TRUE:  # false, or not a boolean (environment-value-parses refuses it)
            return None
        if name == "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE":
            return ("contradicts", f"makes SGLang start Mooncake with the ascend protocol for Ascend NPUs; {on}",
                    "remove it")
        if path == "nvlink":
            return ("contradicts", "sends the hand-off's metadata over TCP by reading its buffers from the CPU "
                    "(send_aux_tcp), but on the NVLink path they live on the GPU "
                    "(SGLANG_MOONCAKE_CUSTOM_MEM_POOL=INTRA_NODE_NVLINK): the prefill cannot read them", "remove it")
        return None
    return None


def _judge_nic_choice(name: str, value: str, path: str, ib_map: dict[int, str],
                      on: str) -> tuple[str, str, str]:
    """MC_TE_FILTERS (an allow-list intersected with the devices SGLang passes,
    topology.cpp) and MC_CUSTOM_TOPO_JSON (a file that replaces the discovery, and with
    it the devices SGLang passes: Topology::parse takes no filter)."""
    if path != "rdma":
        return "surprising", f"only the NIC choice of Mooncake's RDMA transport reads it: it does nothing while {on}", \
            "remove it"
    if not ib_map:
        return ("surprising", "chooses the NICs Mooncake uses by something on the host that the preflight does not "
                f"check ({on} over the NICs Mooncake finds)",
                "map each GPU to its NICs in pdnode_ib_devices instead (checked against nvidia-smi topo -m)")
    if name == "MC_CUSTOM_TOPO_JSON":
        return ("contradicts", "Mooncake then reads its NICs from this file and ignores the devices SGLang passes from "
                "pdnode_ib_devices", "remove it and keep pdnode_ib_devices, or remove pdnode_ib_devices")
    allowed = {d.strip() for d in value.split(",") if d.strip()}
    starved = sorted(g for g, devices in ib_map.items() if not allowed & set(devices.split(",")))
    if starved:
        return ("contradicts", f"leaves GPUs {starved} none of their pdnode_ib_devices NICs: their engines find no "
                "HCA and Mooncake falls back to TCP without a word", "remove it; pdnode_ib_devices chooses each GPU's "
                "NICs")
    return "surprising", "only narrows the NICs pdnode_ib_devices already gives each GPU", "remove it"
