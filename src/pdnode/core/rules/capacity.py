"""Capacity: do the model's weights fit on each engine instance's GPUs?

``pdnode check`` calls this on the controller, so it is standard library only and reads
at most three small files (a safetensors index or a directory listing, a config.json, the
GPU table ``data/gpu-memory.json``). Nothing here touches a host.

The rule (docs/capacity.md): every GPU of an instance's replica holds
``weights / tp_size`` of the model; that must fit in the instance's static budget,
``memory.total x mem_fraction_static``, and still leave room for the KV cache. Expert
parallelism (``ep_size``) does not change the per-GPU total to first order: with EP the
routed experts are split ``ep_size`` ways instead of each expert being sharded
``tp_size`` ways, and SGLang runs EP inside the TP group (``ep_size`` divides
``tp_size``; at ``ep_size == tp_size`` each GPU holds 1/tp of the experts, the same
bytes). DP attention replicates the attention weights over the attention-DP ranks,
which adds a little (MLA attention is ~2% of DeepSeek-V3); the KV room below absorbs it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

GPU_TABLE = Path(__file__).resolve().parents[2] / "data" / "gpu-memory.json"
INDEX_FILE = "model.safetensors.index.json"
MIB = 1 << 20
GIB = 1 << 30
GB = 1e9
# What the static budget must keep free for the KV cache after the weights: 10% of the
# budget, at least 2 GiB. SGLang refuses to start only when the KV pool would be empty
# ("Not enough memory"); a nearly empty pool starts and then serves one short request at
# a time. 10% of an H200's budget at 0.85 (12.8 GB) holds ~180k tokens of DeepSeek-V3's
# MLA cache (61 layers x 576 values x 2 bytes = 70 KB per token) or ~40k of Llama-70B's
# (80 layers x 8 KV heads x 128 x 2 x 2 bytes = 320 KB): a few long requests in flight.
# The 2 GiB floor keeps that meaning on small budgets. A floor for a usable node, not a
# throughput target.
KV_MIN_FRACTION = 0.10
KV_MIN_BYTES = 2 * GIB
# tp_size candidates for the fix: attention head counts are powers of two in every model
# SGLang serves with TP, and tp_size must divide them.
_TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


class Finding(NamedTuple):
    """One line for the plan's checker: ``c.error(f.rule_id, *f[:4])`` or ``c.warn(...)``."""

    field: str
    value: Any
    rule: str
    fix: str
    severity: str = "error"  # error | warning

    @property
    def rule_id(self) -> str:
        """Its id in pdnode.core.rules.catalogue. check_instances makes three kinds, told apart by
        severity and field (derived, so a Finding compares equal by its five fields)."""
        if self.severity == "warning":
            return "capacity-gpu-known"
        return "capacity-gpus-for-all" if self.field == "pdnode_gpu_count" else "capacity-weights-fit"


class WeightsError(ValueError):
    """The weights cannot be determined from the inventory's fields: one user line."""

    def __init__(self, rule_id: str, field: str, value: Any, rule: str, fix: str):
        super().__init__(f"{field}={value!r}: {rule}. Fix: {fix}.")
        self.rule_id = rule_id  # pdnode.core.rules.catalogue
        self.field, self.value, self.rule, self.fix = field, value, rule, fix


# --- the GPU table -----------------------------------------------------------------------

_table: dict[str, int] | None = None


def gpu_table() -> dict[str, int]:
    """nvidia-smi name -> memory.total in MiB, from data/gpu-memory.json (read once)."""
    global _table
    if _table is None:
        raw = json.loads(GPU_TABLE.read_text(encoding="utf-8"))
        _table = {name: int(entry["memory_total_mib"]) for name, entry in raw["gpus"].items()}
    return _table


def gpu_memory_mib(model: str | None) -> int | None:
    """The table's memory.total for this nvidia-smi name (case-insensitive), or None."""
    if not model:
        return None
    table = gpu_table()
    if model in table:
        return table[model]
    low = model.strip().lower()
    return next((mib for name, mib in table.items() if name.lower() == low), None)


# --- the weights -------------------------------------------------------------------------

def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({getattr(exc, 'msg', exc)} at line {getattr(exc, 'lineno', '?')})"
                         ) from None


def weight_bytes_from_dir(path: str | Path) -> tuple[int, str] | None:
    """Bytes of the model's weights in a controller-side model directory, and where the
    number came from; None when the directory has neither weights nor a config.json.

    In order: ``model.safetensors.index.json``'s ``metadata.total_size`` (what the
    checkpoint holds); the sum of ``*.safetensors`` sizes; an estimate from
    ``config.json`` (:func:`estimate_parameters` x :func:`bytes_per_parameter`). A file
    that is unreadable or not what it should be raises ValueError with one line.
    """
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"{d} is not a directory")
    index = d / INDEX_FILE
    if index.exists():
        doc = _read_json(index)
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        total = meta.get("total_size") if isinstance(meta, dict) else None
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            raise ValueError(f"{index} has no positive integer metadata.total_size (got {total!r})")
        return total, f"{index} metadata.total_size"
    shards = sorted(d.glob("*.safetensors"))
    if shards:
        try:
            total = sum(s.stat().st_size for s in shards)
        except OSError as exc:
            raise ValueError(f"cannot stat the weights in {d}: {exc.strerror or exc}") from None
        return total, f"{len(shards)} *.safetensors file{'s' * (len(shards) != 1)} in {d}"
    config_path = d / "config.json"
    if not config_path.exists():
        return None
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a JSON object")
    params, embed = estimate_parameters(config, config_path)
    per, what = bytes_per_parameter(config, config_path)
    # Embeddings and the LM head stay in the model's dtype when the rest is quantized
    # (DeepSeek-V3's FP8 checkpoint keeps them in BF16).
    embed_bytes = _dtype_bytes(config, config_path) if per < 2 else per
    total = int((params - embed) * per + embed * embed_bytes)
    return total, (f"an estimate from {config_path}: {params / 1e9:.1f}B parameters x {what}")


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model's fields under text_config/llm_config."""
    if "hidden_size" not in config:
        for key in ("text_config", "llm_config", "language_config"):
            if isinstance(config.get(key), dict) and "hidden_size" in config[key]:
                return {**config[key], "quantization_config": config.get("quantization_config"),
                        **({"torch_dtype": config["torch_dtype"]} if "torch_dtype" in config else {})}
    return config


# Far above any real model's field (the largest hidden sizes and vocabularies are ~1e5 and
# ~1e6, layer counts ~1e2): a bigger value is a broken config.json, not a model.
_MAX_FIELD = 10**7


def _int(cfg: dict[str, Any], key: str, where: Path | str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None and default is not None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_FIELD:
        raise ValueError(f"{where}: {key} is {value!r}, not an integer from 0 to {_MAX_FIELD} (cannot estimate the "
                         "parameters)")
    return value


def estimate_parameters(config: dict[str, Any], where: Path | str = "config.json") -> tuple[int, int]:
    """(parameters, of which embeddings + LM head) of a decoder-only transformer from its
    Hugging Face config.json: dense (Llama, Qwen), MoE (Mixtral, Qwen-MoE, DeepSeek:
    routed + shared experts, dense first layers) and MLA attention (DeepSeek V2/V3).
    Norms and biases are left out (well under 0.1%); DeepSeek's multi-token-prediction
    layers are left out too, since SGLang loads them only for speculative decoding."""
    cfg = _text_config(config)
    h = _int(cfg, "hidden_size", where)
    layers = _int(cfg, "num_hidden_layers", where)
    vocab = _int(cfg, "vocab_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    if h == 0 or layers == 0 or heads == 0:
        raise ValueError(f"{where}: hidden_size, num_hidden_layers and num_attention_heads must be positive")
    kv_heads = _int(cfg, "num_key_value_heads", where, heads)
    head_dim = _int(cfg, "head_dim", where, h // heads)

    if cfg.get("kv_lora_rank"):  # MLA
        nope, rope = _int(cfg, "qk_nope_head_dim", where), _int(cfg, "qk_rope_head_dim", where)
        v_dim = _int(cfg, "v_head_dim", where, nope)
        kv_rank = _int(cfg, "kv_lora_rank", where)
        q_rank = cfg.get("q_lora_rank")
        q = (h * _int(cfg, "q_lora_rank", where) + q_rank * heads * (nope + rope)) if q_rank \
            else h * heads * (nope + rope)
        attn = q + h * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * h
    else:
        attn = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h

    key = next((k for k in ("n_routed_experts", "num_experts", "num_local_experts") if cfg.get(k)), None)
    experts = _int(cfg, key, where) if key else 0
    dense_inter = _int(cfg, "intermediate_size", where, 0)
    dense_mlp = 3 * h * dense_inter  # gate, up, down
    if experts:
        inter = _int(cfg, "moe_intermediate_size", where, dense_inter)
        shared = _int(cfg, "n_shared_experts", where, 0) * 3 * h * inter
        shared += 3 * h * _int(cfg, "shared_expert_intermediate_size", where, 0)
        moe_mlp = experts * 3 * h * inter + shared + experts * h  # + the router
        first_dense = _int(cfg, "first_k_dense_replace", where, 0)
        freq = _int(cfg, "moe_layer_freq", where, 1) or 1
        step = _int(cfg, "decoder_sparse_step", where, 1) or 1
        only_dense = cfg.get("mlp_only_layers") or []
        if not isinstance(only_dense, list) or not all(isinstance(i, int) for i in only_dense):
            raise ValueError(f"{where}: mlp_only_layers is {only_dense!r}, not a list of layer numbers")
        only_dense = set(only_dense)
        moe_layers = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0
                         and (i + 1) % step == 0 and i not in only_dense)
        mlp = moe_layers * moe_mlp + (layers - moe_layers) * dense_mlp
    else:
        if not dense_inter:
            raise ValueError(f"{where}: intermediate_size is missing (cannot estimate the parameters)")
        mlp = layers * dense_mlp
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return layers * attn + mlp + embed, embed


_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1,
                "float8_e5m2": 1}


def _dtype_bytes(config: dict[str, Any], where: Path | str) -> float:
    cfg = _text_config(config)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or config.get("dtype") \
        or "bfloat16"
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"{where}: torch_dtype {dtype!r} is not one of {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[dtype]


def bytes_per_parameter(config: dict[str, Any], where: Path | str = "config.json") -> tuple[float, str]:
    """Bytes per weight and a word for it: ``quantization_config`` first (fp8 -> 1,
    GPTQ/AWQ -> bits/8, MXFP4 -> 0.53 with its scales), else ``torch_dtype``/``dtype``."""
    q = config.get("quantization_config") or _text_config(config).get("quantization_config")
    if isinstance(q, dict) and q:
        method = str(q.get("quant_method") or "").lower()
        if method in ("fp8", "fbgemm_fp8"):
            return 1.0, "1 byte (fp8)"
        if method in ("gptq", "awq", "bitsandbytes") and isinstance(q.get("bits"), int):
            return q["bits"] / 8, f"{q['bits']} bits ({method})"
        if method == "mxfp4":
            return 4.25 / 8, "4.25 bits (mxfp4 with its scales)"
        raise ValueError(f"{where}: quantization_config.quant_method {method or None!r} is not one this estimate "
                         "knows (fp8, gptq, awq, bitsandbytes, mxfp4): give pdnode_model_weights_gb instead")
    size = _dtype_bytes(config, where)
    return size, f"{size:g} bytes ({str(config.get('torch_dtype') or config.get('dtype') or 'bfloat16')})"


def weight_bytes(settings: dict[str, Any], repo_root: Path) -> tuple[int, str] | None:
    """The model's weight bytes from the inventory, and where they came from; None when
    neither field is set (no capacity check then).

    ``pdnode_model_weights_gb`` (GB = 1e9 bytes) wins over ``pdnode_model_controller_path``
    (a directory on the controller; relative to the repository root unless absolute).
    Raises :class:`WeightsError` naming the field when its value cannot be used.
    """
    gb = settings.get("pdnode_model_weights_gb")
    if gb is not None:
        if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb <= 0:
            raise WeightsError("capacity-weights-gb",
                               "pdnode_model_weights_gb", gb, "is not a positive number of GB (1e9 bytes)",
                               "give the size of the model's weights, e.g. 671.0, or null")
        return int(gb * GB), f"pdnode_model_weights_gb {gb:g}"
    path = settings.get("pdnode_model_controller_path")
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise WeightsError("capacity-model-dir", "pdnode_model_controller_path", path, "is not a directory path",
                           "give a directory with the model's config.json and model.safetensors.index.json, or null")
    full = repo_root / path  # an absolute path stays as it is (pathlib)
    try:
        found = weight_bytes_from_dir(full)
    except ValueError as exc:
        raise WeightsError("capacity-model-dir", "pdnode_model_controller_path", path, str(exc),
                           "point it at a copy of the model's config.json and model.safetensors.index.json, "
                           "or set pdnode_model_weights_gb") from None
    if found is None:
        raise WeightsError("capacity-model-dir",
                           "pdnode_model_controller_path", path, f"{full} has no {INDEX_FILE}, no *.safetensors "
                           "and no config.json", "copy the model's config.json and model.safetensors.index.json "
                           "there, or set pdnode_model_weights_gb")
    return found


# --- the check ---------------------------------------------------------------------------

def kv_room(budget: float) -> float:
    """Bytes of the static budget kept for the KV cache (see KV_MIN_FRACTION)."""
    return max(KV_MIN_FRACTION * budget, KV_MIN_BYTES)


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


def smallest_tp(weight_bytes: int, budget: float, max_tp: int | None = None) -> int | None:
    """The smallest tp_size (a power of two, <= max_tp) whose per-GPU share of the weights
    fits the budget with its KV room; None when none does."""
    for tp in _TP_CANDIDATES:
        if max_tp is not None and tp > max_tp:
            break
        if weight_bytes / tp <= budget - kv_room(budget):
            return tp
    return None


def check_instances(instances: list[dict[str, Any]], gpu_model: str | None, weight_bytes: int | None,
                    source: str = "", gpu_count: int | None = None) -> list[Finding]:
    """One Finding per instance whose GPUs cannot hold the weights (severity error), or a
    single warning when ``gpu_model`` is not in the GPU table (nothing checked then).

    ``instances``: dicts with ``field`` (``pdnode_prefill_instances[0]``), ``id``,
    ``tp_size``, ``dp_size``, ``gpus`` and ``mem_fraction_static`` (default 0.85);
    ``gpu_count``: the host's GPUs, the ceiling for the tp_size the fix proposes.
    """
    if not weight_bytes or not instances:
        return []
    mib = gpu_memory_mib(gpu_model)
    if mib is None:
        return [Finding("pdnode_gpu_model", gpu_model, "is not in src/pdnode/data/gpu-memory.json, so whether "
                        f"the model's weights ({_gb(weight_bytes)}) fit each instance was not checked",
                        "add it with the memory.total (MiB) that `nvidia-smi --query-gpu=name,memory.total "
                        "--format=csv` prints on the host (docs/capacity.md), or correct pdnode_gpu_model",
                        "warning")]
    memory = mib * MIB
    out: list[Finding] = []
    # GPUs each instance needs at its smallest fitting tp_size (None: no tp_size fits)
    least: dict[str, int | None] = {}
    for inst in instances:
        tp = int(inst.get("tp_size") or 1)
        dp = int(inst.get("dp_size") or 1)
        mfs = inst.get("mem_fraction_static")
        mfs = 0.85 if mfs is None else float(mfs)
        budget = memory * mfs
        room = kv_room(budget)
        need = weight_bytes / tp
        sid = str(inst.get("id", "the instance"))
        if need <= budget - room:
            least[sid] = len(inst.get("gpus") or []) or tp * dp
            continue
        field = f"{inst.get('field') or inst.get('id')}.tp_size"
        rule = (f"{inst.get('id', 'the instance')} holds {_gb(need)} of weights per GPU ({_gb(weight_bytes)} from "
                f"{source or 'the inventory'} / tp_size {tp}), more than the {_gb(budget - room)} per GPU left for "
                f"weights ({gpu_model}: {_gb(memory)} x mem_fraction_static {mfs:g} = {_gb(budget)}, less "
                f"{_gb(room)} kept for the KV cache)")
        max_tp = gpu_count // dp if gpu_count else None
        best = smallest_tp(weight_bytes, budget, max_tp)
        least[sid] = best * dp if best is not None else None
        if best is not None:
            gpus = f"{best * dp} GPUs" + (f" ({dp} replicas of {best})" if dp > 1 else "")
            fix = (f"tp_size: {best} with {gpus} in gpus ({_gb(weight_bytes / best)} per GPU), "
                   "or a smaller or more quantised model")
        else:
            ceiling = f"up to the host's {gpu_count} GPUs " if gpu_count else ""
            fix = (f"no tp_size {ceiling}fits this model on {gpu_model} GPUs: serve a smaller or more quantised model, "
                   "or use GPUs with more memory")
        out.append(Finding(field, tp, rule, fix))
    # Each fix alone may fit while all of them together do not (8 GPUs each for prefill and
    # decode on an 8-GPU host): say so once, for the host.
    total = sum(n for n in least.values() if n is not None)
    if out and gpu_count and None not in least.values() and total > gpu_count:
        each = ", ".join(f"{sid} {n}" for sid, n in least.items())
        fewer = "fewer instances, " if len(least) > 2 else ""
        out.append(Finding("pdnode_gpu_count", gpu_count, f"with each instance at the smallest tp_size that holds "
                           f"the weights, the instances need {total} GPUs ({each}), more than the host has",
                           f"{fewer}a smaller or more quantised model, or GPUs with more memory (a PD node runs at "
                           "least one prefill and one decode instance)"))
    return out
