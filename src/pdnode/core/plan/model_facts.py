"""The model's facts from its own files: what the plan reads instead of typed guesses.

From the commit's small files in the controller's cache (config.json, hf_quant_config.json,
model.safetensors.index.json; pdnode.core.inventory.model_source) and the lock's manifest
(every file's size): the kind (dense / moe / moe_mla), the weight bytes, the KV bytes per
token, the dtype and the quantization. A fact the inventory also types must agree with the
files: a contradiction is refused naming both (``check_typed``), since the typed value is
the one that is wrong (the engine reads the files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..inventory.model_source import Lock
from .kv_path import kv_bytes_from_config

# The keys a config.json names its routed experts by (DeepSeek/GLM/Kimi/Nemotron-H,
# Qwen-MoE/Gemma-4, Mixtral/MiniMax/Llama-4/gpt-oss, older MoE families).
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
# A typed weight size within this fraction of the files' counts as the same (GB rounding).
WEIGHTS_TOLERANCE = 0.05


@dataclass(frozen=True)
class ModelFacts:
    directory: Path  # the cache directory of the commit (what SGLang's judge reads)
    kind: str  # dense | moe | moe_mla
    architecture: str | None
    weight_bytes: int | None
    weight_source: str
    kv_bytes_per_token: int | None
    dtype: str | None
    quantization: str | None  # quant_method, or modelopt's quant_algo (modelopt_fp4 ...)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "architecture": self.architecture, "weight_bytes": self.weight_bytes,
                "weight_source": self.weight_source, "kv_bytes_per_token": self.kv_bytes_per_token,
                "dtype": self.dtype, "quantization": self.quantization}


def language_config(config: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's language model (text_config, llm_config, language_config)."""
    if "hidden_size" not in config and "num_hidden_layers" not in config:
        for key in ("text_config", "llm_config", "language_config"):
            if isinstance(config.get(key), dict):
                return config[key]
    return config


def kind_of(config: dict[str, Any]) -> str:
    """moe_mla when routed experts and MLA's compressed KV (kv_lora_rank), moe with experts
    alone, else dense. (A dense MLA model is rare and reads as dense: its KV pairing
    rule is the stricter one.)"""
    cfg = language_config(config)
    experts = any(isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool) and cfg[k] > 1
                  for k in EXPERT_KEYS)
    mla = isinstance(cfg.get("kv_lora_rank"), int) and cfg["kv_lora_rank"] > 0
    return "moe_mla" if experts and mla else "moe" if experts else "dense"


def quantization_of(config: dict[str, Any], hf_quant: dict[str, Any] | None) -> str | None:
    """The checkpoint's quantization as SGLang names it: quantization_config.quant_method
    (a modelopt one by its algorithm), else hf_quant_config.json's (modelopt), else None."""
    q = config.get("quantization_config") or language_config(config).get("quantization_config") \
        or config.get("compression_config")
    if isinstance(q, dict) and q:
        method = str(q.get("quant_method") or "modelopt").lower()
        if method == "modelopt":
            algo = str(q.get("quant_algo") or (q.get("quantization") or {}).get("quant_algo") or "").upper()
            return {"FP8": "modelopt_fp8", "NVFP4": "modelopt_fp4"}.get(algo, "modelopt")
        return method
    if isinstance(hf_quant, dict):
        algo = str((hf_quant.get("quantization") or {}).get("quant_algo") or "").upper()
        return {"FP8": "modelopt_fp8", "NVFP4": "modelopt_fp4"}.get(algo, "modelopt")
    return None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read as JSON ({exc})") from None


def read(directory: Path, lock: Lock | None = None) -> ModelFacts:
    """The facts of the model whose small files are in DIRECTORY; the weight bytes from
    the lock's manifest when given (every *.safetensors size), else the index's total.
    ValueError (one line) when config.json is missing or not a JSON object."""
    config = _json(directory / "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{directory / 'config.json'} is missing or not a JSON object")
    hf_quant = _json(directory / "hf_quant_config.json")
    cfg = language_config(config)
    weights: int | None = None
    source = "unknown"
    if lock is not None and lock.weight_bytes:
        weights = lock.weight_bytes
        count = sum(1 for f in lock.files if f.path.endswith(".safetensors"))
        source = f"the {count} *.safetensors file{'s' * (count != 1)} of commit {lock.commit[:12]} (model lock)"
    else:
        index = _json(directory / "model.safetensors.index.json")
        total = (index.get("metadata") or {}).get("total_size") if isinstance(index, dict) else None
        if isinstance(total, int) and total > 0:
            weights, source = total, f"{directory / 'model.safetensors.index.json'} metadata.total_size"
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    archs = config.get("architectures")
    return ModelFacts(
        directory=directory, kind=kind_of(config),
        architecture=str(archs[0]) if isinstance(archs, list) and archs else None,
        weight_bytes=weights, weight_source=source, kv_bytes_per_token=kv_bytes_from_config(config),
        dtype=str(dtype).removeprefix("torch.") if dtype else None,
        quantization=quantization_of(config, hf_quant if isinstance(hf_quant, dict) else None))


def contradictions(facts: ModelFacts, typed: dict[str, Any], where: str) -> list[tuple[str, Any, str, str]]:
    """(field, typed value, why, fix) for every typed model fact the files contradict.
    ``where`` names the files (the source and commit) in the message."""
    out: list[tuple[str, Any, str, str]] = []
    kind = typed.get("pdnode_model_kind")
    if kind is not None and kind != facts.kind:
        out.append(("pdnode_model_kind", kind,
                    f"contradicts the model's own config.json ({where}): {facts.architecture or 'the model'} is "
                    f"{facts.kind}", f"remove pdnode_model_kind (the plan reads it from the files) or set it "
                                     f"to {facts.kind}"))
    gb = typed.get("pdnode_model_weights_gb")
    if isinstance(gb, (int, float)) and not isinstance(gb, bool) and facts.weight_bytes:
        files_gb = facts.weight_bytes / 1e9
        if abs(gb - files_gb) > WEIGHTS_TOLERANCE * files_gb:
            out.append(("pdnode_model_weights_gb", gb,
                        f"contradicts the model's files ({where}): {files_gb:.1f} GB from {facts.weight_source}",
                        "remove pdnode_model_weights_gb (the plan reads the size from the files)"))
    kv = typed.get("pdnode_model_kv_bytes_per_token")
    if isinstance(kv, int) and not isinstance(kv, bool) and facts.kv_bytes_per_token:
        allowed = {facts.kv_bytes_per_token, facts.kv_bytes_per_token // 2}  # a bf16 or an 8-bit KV cache
        if kv not in allowed:
            out.append(("pdnode_model_kv_bytes_per_token", kv,
                        f"contradicts the model's config.json ({where}): {facts.kv_bytes_per_token} bytes per "
                        f"token with a 16-bit KV cache, {facts.kv_bytes_per_token // 2} with an 8-bit one",
                        "remove pdnode_model_kv_bytes_per_token (the plan reads it from the files)"))
    return out
