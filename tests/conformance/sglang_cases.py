"""Hand-written ServerArgs dicts for the 8-GPU node of inventories/gpu01 (see
../shared facts, section 1): prefill TP4 on GPUs 0-3, decode attention-DP4 + EP4 on
GPUs 4-7. Tests copy these and change one thing."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "src" / "pdnode" / "data" / "models"  # check uses them too
DEEPSEEK_V3_TINY = str(FIXTURES / "deepseek-v3-tiny")
QWEN2_TINY = str(FIXTURES / "qwen2-tiny")

PREFILL_TP4 = {
    "model_path": DEEPSEEK_V3_TINY,
    "served_model_name": "deepseek-v3",
    "host": "127.0.0.1",
    "port": 30000,
    "tp_size": 4,
    "base_gpu_id": 0,
    "disaggregation_mode": "prefill",
    "disaggregation_transfer_backend": "mooncake",
    "disaggregation_bootstrap_port": 8998,
    "enable_metrics": True,
    "nccl_port": 31000,
    "mem_fraction_static": 0.85,
    "load_format": "dummy",
}

DECODE_DP4_EP4 = {
    "model_path": DEEPSEEK_V3_TINY,
    "served_model_name": "deepseek-v3",
    "host": "127.0.0.1",
    "port": 30001,
    "tp_size": 4,
    "attn_dp_size": 4,
    "ep_size": 4,
    "enable_dp_lm_head": True,
    "base_gpu_id": 4,
    "disaggregation_mode": "decode",
    "disaggregation_transfer_backend": "mooncake",
    "disaggregation_bootstrap_port": 8998,
    "enable_metrics": True,
    "nccl_port": 31001,
    "mem_fraction_static": 0.85,
    "load_format": "dummy",
}


def with_(base: dict, **changes) -> dict:
    """A copy of base with changes applied; a value of ... deletes the key."""
    out = dict(base)
    for key, value in changes.items():
        if value is ...:
            out.pop(key, None)
        else:
            out[key] = value
    return out
