"""The site variables (``pdnode_*``) of a node description: type, default, meaning.

This table is the one place that says which inventory variables exist. The inventory's
group_vars document them for people; ``tests/test_fields.py`` checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...node import releases

REQUIRED = object()  # marker: the inventory must set it


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # int | float | str | bool | int_list | str_list | dict | str_or_none | int_or_none
    default: Any
    doc: str


_F = Field
FIELDS: tuple[Field, ...] = (
    # The host
    _F("pdnode_gpu_count", "int", REQUIRED, "GPUs on the host"),
    _F("pdnode_gpu_model", "str", REQUIRED, "GPU model as nvidia-smi names it (letters, digits, spaces, . _ ( ) / + -; at most 64)"),
    _F("pdnode_driver_branch", "int", 580, "NVIDIA driver branch pinned on the host"),
    _F("pdnode_service_prefix", "str", "sglang-pd", "systemd unit prefix: <prefix>-prefill, ... (a-z first, then a-z 0-9 -; at most 40; not ending in -)"),
    _F("pdnode_engine", "str", "sglang", "what the launcher starts: sglang (real) or sim (stand-in)"),
    _F("pdnode_service_user", "str", "sglang", "system user the three services run as (POSIX name: a-z or _ first, then a-z 0-9 _ -; at most 32; not root)"),
    _F("pdnode_install_root", "str", "/opt/sglang-pd", "where per-release virtualenvs live (host path, see the path rule below; owned by the service user)"),
    _F("pdnode_config_dir", "str", "/etc/sglang-pd", "ServerArgs JSON, environment files, secrets (host path, see the path rule below; owned by the service user)"),
    _F("pdnode_wheelhouse", "str_or_none", None, "controller directory of wheels for offline installs (made by scripts/wheelhouse; "
       "relative paths are relative to the checkout's root, or to the run's directory with the installed collection; letters, digits, . _ / + -; at most 200)"),
    _F("pdnode_api_key_file", "str_or_none", None, "controller file holding the API key the router and workers require (relative "
       "paths are relative to the checkout's root, or to the run's directory with the installed collection; copied to the host mode 0400; letters, digits, . _ / + -)"),
    # The model
    _F("pdnode_model_path", "str", REQUIRED, "absolute path of the model directory on the host (path rule below)"),
    _F("pdnode_model_served_name", "str", REQUIRED, "name clients use in 'model' (letter or digit first, then letters, digits, . _ / @ + -; at most 128; no ':', SGLang reserves it)"),
    _F("pdnode_model_kind", "str_or_none", None, "moe_mla | moe | dense; read from the model's config.json when "
       "pdnode_model_source is an hf:// one (a typed kind must agree with it), required otherwise"),
    _F("pdnode_model_source", "str_or_none", None, "where the model comes from (docs/model.md): hf://ORG/NAME@REVISION "
       "(downloaded by the model role, pinned by the lock file beside the inventory: `pdnode model lock`) or "
       "local://PATH (already on every host at pdnode_model_path, validated there); unset: the operator puts the "
       "weights at pdnode_model_path"),
    _F("pdnode_model_endpoint", "str_or_none", None, "the HF-compatible endpoint hf:// sources come from (a site "
       "mirror, http(s)://HOST[:PORT][/PATH]); unset: huggingface_hub's default"),
    _F("pdnode_model_reserve_gb", "float", 1.0, "free space (GB) a download must leave on the filesystem of "
       "pdnode_model_path: the model role refuses, before any byte moves, a commit that does not fit with it"),
    _F("pdnode_model_share_port", "int", 29100, "where the first engine host of a layout spanning hosts serves the "
       "verified model to the other engine hosts during the model role's run (its address; only the layout's peers "
       "are admitted): one download from the endpoint per layout"),
    _F("pdnode_model_token_file", "str_or_none", None, "controller file holding the hub token of a gated model "
       "(relative paths as for pdnode_api_key_file); read on the controller, on the host only while a download "
       "runs (mode 0600), never in a unit, an argv or a log"),
    _F("pdnode_model_load_format", "str_or_none", None, "SGLang --load-format (dummy: random weights)"),
    _F("pdnode_model_weights_gb", "float_or_none", None, "weight size in GB (1e9 bytes) for the capacity check; "
       "overrides pdnode_model_controller_path"),
    _F("pdnode_model_controller_path", "str_or_none", None, "controller directory with the model's config.json "
       "(and model.safetensors.index.json): the capacity check reads the weight size there (relative paths are "
       "relative to the checkout's root, or to the run's directory with the installed collection)"),
    # The engine instances (keys of each entry: INSTANCE_KEYS below)
    _F("pdnode_prefill_instances", "instance_list", REQUIRED, "prefill instances of the host, each a mapping of INSTANCE_KEYS (below)"),
    _F("pdnode_decode_instances", "instance_list", REQUIRED, "decode instances of the host, each a mapping of INSTANCE_KEYS (below)"),
    # Where prefill and decode listen (the router is the only public listener)
    _F("pdnode_worker_host", "str", "127.0.0.1", "address prefill and decode bind on a one-host node (loopback)"),
    # Several hosts (docs/multi-host.md): where each host is reached and which runs the router
    _F("pdnode_node_address", "str_or_none", None, "this host's IP address as the other hosts of a multi-host layout "
       "reach it (host_vars; engines bind it, peers and the router connect to it, the firewall admits them)"),
    _F("pdnode_router_node", "str_or_none", None, "inventory host that runs the router (default: the first host "
       "of the first prefill instance)"),
    # KV transfer
    _F("pdnode_transfer_backend", "str", "mooncake", "mooncake | mooncake_tcp | nixl"),
    _F("pdnode_ib_devices", "dict", {}, "physical GPU id -> RDMA device(s), e.g. {0: mlx5_0}"),
    _F("pdnode_kv_intranode_nvlink", "bool", True, "move KV over Mooncake's intra-node NVLink transport when every "
       "instance runs on one host whose GPUs NVLink joins (false: RDMA or TCP as pdnode_transfer_backend says; "
       "docs/kv-path.md)"),
    _F("pdnode_kv_checksum", "bool", False, "--disaggregation-enable-kv-checksum on every prefill and decode (an "
       "Adler-32 over each request's KV pages, checked on decode; SGLang needs it on both roles)"),
    _F("pdnode_decode_allocation_policy", "str", "early", "--disaggregation-decode-allocation-policy on every "
       "engine: early (SGLang's default) | prefill_complete (SGLang needs the same on both roles)"),
    _F("pdnode_disagg_bootstrap_timeout_s", "int", 300, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT of every engine: "
       "how long a hand-off waits for its peer's bootstrap (SGLang's default 300)"),
    _F("pdnode_disagg_waiting_timeout_s", "int", 300, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT of every engine: how "
       "long a decode waits for a request's KV (SGLang's default 300)"),
    _F("pdnode_disagg_heartbeat_interval_s", "float", 5.0, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL (at least 2): "
       "with the next, how soon a decode drops a dead prefill (the plan's restart coupling waits that long)"),
    _F("pdnode_disagg_heartbeat_max_failure", "int", 2, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE (at least 1)"),
    _F("pdnode_drain_timeout_s", "int", 300, "before a planned stop (deploy, upgrade, playbooks/restart.yml) an "
       "instance leaves the router and the stop waits until its requests are done, at most this long (then it "
       "stops anyway, and says how many were left; docs/decisions.md, \"Drain before a planned stop\")"),
    _F("pdnode_pair_probe_interval_s", "int", 60, "every this many seconds a timer on the router's host sends one "
       "request to every prefill-decode pair and writes which were served (pdnode_pair_probe_success, read by "
       "the alert PdPairFailing; docs/monitoring.md); 0: no probe, else 30-3600"),
    _F("pdnode_kv_prompt_tokens", "int", 4000, "prompt size (tokens) for which check, explain and plan state what "
       "the KV hand-off adds to TTFT"),
    _F("pdnode_model_kv_bytes_per_token", "int_or_none", None, "the model's KV cache bytes per token (bf16: 2 x layers "
       "x KV heads x head dim x 2); read from pdnode_model_controller_path's config.json when unset"),
    # Router
    _F("pdnode_router_host", "str", "0.0.0.0", "router bind address (the public endpoint; an IP address or a DNS name)"),
    _F("pdnode_router_port", "int", 8000, "router HTTP port (its own default 30000 collides)"),
    _F("pdnode_router_metrics_host", "str", "127.0.0.1", "router Prometheus listener address (an IP address or a DNS name)"),
    _F("pdnode_router_metrics_port", "int", 29000, "router Prometheus listener port"),
    _F("pdnode_router_policy", "str_or_none", None, "random | round_robin | cache_aware | power_of_two; unset: the "
       "router package's policy measured safe when an instance dies (smg power_of_two, sglang-router cache_aware; "
       "docs/decisions.md)"),
    _F("pdnode_router_worker_startup_timeout_s", "int", 1800, "how long the router waits for workers"),
    _F("pdnode_router_circuit_open_s", "int", 5,
       "seconds a tripped circuit breaker stays open (router default 60: one prefill and one "
       "decode have no other worker to fail over to, so a long open circuit only prolongs an outage)"),
    _F("pdnode_router_package", "str", releases.ROUTER_PACKAGE,
       "smg (the maintained successor of sglang-router; x86_64 only) | sglang-router (0.3.2, the last of its line; "
       "also on aarch64); docs/smg.md"),
    _F("pdnode_router_extra_args", "dict", {}, "more arguments of the router package (underscored names, types and choices of its parser; no secrets)"),
    _F("pdnode_allow_unavailable", "bool", False, "let a deploy run a change that leaves prefill or decode with no "
       "instance serving for a step, when no order of the change avoids it (refused otherwise, before anything "
       "stops; `pdnode diff` shows the steps and the expected window: docs/decisions.md, \"A layout change, in "
       "order\")"),
    _F("pdnode_allow_exposing_args", "str_list", [], "engine and router arguments that open a door (a listener beyond "
       "loopback, no API key check, data or weights over the network; docs/security.md lists them) allowed anyway, "
       "each with a warning, e.g. [otlp_traces_endpoint]; `mesh_*` allows smg's mesh arguments"),
    # Environment of the engines (SGLANG_*, MC_*, ...), common to prefill and decode
    _F("pdnode_engine_environment", "dict", {}, "extra environment for prefill and decode (names A-Z 0-9 _; values letters, digits, _ . , : / @ + = -)"),
    # How a run converges
    _F("pdnode_fast_path", "bool", True, "each role first reads the host state it converges in one call and runs "
       "its tasks only when something differs (a no-change run's speed); false: every task runs and its module "
       "judges, as tests do to compare the two"),
    # Versions
    _F("pdnode_sglang_version", "str", releases.SGLANG, "SGLang release installed on the host"),
    _F("pdnode_sglang_router_version", "str", releases.SGLANG_ROUTER, "sglang-router release (pdnode_router_package sglang-router)"),
    _F("pdnode_smg_version", "str", releases.SMG, "smg release (pdnode_router_package smg; x86_64 wheels only)"),
    _F("pdnode_mooncake_version", "str", releases.MOONCAKE, "Mooncake transfer engine release (CUDA 12 and non-CUDA builds)"),
    _F("pdnode_mooncake_cuda13_version", "str", releases.MOONCAKE_CUDA13, "Mooncake CUDA 13 build release (its own release line)"),
    # Verification
    _F("pdnode_verify_prompt_words", "int", 256, "length of the verification prompt"),
    _F("pdnode_verify_max_tokens", "int", 32, "tokens generated per verification request"),
    _F("pdnode_verify_burst_requests", "int", 16, "requests in the threshold burst"),
    _F("pdnode_verify_burst_concurrency", "int", 4, "concurrent requests in the burst"),
    _F("pdnode_verify_timeout_s", "float", 60.0, "upper bound on any one verification request"),
    _F("pdnode_verify_reference_prompt", "str", "What is the capital of France? Answer in one word.",
       "correctness probe prompt (temperature 0; at most 4000 characters)"),
    _F("pdnode_verify_reference_answer", "str", "Paris", "text the probe's answer must contain (at most 200 characters)"),
    _F("pdnode_verify_thresholds", "dict", {}, "metric thresholds, see THRESHOLD_KEYS"),
    # Stand-in engine knobs (pdnode_engine: sim)
    _F("pdnode_sim_prefill_ms_per_token", "float", 0.05, "stand-in prefill time per prompt token on ONE GPU "
       "(a rank of tp GPUs takes 1/tp of it; docs/planner.md)"),
    _F("pdnode_sim_decode_ms_per_token", "float", 5.0, "stand-in decode step time for a lone request (the ITL of one request)"),
    _F("pdnode_sim_decode_ms_per_request", "float", 0.5, "stand-in decode step time added per further running request "
       "on the rank (batching: a step serves every running request)"),
    _F("pdnode_sim_max_running_per_rank", "int", 256, "stand-in batch limit per scheduler rank when max_running_requests "
       "is not set (more requests queue)"),
    _F("pdnode_sim_kv_bytes_per_token", "int", 16384, "stand-in KV cache bytes moved prefill -> decode per prompt token"),
    _F("pdnode_sim_startup_s", "float", 1.0, "stand-in 'model load' time before /health is 200"),
)

# The thresholds the verification judges (keys of pdnode_verify_thresholds): one table,
# core/inventory/thresholds.py (it imports nothing, so the plan can read it cheaply).
from .thresholds import THRESHOLD_KEYS  # noqa: E402, F401 - re-exported: plan/build.py, docs.py

BY_NAME = {f.name: f for f in FIELDS}


@dataclass(frozen=True)
class InstanceKey:
    name: str
    kind: str
    default: Any
    doc: str
    roles: tuple[str, ...] = ("prefill", "decode")


_K = InstanceKey
# Keys of one entry of pdnode_prefill_instances / pdnode_decode_instances. A port left
# out is allocated by the plan (pdnode.core.rules.ports), collision-free.
INSTANCE_KEYS: tuple[InstanceKey, ...] = (
    _K("name", "str", None, "short name in the unit (<prefix>-<role>-<name>.service): a-z 0-9, at most 12; default the index"),
    _K("hosts", "str_list", [], "inventory hosts the instance runs on (default: the host being deployed); several "
       "hosts make ONE instance spanning them (SGLang --nnodes, --node-rank in this order)"),
    _K("gpus", "int_list", REQUIRED, "physical GPU ids on each of its hosts, evenly spaced (the spacing is SGLang's "
       "gpu_id_step); tp_size x dp_size of them in all hosts together"),
    _K("tp_size", "int", None, "tensor parallel size: ALL GPUs of one replica, DP attention included (default: GPUs x "
       "hosts / dp_size)"),
    _K("dp_size", "int", 1, "data-parallel replicas of the model in this instance (DP attention is attn_dp_size)"),
    _K("attn_dp_size", "int", 1, "attention data parallel size (1: off; divides tp_size)"),
    _K("ep_size", "int_or_none", None, "expert parallel size (divides tp_size; MoE only; unset: SGLang's choice)"),
    _K("moe_dense_tp_size", "int_or_none", None, "dense-layer TP of a MoE model: unset, 1 or tp_size"),
    _K("enable_dp_lm_head", "bool", False, "vocab-parallel lm head over DP attention (needs attn_dp_size > 1)"),
    _K("port", "int", None, "HTTP port (loopback); with DP attention port+233..+239 are bound too (default: allocated)"),
    _K("bootstrap_port", "int", None, "bootstrap server port (default: allocated from 8998)", ("prefill",)),
    _K("nccl_port", "int", None, "NCCL port (default: allocated)"),
    _K("dist_init_port", "int", None, "port of the first host's rendezvous for an instance spanning hosts "
       "(--dist-init-addr; SGLang derives its ZMQ ports from the next 7; default: allocated)"),
    _K("mem_fraction_static", "float", 0.85, "--mem-fraction-static: share of GPU memory for weights and KV cache"),
    _K("extra_args", "dict", {}, "more ServerArgs fields (names, types and choices of SGLang 0.5.23's parser; no secrets)"),
)
INSTANCE_KEYS_BY_NAME = {k.name: k for k in INSTANCE_KEYS}

# The one-instance variables of earlier releases -> the instance key that replaced them.
RETIRED_ROLE_VARIABLES = {
    f"pdnode_{role}_{key}": key for role in ("prefill", "decode") for key in (
        "gpus", "tp_size", "attn_dp_size", "ep_size", "moe_dense_tp_size", "enable_dp_lm_head", "port",
        "bootstrap_port", "nccl_port", "mem_fraction_static", "extra_args")
    if role in INSTANCE_KEYS_BY_NAME[key].roles  # no pdnode_decode_bootstrap_port: decode has none
}
