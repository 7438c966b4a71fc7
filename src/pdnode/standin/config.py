"""ServerArgs JSON + environment -> the stand-in's settings.

Only the fields the stand-in acts on are interpreted; every other ServerArgs field is
accepted and reported back in /server_info. A key that is not a ServerArgs field of
SGLang 0.5.23 is refused, as real SGLang refuses an unexpected keyword.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from .faults import FaultError, parse_faults
from .rendezvous import DEFAULT_TIMEOUT_S, parse_dist_init_addr
from ..core.plan.kv_path import (ENV_FALSE, ENV_TRUE, MOONCAKE_FORCED_TCP, MOONCAKE_INTRANODE_NVLINK, MOONCAKE_NO_HCA_TCP, MOONCAKE_NO_RNIC,
                             MOONCAKE_RDMA, MOONCAKE_RDMA_INSTALL_FAILED, SPEEDS)
from ..core.plan.build import known_server_args
from ..node.secrets import SecretError, read_secret_file

TRANSFER_BACKENDS = ("mooncake", "mooncake_tcp")
REDACTED_FIELDS = ("ssl_keyfile_password", "watermark_key", "watermark_key_b")  # never in /server_info
MODES = ("null", "prefill", "decode")
# SGLang 0.5.23's chunked_prefill_size for GPUs of 90-160 GB (H200 class); its
# _handle_gpu_memory_settings picks 2048 / 4096 / 8192 / 16384 by GPU memory.
DEFAULT_CHUNKED_PREFILL_SIZE = 8192


class ConfigError(Exception):
    """The ServerArgs file or the environment cannot be used; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    host: str
    port: int
    model_path: str
    served_model_name: str
    mode: str  # "null" | "prefill" | "decode"
    bootstrap_port: int
    transfer_backend: str
    tp_size: int
    dp_size: int
    attn_dp_size: int
    ep_size: int
    pp_size: int
    base_gpu_id: int
    enable_metrics: bool
    context_length: int
    max_running_requests: int | None  # instance total as given; None: the stand-in's default
    chunked_prefill_size: int | None  # per scheduler rank (divided by attn_dp_size); None: unchunked
    page_size: int
    kv_cache_dtype: str
    load_balance_method: str
    resolved: Mapping[str, Any]  # what /server_info reports (all given keys, resolved)
    api_key: str | None = dataclasses.field(default=None, repr=False)
    nnodes: int = 1
    node_rank: int = 0
    dist_init: tuple[str, int] | None = None  # (host, port) of node rank 0's rendezvous
    dist_timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def attn_tp_size(self) -> int:
        return self.tp_size // self.attn_dp_size

    @property
    def num_ranks(self) -> int:
        """Schedulers of the instance: attention-DP ranks, else DP replicas."""
        return self.attn_dp_size if self.attn_dp_size > 1 else self.dp_size

    @property
    def rank_gpus(self) -> int:
        """GPUs one scheduler rank computes on (attention-TP, or TP of a replica)."""
        return self.tp_size // self.attn_dp_size if self.attn_dp_size > 1 else self.tp_size

    @property
    def engine_type(self) -> str:
        return {"prefill": "prefill", "decode": "decode"}.get(self.mode, "unified")

    @property
    def advertise_host(self) -> str:
        """The address peers use to reach this process (ranks' rank_ip)."""
        if self.host in ("0.0.0.0", "::", ""):
            return os.environ.get("SGLANG_HOST_IP") or "127.0.0.1"
        return self.host


@dataclasses.dataclass(frozen=True)
class SimSettings:
    prefill_ms_per_token: float = 0.1
    decode_ms_per_token: float = 20.0
    decode_ms_per_request: float = 0.5
    max_running_per_rank: int = 256
    startup_s: float = 0.0
    kv_bytes_per_token: int = 16384
    kv_pool_mb: int = 256
    slow_factor: float = 10.0
    faults: tuple[str, ...] = ()
    waiting_timeout_s: float = 300.0
    bootstrap_timeout_s: float = 300.0
    heartbeat_interval_s: float = 5.0
    heartbeat_max_failure: int = 2
    # The hand-off's path as the engine's environment selects it for Mooncake
    # (kv_transport) and its simulated speed (kv_gb_s; None: the path's own figure).
    kv_transport: str = ""
    kv_gb_s: float | None = None
    # The simulated host has no usable RDMA device (PDNODE_SIM_NO_HCA=1): on the RDMA path
    # Mooncake falls back to TCP without an error, as a real host does (field failure 8).
    no_hca: bool = False
    # SGLang's failed-session probe (pdnode.standin.sessions), its names and defaults
    failed_session_probe: bool = True
    failed_session_probe_interval_s: float = 30.0
    failed_session_probe_max_interval_s: float = 300.0
    failed_session_idle_timeout_s: float = 600.0
    # MC_FORCE_HCA in the environment (the plan's, on the RDMA path): without a usable
    # device Mooncake then fails to start instead of falling back (field failure 7c).
    force_hca: bool = False

    def mooncake_start_error(self, transfer_backend: str) -> str | None:
        """What Mooncake 0.3.14 logs when it cannot start in this environment on the
        simulated host (the engine then exits), or None."""
        if self.no_hca and self.force_hca and transfer_backend != "mooncake_tcp" and not self.kv_transport:
            return f"{MOONCAKE_NO_RNIC}; {MOONCAKE_RDMA_INSTALL_FAILED} (MC_FORCE_HCA set)"
        return None

    def kv_path(self, transfer_backend: str) -> str:
        """nvlink | tcp | rdma: what Mooncake 0.3.14 would run in this environment. It
        reads MC_FORCE_TCP first (mooncake_tcp sets it: SGLang's pd_disaggregation_hook),
        then MC_INTRANODE_NVLINK; otherwise RDMA, which the stand-in's non-CUDA build
        without NICs would run as TCP, as a real host without HCAs does."""
        if transfer_backend == "mooncake_tcp":
            return "tcp"
        return self.kv_transport or ("tcp" if self.no_hca else "rdma")

    def mooncake_line(self, transfer_backend: str) -> str:
        """The line Mooncake's CUDA build logs for the transport it installs in this
        environment (pdnode.core.plan.kv_path.MOONCAKE_TRANSPORT_LINES): the simulated host's."""
        if transfer_backend == "mooncake_tcp" or self.kv_transport == "tcp":
            return MOONCAKE_FORCED_TCP
        if self.kv_transport == "nvlink":
            return MOONCAKE_INTRANODE_NVLINK
        return MOONCAKE_NO_HCA_TCP if self.no_hca else MOONCAKE_RDMA

    def kv_speed_gb_s(self, transfer_backend: str) -> float:
        """The hand-off's simulated speed: the plan's for its path (PDNODE_SIM_KV_GB_S), or
        the path's own figure (pdnode.core.plan.kv_path) when the stand-in runs without a plan."""
        if self.no_hca and self.kv_path(transfer_backend) == "tcp" and not self.kv_transport:
            return SPEEDS["tcp"][0]  # fell back: TCP's speed, whatever the plan rendered for RDMA
        return self.kv_gb_s or SPEEDS[self.kv_path(transfer_backend)][0]

    @property
    def max_total_num_tokens(self) -> int:
        return (self.kv_pool_mb * 1024 * 1024) // self.kv_bytes_per_token


@dataclasses.dataclass(frozen=True)
class Settings:
    server: ServerSettings
    sim: SimSettings


def _int(args: Mapping[str, Any], key: str, default: int, minimum: int | None = None) -> int:
    value = args.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"ServerArgs field {key}={value!r}: must be an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(f"ServerArgs field {key}={value!r}: must be >= {minimum}")
    return value


def _str(args: Mapping[str, Any], key: str, default: str | None) -> str | None:
    value = args.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConfigError(f"ServerArgs field {key}={value!r}: must be a string")
    return value


def _refuse_a_broken_config(model_path: str) -> None:
    """A config.json that is there but not a JSON object: SGLang's AutoConfig refuses to
    start on it, and so does the stand-in (a model without one is the stand-in's own)."""
    path = Path(model_path) / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"model_path={model_path}: {path} cannot be read ({exc.strerror or exc})") from None
    try:
        ok = isinstance(json.loads(text), dict)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"model_path={model_path}: {path} is not a JSON object (SGLang's AutoConfig refuses it)")


def _model_config(model_path: str) -> dict[str, Any]:
    """config.json of the model directory, when there is one (real SGLang reads it too)."""
    path = Path(model_path) / "config.json"
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def load_server_args(path: str | os.PathLike[str], api_key: str | None = None) -> ServerSettings:
    try:
        with open(path, encoding="utf-8") as fh:
            args = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read ServerArgs file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"ServerArgs file {path} is not valid JSON: {exc}") from None
    if not isinstance(args, dict):
        raise ConfigError(f"ServerArgs file {path}: top level must be an object")
    return server_settings_from_dict(args, api_key)


def server_settings_from_dict(args: Mapping[str, Any], api_key: str | None = None) -> ServerSettings:
    known = known_server_args()
    unknown = sorted(k for k in args if k not in known)
    if unknown:
        raise ConfigError(
            f"unknown ServerArgs field(s) {', '.join(unknown)}: not a field of SGLang "
            f"ServerArgs 0.5.23 (keys must be ServerArgs field names)"
        )
    for secret in ("api_key", "admin_api_key"):
        if args.get(secret) is not None:
            raise ConfigError(
                f"ServerArgs field {secret} must not be in the JSON file: pass the API key with --api-key-file"
            )
    model_path = _str(args, "model_path", None)
    if not model_path:
        raise ConfigError("ServerArgs field model_path is required")
    mode = _str(args, "disaggregation_mode", "null") or "null"
    if mode not in MODES:
        raise ConfigError(f"ServerArgs field disaggregation_mode={mode!r}: one of {', '.join(MODES)}")
    backend = _str(args, "disaggregation_transfer_backend", "mooncake") or "mooncake"
    if mode != "null" and backend not in TRANSFER_BACKENDS:
        raise ConfigError(
            f"ServerArgs field disaggregation_transfer_backend={backend!r}: the stand-in moves "
            f"KV only through Mooncake ({', '.join(TRANSFER_BACKENDS)})"
        )
    tp = _int(args, "tp_size", 1, 1)
    dp = _int(args, "dp_size", 1, 1)
    attn_dp = _int(args, "attn_dp_size", 1, 1)
    if args.get("enable_dp_attention") and dp > 1 and attn_dp == 1:
        # SGLang 0.5.23 rewrites the deprecated spelling: attn_dp_size=N, dp_size=1.
        attn_dp, dp = dp, 1
    if tp % attn_dp:
        raise ConfigError(
            f"ServerArgs fields tp_size={tp}, attn_dp_size={attn_dp}: tp_size must be a "
            f"multiple of attn_dp_size (tp_size is the instance's GPU count)"
        )
    ep = _int(args, "ep_size", 1, 1)
    if tp % ep:
        raise ConfigError(f"ServerArgs fields tp_size={tp}, ep_size={ep}: ep_size must divide tp_size")
    pp = _int(args, "pp_size", 1, 1)
    port = _int(args, "port", 30000, 1)
    bootstrap_port = _int(args, "disaggregation_bootstrap_port", 8998, 1)
    if mode == "prefill" and bootstrap_port == port:
        raise ConfigError(
            f"ServerArgs fields port={port}, disaggregation_bootstrap_port={bootstrap_port}: "
            f"the bootstrap server needs its own port"
        )
    host = _str(args, "host", "127.0.0.1") or "127.0.0.1"
    served = _str(args, "served_model_name", None) or model_path
    context_length = _int(args, "context_length", 0, 0) or 0
    hf = _model_config(model_path)
    _refuse_a_broken_config(model_path)
    if not context_length:
        context_length = int(hf.get("max_position_embeddings") or 32768)
    lbm = _str(args, "load_balance_method", "auto") or "auto"
    if lbm == "auto":
        lbm = "follow_bootstrap_room" if mode == "prefill" else "round_robin"
    page_size = _int(args, "page_size", 1, 1) or 1
    chunk = _int(args, "chunked_prefill_size", DEFAULT_CHUNKED_PREFILL_SIZE)
    if chunk == 0 or chunk < -1:
        raise ConfigError(f"ServerArgs field chunked_prefill_size={chunk}: a positive token count, or -1 (no chunking)")
    if chunk > 0 and attn_dp > 1:
        chunk = max(chunk // attn_dp, 1)  # SGLang divides the chunk among the attention-DP ranks
    nnodes, node_rank, dist_init = _multi_node(args, tp, pp, dp)
    dist_timeout = DEFAULT_TIMEOUT_S if args.get("dist_timeout") is None else _int(args, "dist_timeout", 1, 1)
    mrr = args.get("max_running_requests")
    if mrr is not None:
        mrr = _int(args, "max_running_requests", 1, 1)
    resolved: dict[str, Any] = dict(args)
    resolved.update(
        host=host, port=port, model_path=model_path, served_model_name=served,
        tokenizer_path=args.get("tokenizer_path") or model_path,
        disaggregation_mode=mode, disaggregation_transfer_backend=backend,
        disaggregation_bootstrap_port=bootstrap_port, tp_size=tp, dp_size=dp,
        attn_dp_size=attn_dp, enable_dp_attention=attn_dp > 1, ep_size=ep, pp_size=pp,
        base_gpu_id=_int(args, "base_gpu_id", 0, 0), gpu_id_step=_int(args, "gpu_id_step", 1, 1),
        enable_metrics=bool(args.get("enable_metrics", False)), context_length=context_length,
        load_balance_method=lbm, page_size=page_size, chunked_prefill_size=chunk,
        kv_cache_dtype=_str(args, "kv_cache_dtype", "auto") or "auto",
        load_format=_str(args, "load_format", "auto") or "auto",
        nnodes=nnodes, node_rank=node_rank,
    )
    for secret in ("api_key", "admin_api_key"):
        resolved.pop(secret, None)
    for secret in REDACTED_FIELDS:
        if resolved.get(secret) is not None:
            resolved[secret] = "<redacted>"
    return ServerSettings(
        host=host,
        port=port,
        model_path=model_path,
        served_model_name=served,
        mode=mode,
        bootstrap_port=bootstrap_port,
        transfer_backend=backend,
        tp_size=tp,
        dp_size=dp,
        attn_dp_size=attn_dp,
        ep_size=ep,
        pp_size=pp,
        base_gpu_id=resolved["base_gpu_id"],
        enable_metrics=resolved["enable_metrics"],
        context_length=context_length,
        max_running_requests=mrr,
        chunked_prefill_size=chunk if chunk > 0 else None,
        page_size=page_size,
        kv_cache_dtype=resolved["kv_cache_dtype"],
        load_balance_method=lbm,
        resolved=resolved,
        api_key=api_key,
        nnodes=nnodes,
        node_rank=node_rank,
        dist_init=dist_init,
        dist_timeout_s=float(dist_timeout),
    )


def _multi_node(args: Mapping[str, Any], tp: int, pp: int, dp: int) -> tuple[int, int, tuple[str, int] | None]:
    """(nnodes, node_rank, dist_init) with SGLang's refusals, plus the mistakes SGLang
    0.5.23 accepts and then hangs or fails on at start-up (docs/multi-host.md)."""
    nnodes = _int(args, "nnodes", 1, 1)
    node_rank = _int(args, "node_rank", 0, 0)
    if nnodes == 1:
        return nnodes, node_rank, None
    if (tp * pp) % nnodes:
        raise ConfigError(f"ServerArgs fields tp_size={tp}, pp_size={pp}, nnodes={nnodes}: "
                          f"tp_size x pp_size must be divisible by nnodes (SGLang's check)")
    if dp > 1:
        raise ConfigError(f"ServerArgs fields dp_size={dp}, nnodes={nnodes}: multi-node data-parallel "
                          f"replicas are not supported; use attn_dp_size across nodes (SGLang's check)")
    if node_rank >= nnodes:
        raise ConfigError(f"ServerArgs fields node_rank={node_rank}, nnodes={nnodes}: node_rank must be "
                          f"below nnodes (0 on the host of dist_init_addr)")
    raw = _str(args, "dist_init_addr", None)
    if not raw:
        raise ConfigError(f"ServerArgs field dist_init_addr is required with nnodes={nnodes}: "
                          f"set it to node rank 0's ADDRESS:PORT on every node")
    try:
        return nnodes, node_rank, parse_dist_init_addr(raw)
    except ValueError as exc:
        raise ConfigError(f"ServerArgs field dist_init_addr={raw!r}: {exc}") from None


def _env_float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment {name}={raw!r}: must be a number") from None
    if value < minimum or value != value:
        raise ConfigError(f"environment {name}={raw!r}: must be >= {minimum}")
    return value


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """SGLang's EnvBool (srt/environ.py): true/1/yes/y or false/0/no/n, any case."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower() in ENV_TRUE:
        return True
    if raw.strip().lower() in ENV_FALSE:
        return False
    raise ConfigError(f"environment {name}={raw!r}: must be true or false")


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment {name}={raw!r}: must be an integer") from None
    if value < minimum:
        raise ConfigError(f"environment {name}={raw!r}: must be >= {minimum}")
    return value


def load_sim_settings(env: Mapping[str, str] | None = None) -> SimSettings:
    env = os.environ if env is None else env
    raw_faults = env.get("PDNODE_SIM_FAULTS", "")
    try:
        faults = tuple(str(f) for f in parse_faults([p for p in raw_faults.split(",") if p.strip()]))
    except FaultError as exc:
        raise ConfigError(f"environment PDNODE_SIM_FAULTS={raw_faults!r}: {exc}") from None
    sim = SimSettings(
        prefill_ms_per_token=_env_float(env, "PDNODE_SIM_PREFILL_MS_PER_TOKEN", 0.1),
        decode_ms_per_token=_env_float(env, "PDNODE_SIM_DECODE_MS_PER_TOKEN", 20.0),
        decode_ms_per_request=_env_float(env, "PDNODE_SIM_DECODE_MS_PER_REQUEST", 0.5),
        max_running_per_rank=_env_int(env, "PDNODE_SIM_MAX_RUNNING_PER_RANK", 256, 1),
        startup_s=_env_float(env, "PDNODE_SIM_STARTUP_S", 0.0),
        kv_bytes_per_token=_env_int(env, "PDNODE_SIM_KV_BYTES_PER_TOKEN", 16384, 1),
        kv_pool_mb=_env_int(env, "PDNODE_SIM_KV_POOL_MB", 256, 1),
        slow_factor=_env_float(env, "PDNODE_SIM_SLOW_FACTOR", 10.0, 1.0),
        faults=faults,
        waiting_timeout_s=_env_float(env, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0),
        bootstrap_timeout_s=_env_float(env, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0),
        heartbeat_interval_s=max(2.0, _env_float(env, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0)),
        heartbeat_max_failure=max(1, _env_int(env, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)),
        # Mooncake tests these for presence, whatever the value (transfer_engine_impl.cpp:
        # `if (intra_env)` installs nvlink_intra before anything else).
        kv_transport="tcp" if "MC_FORCE_TCP" in env else "nvlink" if "MC_INTRANODE_NVLINK" in env else "",
        kv_gb_s=_env_float(env, "PDNODE_SIM_KV_GB_S", 0.0) or None,
        no_hca=env.get("PDNODE_SIM_NO_HCA", "") == "1",
        force_hca="MC_FORCE_HCA" in env,
        failed_session_probe=_env_bool(env, "SGLANG_ENABLE_FAILED_SESSION_PROBE", True),
        failed_session_probe_interval_s=_env_float(env, "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S", 30.0, 0.1),
        failed_session_probe_max_interval_s=_env_float(env, "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S", 300.0, 0.1),
        failed_session_idle_timeout_s=_env_float(env, "SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S", 600.0, 0.1),
    )
    if sim.max_total_num_tokens < 1:
        raise ConfigError(
            "environment PDNODE_SIM_KV_POOL_MB / PDNODE_SIM_KV_BYTES_PER_TOKEN: the pool "
            "holds less than one token"
        )
    return sim


def read_api_key(path: str | os.PathLike[str]) -> str:
    """The key in PATH, read exactly as the launcher reads it (pdnode.node.secrets)."""
    try:
        return read_secret_file(os.fspath(path))
    except SecretError as exc:
        raise ConfigError(str(exc).replace("secret file", "API key file")) from None


def model_identity(model_path: str) -> tuple[str, list[str]]:
    """(model_type, architectures) from the model's config.json, else a dense Llama."""
    hf = _model_config(model_path)
    model_type = hf.get("model_type") if isinstance(hf.get("model_type"), str) else "llama"
    arch = hf.get("architectures")
    if not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        arch = ["LlamaForCausalLM"]
    return model_type, list(arch)
