"""The type each engine environment variable the plan knows is parsed as by the library
that reads it (issue 43, item 6): one table, read by the plan's check of
pdnode_engine_environment on every KV path (rule ``environment-value-parses``), by the
presence switches' warning (``environment-presence-switch``) and by the tests that hold
the plan's own rendered values (disagg.environment, kv_path's path environment) to it.

Read from the releases the plan pins (pdnode.node.releases):

- Mooncake: the C++ transfer engine, read at kvcache-ai/Mooncake main 3b5a594 (after
  0.3.12.post1; the 0.3.13.post1 and 0.3.14 tags are not in the stored snapshot). Its
  integers go through ``atoi`` (no error: "three" is 0, "1.5" is 1) and out-of-range
  values are ignored with a warning; its switches are tested with ``getenv(...)`` for
  presence only, so any value, "0" and "false" included, turns them on.
- NCCL: ``NCCL_PARAM`` integers go through ``ncclLoadParam`` (src/misc/param.cc,
  v2.29.7-1): ``strtoll(str, nullptr, 0)``, where "three" is 0 and "1.5" is 1 without an
  error; strings through ``ncclGetEnv``.
- SGLang 0.5.23 (the PyPI wheel): ``sglang/srt/environ.py``'s ``EnvInt`` (``int()``),
  ``EnvFloat`` (``float()``), ``EnvBool`` (TRUTH["EnvBool"]) and ``EnvStr``; a value its
  parser refuses makes ``EnvField.get`` warn and use the default. Variables read with
  ``os.getenv`` are noted where they are; ``get_bool_env_var`` (srt/utils/common.py:
  TRUTH["get_bool_env_var"]) reads none of these.

Standard library only.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

# How a library reads a boolean, case-insensitively: (true values, false values); a value
# in neither is refused by the check (SGLang warns and uses the variable's default).
TRUTH = {
    "EnvBool": (("true", "1", "yes", "y"), ("false", "0", "no", "n")),  # sglang/srt/environ.py EnvBool.parse
    "get_bool_env_var": (("true", "1"), ("false", "0")),  # sglang/srt/utils/common.py get_bool_env_var
}
# A presence switch written as one of these looks off to a reader, but is on.
LOOKS_OFF = ("", "0", "false", "no", "n", "off", "f")

INT_RE = re.compile(r"^[+-]?[0-9]+$")
FLOAT_RE = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")

# What each library does with a value its parser does not take.
ON_FAILURE = {
    "Mooncake": "atoi takes it without an error ('three' is 0, '1.5' is 1): Mooncake uses another number than the "
                "one written, or ignores it with only a warning in its log",
    "NCCL": "strtoll takes it without an error ('three' is 0, '1.5' is 1)",
    "SGLang": "SGLang 0.5.23 warns and uses its default (EnvField.get)",
}


class EnvType(NamedTuple):
    kind: str  # int | float | bool | str | presence
    library: str  # Mooncake | NCCL | SGLang: who parses it (the first, where two read it)
    source: str  # the file and function that read it
    low: float | None = None  # int, float: the lowest value the library takes
    high: float | None = None  # int, float: the highest
    truth: str = "EnvBool"  # bool: the key of TRUTH
    gap: tuple[int, int] | None = None  # int: a range the library refuses inside [low, high]
    failure: str = ""  # what a value the parser does not take does, when not its library's ON_FAILURE


_MC_CONFIG = "mooncake-transfer-engine/src/config.cpp loadGlobalConfig, atoi"
_MC_INSTALL = "mooncake-transfer-engine/src/transfer_engine_impl.cpp installTransports, getenv"
_NCCL_IB = "NCCL src/transport/net_ib/connect.cc NCCL_PARAM, src/misc/param.cc ncclLoadParam, strtoll"
_ENVIRON = "sglang/srt/environ.py Envs"


def _sglang(kind: str, low: float | None = None) -> EnvType:
    return EnvType(kind, "SGLang", f"{_ENVIRON}, Env{kind.capitalize()}", low)


TYPES: dict[str, EnvType] = {
    # --- Mooncake's transport switches: presence only (any value turns them on)
    "MC_FORCE_TCP": EnvType("presence", "Mooncake", _MC_INSTALL),
    "MC_INTRANODE_NVLINK": EnvType("presence", "Mooncake", _MC_INSTALL),
    "MC_FORCE_MNNVL": EnvType("presence", "Mooncake", _MC_INSTALL),
    "MC_FORCE_HCA": EnvType("presence", "Mooncake", _MC_INSTALL),
    "MC_USE_TENT": EnvType("presence", "Mooncake", "mooncake-transfer-engine/src/transfer_engine.cpp, getenv"),
    "MC_USE_TEV1": EnvType("presence", "Mooncake", "mooncake-transfer-engine/src/transfer_engine.cpp, getenv"),
    # --- Mooncake's numbers: atoi, then a range check that ignores the value outside it
    "MC_GID_INDEX": EnvType("int", "Mooncake", _MC_CONFIG, 0, 255),
    "MC_IB_PORT": EnvType("int", "Mooncake", _MC_CONFIG, 1, 255),  # 1-based (Mooncake#3381: 0 broke every RNIC)
    # ValidatePortRange: 1024-65535 outside the ephemeral 32768-60999, else 15000-17000
    "MC_MIN_RPC_PORT": EnvType("int", "Mooncake", _MC_CONFIG + ", ValidatePortRange", 1024, 65535, gap=(32768, 60999)),
    "MC_MAX_RPC_PORT": EnvType("int", "Mooncake", _MC_CONFIG + ", ValidatePortRange", 1024, 65535, gap=(32768, 60999)),
    # the misspelt aliases config.cpp reads where the two above are not set
    "MC_MIN_PRC_PORT": EnvType("int", "Mooncake", _MC_CONFIG + ", ValidatePortRange", 1024, 65535, gap=(32768, 60999)),
    "MC_MAX_PRC_PORT": EnvType("int", "Mooncake", _MC_CONFIG + ", ValidatePortRange", 1024, 65535, gap=(32768, 60999)),
    # max(5, atoi(...)) seconds: below 5 is 5
    "MC_TRANSFER_TIMEOUT": EnvType("int", "Mooncake", "mooncake-integration/transfer_engine/transfer_engine_py.cpp "
                                   "TransferEnginePy, atoi", 5),
    # --- Mooncake's strings
    "MC_TE_FILTERS": EnvType("str", "Mooncake", "mooncake-transfer-engine/src/topology.cpp getIbvDeviceWhitelist "
                             ", a comma list"),
    "MC_CUSTOM_TOPO_JSON": EnvType("str", "Mooncake", _MC_INSTALL + ", a file path"),
    "MC_TCP_BIND_ADDRESS": EnvType("str", "Mooncake", "mooncake-transfer-engine/src/transfer_engine_impl.cpp init"),
    "MC_RDMA_BIND_ADDRESS": EnvType("str", "Mooncake", "mooncake-transfer-engine/src/transport/rdma_transport/"
                                    "rdma_transport.cpp"),
    # --- NCCL (NCCL_PARAM integers; ncclGetEnv strings)
    # Mooncake reads it too without MC_GID_INDEX (config.cpp: atoi, 0-255); NCCL's -1 is automatic
    "NCCL_IB_GID_INDEX": EnvType("int", "NCCL", _NCCL_IB + "; Mooncake " + _MC_CONFIG, -1, 255),
    "NCCL_IB_TIMEOUT": EnvType("int", "NCCL", _NCCL_IB + "; ibv_qp_attr.timeout, 5 bits", 0, 31),
    "NCCL_IB_RETRY_CNT": EnvType("int", "NCCL", _NCCL_IB + "; ibv_qp_attr.retry_cnt, 3 bits", 0, 7),
    "NCCL_IB_DISABLE": EnvType("int", "NCCL", "NCCL src/transport/net_ib/init.cc NCCL_PARAM, strtoll"),
    "NCCL_IB_HCA": EnvType("str", "NCCL", "NCCL src/transport/net_ib/init.cc ncclGetEnv"),
    "NCCL_SOCKET_IFNAME": EnvType("str", "NCCL", "NCCL src/misc/socket.cc ncclGetEnv"),
    "NCCL_DEBUG": EnvType("str", "NCCL", "NCCL src/debug.cc ncclDebugInit"),
    # --- SGLang 0.5.23: the PD disaggregation runtime (environ.py)
    "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": _sglang("int"),
    "SGLANG_DISAGGREGATION_QUEUE_SIZE": _sglang("int"),
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": _sglang("int", 1),  # pdnode_disagg_bootstrap_timeout_s
    "SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT": _sglang("int"),
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": _sglang("float", 2),  # conn.py: max(value, 2.0)
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": _sglang("int", 1),  # conn.py: max(value, 1)
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": _sglang("int", 1),  # pdnode_disagg_waiting_timeout_s
    "SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT": _sglang("int"),
    "SGLANG_DISAGGREGATION_NIXL_BACKEND": _sglang("str"),
    "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": _sglang("str"),  # a JSON object (nixl/conn.py)
    "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": _sglang("bool"),
    "SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS": _sglang("int"),
    "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": _sglang("bool"),
    "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK": _sglang("bool"),
    "SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL": _sglang("int"),
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": _sglang("bool"),
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": _sglang("float"),
    # --- SGLang 0.5.23: KV-transfer staging and Mooncake transport (environ.py)
    "SGLANG_DISAGG_STAGING_BUFFER": _sglang("bool"),
    "SGLANG_DISAGG_STAGING_POOL_SIZE_MB": _sglang("int"),
    "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": _sglang("str"),  # its types: pdnode.core.plan.kv_path
    "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES": _sglang("int"),
    "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE": _sglang("bool"),
    "SGLANG_MOONCAKE_SEND_AUX_TCP": _sglang("bool"),
    "SGLANG_ENABLE_FAILED_SESSION_PROBE": _sglang("bool"),
    "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S": _sglang("float"),
    "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S": _sglang("float"),
    "SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S": _sglang("float"),
    "MOONCAKE_PROTOCOL": _sglang("str"),
    # --- SGLang 0.5.23, read with os.getenv
    "SGLANG_HOST_IP": EnvType("str", "SGLang", "sglang/srt/utils/network.py get_local_ip_auto, os.getenv"),
    "HOST_IP": EnvType("str", "SGLang", "sglang/srt/utils/network.py get_local_ip_auto, os.getenv"),
    "SGLANG_LOCAL_IP_NIC": EnvType("str", "SGLang", "sglang/srt/utils/network.py get_local_ip_by_nic, os.environ"),
    # int(os.getenv(...)) when the HTTP server is imported: anything else fails the engine's start
    "SGLANG_HEALTH_CHECK_TIMEOUT": EnvType("int", "SGLang", "sglang/srt/entrypoints/http_server.py "
                                           "HEALTH_CHECK_TIMEOUT, int(os.getenv(...))",
                                           failure="int() raises when the HTTP server is imported: the engine "
                                                   "fails its start"),
}


def rendered(value: Any) -> str:
    """The text the engine reads: the plan writes str(value) into its environment."""
    return str(value)


def _range(t: EnvType) -> str:
    if t.low is not None and t.high is not None:
        span = f" from {t.low:g} to {t.high:g}"
    elif t.low is not None:
        span = f" of {t.low:g} or more"
    else:
        span = ""
    return span + (f", outside {t.gap[0]}-{t.gap[1]}" if t.gap else "")


def expected(t: EnvType) -> str:
    """What the library takes, in words: 'an integer from 0 to 255'."""
    if t.kind == "int":
        return "an integer" + _range(t)
    if t.kind == "float":
        return "a number" + _range(t)
    if t.kind == "bool":
        return "true or false"
    return "any value" if t.kind == "presence" else "a string"


def parses(name: str, value: Any) -> bool:
    """Whether the library reading NAME parses VALUE (as the plan renders it) as the
    table's type, within its range. A name the table does not know: True."""
    t = TYPES.get(name)
    if t is None or t.kind in ("str", "presence"):
        return True
    text = rendered(value)
    if t.kind == "bool":
        true, false = TRUTH[t.truth]
        return text.lower() in true + false
    if not (INT_RE if t.kind == "int" else FLOAT_RE).match(text):
        return False
    number = int(text) if t.kind == "int" else float(text)
    if t.gap and t.gap[0] <= number <= t.gap[1]:
        return False
    return (t.low is None or number >= t.low) and (t.high is None or number <= t.high)


def problem(name: str, value: Any) -> tuple[str, str] | None:
    """(what is wrong, the fix) when VALUE of NAME is not what its library parses."""
    if parses(name, value):
        return None
    t = TYPES[name]
    words = ""
    if t.kind == "bool":
        true, false = TRUTH[t.truth]
        words = f" ({', '.join(true)} / {', '.join(false)}, in any case)"
    text = rendered(value)
    if t.kind in ("int", "float") and (INT_RE if t.kind == "int" else FLOAT_RE).match(text):
        why = f"{text!r} is out of that range: {t.library} does not use it as written"
    else:
        why = f"{text!r} is not one, and {t.failure or ON_FAILURE[t.library]}"
    return f"{t.library} reads it as {expected(t)}{words}: {why} ({t.source})", f"write {expected(t)}, or remove it"


def presence_looks_off(name: str, value: Any) -> bool:
    """Whether NAME is a presence switch written as if it turned it off ("0", "false")."""
    t = TYPES.get(name)
    return t is not None and t.kind == "presence" and rendered(value).strip().lower() in LOOKS_OFF
