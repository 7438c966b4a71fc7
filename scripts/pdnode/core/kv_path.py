"""How each request's KV cache moves from a prefill to a decode: the path the plan
chooses, its expected speed, and what the engines need for it (docs/kv-path.md).

One transport per engine. Mooncake's transfer engine installs a single transport when
it starts: with MC_INTRANODE_NVLINK set it installs the intra-node NVLink transport
(CUDA IPC) *instead of* RDMA or TCP, ahead of HCA detection and of MC_FORCE_TCP
(Mooncake, mooncake-transfer-engine/src/transfer_engine_impl.cpp: "Explicit env var
overrides take priority over HCA auto-detection"), and that transport reaches GPUs of
its own host only. The router sends any prefill's KV to any decode, so the path is the
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
from typing import Any

# Expected hand-off speed per path, GB/s (1e9 bytes), and where the number comes from.
SPEEDS: dict[str, tuple[float, str]] = {
    "nvlink": (385.0, "NVLink between two H200s (torch peer copy); Mooncake's intra-node transport moved 1 GiB at "
                      "2,018-2,071 GB/s within one H200 (docs/hardware-runs.md)"),
    "rdma": (25.0, "nominal: one 200-400 Gb/s NIC per GPU; measure it with the Mooncake check"),
    "tcp": (1.8, "measured: Mooncake over TCP on an H200 host without NICs, 1.8-2.0 GB/s (docs/hardware-runs.md)"),
    "nixl": (25.0, "nominal: UCX over the per-GPU NICs"),
}
NVLINK_ENVIRONMENT = {"MC_INTRANODE_NVLINK": "1", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "INTRA_NODE_NVLINK"}
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
            "environment": dict(NVLINK_ENVIRONMENT) if path == "nvlink" else {},
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
