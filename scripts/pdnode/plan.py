"""Node description (``pdnode_*`` variables) -> validated plan.

Every rule that SGLang 0.5.23 / sglang-router 0.3.2 enforce, and every rule that keeps
one 8-GPU host sane, lives here once. Callers: the CLI, the Ansible filter, the tests.
All problems are collected and reported together, one line each, naming the inventory
variable, the value, the rule and the fix.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from . import values
from .fields import BY_NAME, FIELDS, REQUIRED, THRESHOLD_KEYS

MODEL_KINDS = ("moe_mla", "moe", "dense")
ENGINES = ("sglang", "sim")
# SGLang's choices are mooncake, nixl, ascend, fake, mori, mooncake_tcp; this bundle
# deploys P->D on one NVIDIA host, so ascend/mori (other vendors) and fake (decode-only
# benchmarking, refused by prefill) are not offered.
TRANSFER_BACKENDS = ("mooncake", "mooncake_tcp", "nixl")
IB_DEVICE_BACKENDS = ("mooncake", "nixl")
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
REMOVED_SERVER_ARGS = {  # removed from SGLang in 2026-03: unknown flags since
    "disaggregation_decode_tp": "decode's TP is its own tp_size: set pdnode_decode_tp_size",
    "disaggregation_decode_dp": "decode's DP is its own attn_dp_size: set pdnode_decode_attn_dp_size",
    "disaggregation_prefill_pp": "set pipeline parallelism on the prefill instance itself (pp_size)",
}
# ServerArgs fields the plan derives; extra_args may not override them.
OWNED_SERVER_ARGS = {
    "model_path": "pdnode_model_path", "served_model_name": "pdnode_model_served_name",
    "host": "pdnode_worker_host", "port": "pdnode_<role>_port", "tp_size": "pdnode_<role>_tp_size",
    "attn_dp_size": "pdnode_<role>_attn_dp_size", "ep_size": "pdnode_decode_ep_size",
    "moe_dense_tp_size": "pdnode_decode_moe_dense_tp_size",
    "enable_dp_lm_head": "pdnode_decode_enable_dp_lm_head", "base_gpu_id": "pdnode_<role>_gpus",
    "gpu_id_step": "pdnode_<role>_gpus", "disaggregation_mode": "(fixed by the role)",
    "disaggregation_transfer_backend": "pdnode_transfer_backend",
    "disaggregation_bootstrap_port": "pdnode_prefill_bootstrap_port",
    "disaggregation_ib_device": "pdnode_ib_devices", "nccl_port": "pdnode_<role>_nccl_port",
    "mem_fraction_static": "pdnode_<role>_mem_fraction_static", "enable_metrics": "(always on)",
    "load_format": "pdnode_model_load_format", "api_key": "(a secret file, never a variable)",
}
OWNED_ROUTER_ARGS = {
    "pd_disaggregation": "(always on)", "prefill": "pdnode_prefill_*", "decode": "pdnode_decode_*",
    "worker_urls": "pdnode_prefill_*/pdnode_decode_*", "host": "pdnode_router_host",
    "port": "pdnode_router_port", "prometheus_host": "pdnode_router_metrics_host",
    "prometheus_port": "pdnode_router_metrics_port", "policy": "pdnode_router_policy",
    "worker_startup_timeout_secs": "pdnode_router_worker_startup_timeout_s",
    "cb_timeout_duration_secs": "pdnode_router_circuit_open_s",
    "api_key": "(a secret file, never a variable)",
}
# With DP attention and no --dist-init-addr, decode binds port+233 .. port+239 itself.
DECODE_INTERNAL_PORT_OFFSETS = range(233, 240)
_IB_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Problem:
    field: str
    value: Any
    rule: str
    fix: str
    severity: str = "error"  # error | warning

    def __str__(self) -> str:
        return f"{values.safe_name(self.field)}={_show(self.value)}: {self.rule}. Fix: {self.fix}."


class PlanError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass
class Plan:
    host: str
    prefill: dict[str, Any]
    decode: dict[str, Any]
    router: dict[str, Any]
    ports: dict[str, int]
    gpus: dict[str, list[int]]
    environment: dict[str, dict[str, str]]
    install: dict[str, str]  # user, root, venv, config_dir, unit names, key paths
    settings: dict[str, Any]  # the validated pdnode_* values, defaults filled in
    warnings: list[Problem] = field(default_factory=list)
    # Per service: its unit, the argv systemd runs and the URLs its readiness gate waits
    # for. Templates and tasks only read these (one source for every derived fact).
    services: dict[str, dict[str, Any]] = field(default_factory=dict)

    def router_argv(self) -> list[str]:
        return router_argv(self.router)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "prefill": self.prefill, "decode": self.decode,
            "router": self.router, "router_argv": self.router_argv(), "ports": self.ports,
            "gpus": self.gpus, "environment": self.environment, "install": self.install,
            "settings": self.settings, "services": self.services,
            "warnings": [str(w) for w in self.warnings],
        }


def _show(value: Any) -> str:
    if isinstance(value, str):
        # repr: a newline or escape in a value shows as \n, never as a new line
        return repr(value) if len(value) <= 120 else f"{value[:100]!r}... ({len(value)} characters)"
    return str(value)


def known_server_args() -> frozenset[str]:
    text = resources.files("pdnode").joinpath("data/serverargs-0.5.23.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def router_argv(router: dict[str, Any]) -> list[str]:
    """sglang-router arguments (underscored names) -> its command line."""
    argv: list[str] = []
    for key, value in router.items():
        flag = "--" + key.replace("_", "-")
        if key == "prefill":
            for url, bootstrap in value:
                argv += [flag, url, "none" if bootstrap is None else str(bootstrap)]
        elif key == "decode":
            for url in value:
                argv += [flag, url]
        elif value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


class _Checker:
    """Collects problems; typed getters that report instead of raising."""

    def __init__(self, variables: dict[str, Any]):
        self.raw = variables
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def error(self, field_: str, value: Any, rule: str, fix: str) -> None:
        self.problems.append(Problem(field_, value, rule, fix))

    def warn(self, field_: str, value: Any, rule: str, fix: str) -> None:
        self.warnings.append(Problem(field_, value, rule, fix, "warning"))

    def get(self, name: str) -> Any:
        spec = BY_NAME[name]
        if name not in self.raw or self.raw[name] is None and spec.default is not None:
            if spec.default is REQUIRED:
                self.error(name, None, "is required and not set", f"set {name} ({spec.doc}) in group_vars")
                return None
            return spec.default
        value = self.raw[name]
        ok = {
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "int_or_none": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
            "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "str": lambda v: isinstance(v, str) and v != "",
            "str_or_none": lambda v: v is None or (isinstance(v, str) and v != ""),
            "bool": lambda v: isinstance(v, bool),
            "dict": lambda v: isinstance(v, dict),
            "int_list": lambda v: isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
        }[spec.kind](value)
        if isinstance(value, str) and "{{" in value:
            self.error(name, value, "templated values are not supported in the node description",
                       "write the literal value; the plan is computed without Ansible")
            return None
        if not ok:
            want = {"int_list": "a list of integers", "int_or_none": "an integer or null",
                    "str_or_none": "a non-empty string or null", "str": "a non-empty string", "int": "an integer",
                    "float": "a number", "bool": "true or false", "dict": "a mapping"}[spec.kind]
            self.error(name, value, f"must be {want}", f"write {name} as {want} ({spec.doc})")
            return None
        return float(value) if spec.kind == "float" else value


def _unknown_variables(c: _Checker) -> None:
    for name in sorted(c.raw):
        if name.startswith("pdnode_") and name not in BY_NAME:
            close = [f.name for f in FIELDS if _similar(name, f.name)]
            hint = f"did you mean {close[0]}?" if close else "see docs/inventory.md for the variables"
            c.error(name, c.raw[name], "is not a variable this bundle knows", f"remove or rename it ({hint})")


def _similar(a: str, b: str) -> bool:
    import difflib
    return difflib.SequenceMatcher(None, a, b).ratio() > 0.85


def _check_port(c: _Checker, name: str, port: Any) -> None:
    if isinstance(port, int) and not 1024 <= port <= 65535:
        c.error(name, port, "must be an unprivileged TCP port (1024-65535)", "choose a port in 1024-65535")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_gpus(c: _Checker, role: str, gpus: Any, tp: Any, gpu_count: Any) -> None:
    name = f"pdnode_{role}_gpus"
    if not isinstance(gpus, list):
        return
    if not gpus:
        c.error(name, gpus, "is empty", f"list the physical GPU ids {role} runs on")
        return
    if isinstance(gpu_count, int):
        missing = [g for g in gpus if not 0 <= g < gpu_count]
        if missing:
            c.error(name, gpus, f"GPU ids {missing} do not exist on a host with pdnode_gpu_count={gpu_count}",
                    f"use ids 0..{gpu_count - 1}")
    if len(set(gpus)) != len(gpus):
        c.error(name, gpus, "lists a GPU more than once", "list each GPU once")
    elif gpus != list(range(gpus[0], gpus[0] + len(gpus))):
        c.error(name, gpus, "must be contiguous and ascending (SGLang places rank r on base_gpu_id + r)",
                f"use a range such as {list(range(min(gpus), min(gpus) + len(gpus)))}")
    if isinstance(tp, int) and len(gpus) != tp:
        c.error(name, gpus, f"has {len(gpus)} GPUs but pdnode_{role}_tp_size={tp} "
                "(with DP attention tp_size is still the instance's total GPU count)",
                f"give {role} exactly tp_size GPUs, or set pdnode_{role}_tp_size={len(gpus)}")


def _check_parallel(c: _Checker, role: str, tp: Any, attn_dp: Any, gpus: int) -> None:
    if isinstance(tp, int) and tp < 1:
        c.error(f"pdnode_{role}_tp_size", tp, "must be at least 1", "set the number of GPUs of the instance")
        return
    if isinstance(attn_dp, int) and attn_dp < 1:
        c.error(f"pdnode_{role}_attn_dp_size", attn_dp, "must be at least 1", "use 1 to turn DP attention off")
        return
    if isinstance(tp, int) and isinstance(attn_dp, int) and tp % attn_dp:
        c.error(f"pdnode_{role}_tp_size", tp,
                f"is not divisible by the attention-DP size pdnode_{role}_attn_dp_size={attn_dp} "
                "(SGLang asserts tp_size % attn_dp_size == 0; tp_size counts ALL GPUs of the instance, "
                "attention-TP per DP rank is tp_size/attn_dp_size)",
                f"set pdnode_{role}_tp_size to the instance's GPU count and pdnode_{role}_attn_dp_size to a "
                f"divisor of it (e.g. tp_size={gpus} with attn_dp_size={gpus if gpus % attn_dp else attn_dp})")


def _check_extra(c: _Checker, role: str, extra: Any, known: frozenset[str]) -> None:
    name = f"pdnode_{role}_extra_args"
    if not isinstance(extra, dict):
        return
    for key, value in extra.items():
        if key in REMOVED_SERVER_ARGS:
            c.error(f"{name}.{key}", value, "was removed from SGLang in 2026-03 (now an unknown flag)",
                    REMOVED_SERVER_ARGS[key])
        elif key == "enable_dp_attention" or (key == "dp_size" and value not in (None, 1)):
            c.error(f"{name}.{key}", value,
                    "is the deprecated DP-attention spelling (--enable-dp-attention --dp-size N; "
                    "rewritten to attn_dp_size=N and rejected by SGLang's YAML config)",
                    f"remove it and set pdnode_{role}_attn_dp_size")
        elif key in OWNED_SERVER_ARGS:
            owner = OWNED_SERVER_ARGS[key].replace("<role>", role)
            c.error(f"{name}.{key}", value, f"is set by the plan from {owner}", f"remove it from {name}")
        elif key not in known:
            close = [k for k in known if _similar(key, k)]
            hint = f" (did you mean {close[0]}?)" if close else ""
            c.error(f"{name}.{key}", value, "is not a ServerArgs field of SGLang 0.5.23",
                    f"use a field name from `python -m sglang.launch_server --help` with underscores{hint}")
        else:
            values.check_server_arg(c.error, name, key, value)  # type, choices, secrets


def _check_moe(c: _Checker, kind: Any, tp: Any, attn_dp: Any, ep: Any, dense_tp: Any,
               dp_lm_head: Any, extra: dict[str, Any]) -> None:
    if not isinstance(tp, int) or tp < 1:
        return
    if isinstance(ep, int):
        if ep < 1:
            c.error("pdnode_decode_ep_size", ep, "must be at least 1", "use 1 for no expert parallelism")
        elif ep > 1 and kind == "dense":
            c.error("pdnode_decode_ep_size", ep, "expert parallelism needs a MoE model but pdnode_model_kind='dense'",
                    "set pdnode_decode_ep_size: 1 for a dense model")
        elif tp % ep:
            c.error("pdnode_decode_ep_size", ep,
                    f"does not divide pdnode_decode_tp_size={tp} (EP is carved out of the TP world)",
                    f"use an ep_size that divides {tp}, e.g. {tp}")
        a2a = extra.get("moe_a2a_backend") if isinstance(extra, dict) else None
        if a2a not in (None, "none") and ep != tp:
            c.error("pdnode_decode_ep_size", ep,
                    f"must equal tp_size={tp} with an all-to-all MoE backend (moe_a2a_backend={a2a!r})",
                    f"set pdnode_decode_ep_size: {tp}")
    if dense_tp is not None and dense_tp not in (1, tp):
        c.error("pdnode_decode_moe_dense_tp_size", dense_tp, f"must be unset, 1 or tp_size ({tp})",
                "use 1 (dense layers data-parallel) or leave it unset")
    if dense_tp is not None and kind == "dense":
        c.error("pdnode_decode_moe_dense_tp_size", dense_tp, "only applies to MoE models", "leave it unset")
    if dp_lm_head is True and isinstance(attn_dp, int) and attn_dp <= 1:
        c.error("pdnode_decode_enable_dp_lm_head", True, "needs DP attention (pdnode_decode_attn_dp_size > 1)",
                "set pdnode_decode_attn_dp_size > 1 or set this to false")


def _check_transfer(c: _Checker, backend: Any, ib: Any, used_gpus: list[int]) -> dict[int, str]:
    if isinstance(backend, str) and backend not in TRANSFER_BACKENDS:
        why = {"fake": "decode-only benchmarking; prefill refuses it and it cannot move KV from P to D",
               "ascend": "Ascend NPUs, not NVIDIA GPUs", "mori": "AMD GPUs, not NVIDIA GPUs"}.get(
            backend, "not a transfer backend this bundle deploys")
        c.error("pdnode_transfer_backend", backend, why, f"use one of {', '.join(TRANSFER_BACKENDS)}")
        return {}
    if not isinstance(ib, dict) or not ib:
        return {}
    if backend not in IB_DEVICE_BACKENDS:
        c.error("pdnode_ib_devices", ib, f"RDMA devices cannot be used with pdnode_transfer_backend={backend!r} "
                "(SGLang silently drops --disaggregation-ib-device there, so the mapping would do nothing)",
                "remove pdnode_ib_devices, or use the mooncake backend over RDMA")
        return {}
    mapping: dict[int, str] = {}
    for key, dev in ib.items():
        try:
            gpu = int(key)
        except (TypeError, ValueError):
            c.error(f"pdnode_ib_devices.{key}", dev, "keys must be physical GPU ids", "write e.g. 0: mlx5_0")
            continue
        names = [d.strip() for d in str(dev).split(",")] if isinstance(dev, str) else []
        if not names or not all(_IB_NAME.match(n) for n in names):
            c.error(f"pdnode_ib_devices.{key}", dev, "must be an RDMA device name or a comma list of them",
                    "write the name as in /sys/class/infiniband, e.g. mlx5_0")
            continue
        mapping[gpu] = ",".join(names)
    unmapped = [g for g in used_gpus if g not in mapping]
    if unmapped and mapping:
        c.error("pdnode_ib_devices", ib, f"has no device for GPUs {unmapped} used by prefill/decode "
                "(SGLang raises 'No IB devices configured for GPU n')",
                "map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)")
    return mapping


def _check_thresholds(c: _Checker, thresholds: Any) -> None:
    if not isinstance(thresholds, dict):
        return
    for key, value in thresholds.items():
        name = f"pdnode_verify_thresholds.{key}"
        if key not in THRESHOLD_KEYS:
            c.error(name, value, "is not a known threshold", f"use one of {', '.join(THRESHOLD_KEYS)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            c.error(name, value, "must be a positive number", "write a number in the unit of its name")


def build_plan(variables: dict[str, Any], host: str = "node") -> Plan:
    """Validate a node description and derive the plan; raise PlanError with all problems."""
    c = _Checker(variables)
    _unknown_variables(c)
    v = {f.name: c.get(f.name) for f in FIELDS}
    known = known_server_args()
    # Every value that reaches a unit, an environment file, argv or a path: strict patterns.
    skip = values.backstop(c.raw, [f.name for f in FIELDS], c.error)
    values.check_settings(v, skip, c.error)
    values.check_role_values(c.raw, c.error)
    if v["pdnode_model_load_format"] is not None and "pdnode_model_load_format" not in skip:
        values.check_load_format(c.error, v["pdnode_model_load_format"])

    if v["pdnode_engine"] is not None and v["pdnode_engine"] not in ENGINES:
        c.error("pdnode_engine", v["pdnode_engine"], "unknown engine", "use sglang (real) or sim (stand-in)")
    if v["pdnode_model_kind"] is not None and v["pdnode_model_kind"] not in MODEL_KINDS:
        c.error("pdnode_model_kind", v["pdnode_model_kind"], "unknown model kind", f"use one of {', '.join(MODEL_KINDS)}")
    if isinstance(v["pdnode_model_path"], str) and not v["pdnode_model_path"].startswith("/"):
        c.error("pdnode_model_path", v["pdnode_model_path"],
                "must be an absolute local path (otherwise SGLang and the router try to reach a model hub)",
                "download the model to the host and give its directory")
    for name in ("pdnode_install_root", "pdnode_config_dir"):
        if isinstance(v[name], str) and not v[name].startswith("/"):
            c.error(name, v[name], "must be an absolute path", "write it from the root, e.g. /opt/sglang-pd")
    if isinstance(v["pdnode_service_user"], str) and v["pdnode_service_user"] == "root":
        c.error("pdnode_service_user", "root", "the services must not run as root",
                "use a dedicated system user such as sglang")
    if isinstance(v["pdnode_gpu_count"], int) and v["pdnode_gpu_count"] < 1:
        c.error("pdnode_gpu_count", v["pdnode_gpu_count"], "must be at least 1", "set the number of GPUs of the host")
    for role in ("prefill", "decode"):
        frac = v[f"pdnode_{role}_mem_fraction_static"]
        if isinstance(frac, float) and not 0 < frac < 1:
            c.error(f"pdnode_{role}_mem_fraction_static", frac, "must be between 0 and 1", "use e.g. 0.85")
    worker_host = v["pdnode_worker_host"]
    if isinstance(worker_host, str) and not _is_loopback(worker_host):
        c.error("pdnode_worker_host", worker_host, "prefill and decode must listen on loopback only "
                "(the router is the node's one public endpoint)", "use 127.0.0.1")

    # GPUs and parallelism
    kind = v["pdnode_model_kind"]
    for role in ("prefill", "decode"):
        _check_gpus(c, role, v[f"pdnode_{role}_gpus"], v[f"pdnode_{role}_tp_size"], v["pdnode_gpu_count"])
        role_gpus = v[f"pdnode_{role}_gpus"]
        n_gpus = len(role_gpus) if role_gpus else 4
        _check_parallel(c, role, v[f"pdnode_{role}_tp_size"], v[f"pdnode_{role}_attn_dp_size"], n_gpus)
        _check_extra(c, role, v[f"pdnode_{role}_extra_args"], known)
    pg, dg = v["pdnode_prefill_gpus"] or [], v["pdnode_decode_gpus"] or []
    shared = sorted(set(pg) & set(dg))
    if shared:
        c.error("pdnode_decode_gpus", dg, f"GPUs {shared} are also in pdnode_prefill_gpus", "give each GPU to one role")
    if isinstance(v["pdnode_prefill_attn_dp_size"], int) and v["pdnode_prefill_attn_dp_size"] > 1:
        c.warn("pdnode_prefill_attn_dp_size", v["pdnode_prefill_attn_dp_size"],
               "DP attention on prefill makes each GPU attend one request: TTFT gets several times worse",
               "use plain TP on prefill (attn_dp_size 1)")
    decode_extra = v["pdnode_decode_extra_args"] if isinstance(v["pdnode_decode_extra_args"], dict) else {}
    _check_moe(c, kind, v["pdnode_decode_tp_size"], v["pdnode_decode_attn_dp_size"], v["pdnode_decode_ep_size"],
               v["pdnode_decode_moe_dense_tp_size"], v["pdnode_decode_enable_dp_lm_head"], decode_extra)
    ib_map = _check_transfer(c, v["pdnode_transfer_backend"], v["pdnode_ib_devices"], pg + dg)
    _check_thresholds(c, v["pdnode_verify_thresholds"])

    # Router
    if v["pdnode_router_policy"] is not None and v["pdnode_router_policy"] not in ROUTER_POLICIES:
        c.error("pdnode_router_policy", v["pdnode_router_policy"], "not a PD routing policy of sglang-router 0.3.2",
                f"use one of {', '.join(ROUTER_POLICIES)}")
    router_extra = v["pdnode_router_extra_args"] if isinstance(v["pdnode_router_extra_args"], dict) else {}
    for key, value in router_extra.items():
        if key == "dp_aware":
            c.error("pdnode_router_extra_args.dp_aware", value, "is broken in PD mode in sglang-router 0.3.2",
                    "remove it")
        elif key in OWNED_ROUTER_ARGS:
            c.error(f"pdnode_router_extra_args.{key}", value, f"is set by the plan from {OWNED_ROUTER_ARGS[key]}",
                    "remove it from pdnode_router_extra_args")
        else:
            values.check_router_arg(c.error, key, value)  # known name, type, choices, secrets
    metrics_host = v["pdnode_router_metrics_host"]
    if isinstance(metrics_host, str) and not _is_loopback(metrics_host):
        c.warn("pdnode_router_metrics_host", metrics_host, "router metrics are reachable beyond this host",
               "bind them to 127.0.0.1 unless a remote Prometheus scrapes them")

    # Ports: every listener of the node, once
    ports = _ports(v)
    owners: dict[int, str] = {}
    for name, port in ports.items():
        if not isinstance(port, int):
            continue
        if name.startswith("pdnode_"):
            _check_port(c, name, port)
        if port in owners:
            a, b = owners[port], name
            c.error(b if b.startswith("pdnode_") else a, port, f"port {port} is used by both {a} and {b}",
                    "give every listener its own port (decode also binds its port+233..+239)")
        else:
            owners[port] = name
    if v["pdnode_router_port"] == 30000:
        c.warn("pdnode_router_port", 30000, "30000 is SGLang's default server port (and sglang-router's); "
               "it is easy to collide with a worker started by hand", "prefer 8000")

    if c.problems:
        raise PlanError(c.problems)
    return _derive(v, ib_map, ports, c.warnings, host)


def _ports(v: dict[str, Any]) -> dict[str, int]:
    ports = {name: v[name] for name in (
        "pdnode_prefill_port", "pdnode_prefill_bootstrap_port", "pdnode_prefill_nccl_port",
        "pdnode_decode_port", "pdnode_decode_nccl_port", "pdnode_router_port", "pdnode_router_metrics_port")}
    dport, ddp = v["pdnode_decode_port"], v["pdnode_decode_attn_dp_size"]
    if isinstance(dport, int) and isinstance(ddp, int) and ddp > 1:
        for off in DECODE_INTERNAL_PORT_OFFSETS:
            ports[f"pdnode_decode_port+{off}"] = dport + off
    pport, pdp = v["pdnode_prefill_port"], v["pdnode_prefill_attn_dp_size"]
    if isinstance(pport, int) and isinstance(pdp, int) and pdp > 1:
        for off in DECODE_INTERNAL_PORT_OFFSETS:
            ports[f"pdnode_prefill_port+{off}"] = pport + off
    return ports


def _server_args(v: dict[str, Any], role: str, ib_map: dict[int, str]) -> dict[str, Any]:
    gpus = v[f"pdnode_{role}_gpus"]
    args: dict[str, Any] = {
        "model_path": v["pdnode_model_path"],
        "served_model_name": v["pdnode_model_served_name"],
        "host": v["pdnode_worker_host"],
        "port": v[f"pdnode_{role}_port"],
        "tp_size": v[f"pdnode_{role}_tp_size"],
        "base_gpu_id": gpus[0],
        "gpu_id_step": 1,
        "nccl_port": v[f"pdnode_{role}_nccl_port"],
        "mem_fraction_static": v[f"pdnode_{role}_mem_fraction_static"],
        "disaggregation_mode": role,
        "disaggregation_transfer_backend": v["pdnode_transfer_backend"],
        "disaggregation_bootstrap_port": v["pdnode_prefill_bootstrap_port"],
        "enable_metrics": True,
    }
    if v[f"pdnode_{role}_attn_dp_size"] > 1:
        args["attn_dp_size"] = v[f"pdnode_{role}_attn_dp_size"]
    if role == "decode":
        if v["pdnode_decode_ep_size"] > 1:
            args["ep_size"] = v["pdnode_decode_ep_size"]
        if v["pdnode_decode_moe_dense_tp_size"] is not None:
            args["moe_dense_tp_size"] = v["pdnode_decode_moe_dense_tp_size"]
        if v["pdnode_decode_enable_dp_lm_head"]:
            args["enable_dp_lm_head"] = True
    if ib_map:
        # Keys are physical GPU ids: SGLang looks up base_gpu_id + rank * gpu_id_step.
        args["disaggregation_ib_device"] = {str(g): ib_map[g] for g in gpus}
    if v["pdnode_model_load_format"]:
        args["load_format"] = v["pdnode_model_load_format"]
    args.update(v[f"pdnode_{role}_extra_args"])
    return args


def _derive(v: dict[str, Any], ib_map: dict[int, str], ports: dict[str, int],
            warnings: list[Problem], host: str) -> Plan:
    wh = v["pdnode_worker_host"]
    url_host = f"[{wh}]" if ":" in wh else wh
    router: dict[str, Any] = {
        "pd_disaggregation": True,
        "prefill": [[f"http://{url_host}:{v['pdnode_prefill_port']}", v["pdnode_prefill_bootstrap_port"]]],
        "decode": [f"http://{url_host}:{v['pdnode_decode_port']}"],
        "host": v["pdnode_router_host"],
        "port": v["pdnode_router_port"],
        "prometheus_host": v["pdnode_router_metrics_host"],
        "prometheus_port": v["pdnode_router_metrics_port"],
        "policy": v["pdnode_router_policy"],
        "worker_startup_timeout_secs": v["pdnode_router_worker_startup_timeout_s"],
        "cb_timeout_duration_secs": v["pdnode_router_circuit_open_s"],
    }
    router.update(v["pdnode_router_extra_args"])
    env_common = {"HF_HUB_OFFLINE": "1", **{str(k): str(val) for k, val in v["pdnode_engine_environment"].items()}}
    environment = {"prefill": dict(env_common), "decode": dict(env_common), "router": {"HF_HUB_OFFLINE": "1"}}
    if v["pdnode_engine"] == "sim":
        for role in ("prefill", "decode"):
            environment[role].update({
                "PDNODE_SIM_PREFILL_MS_PER_TOKEN": str(v["pdnode_sim_prefill_ms_per_token"]),
                "PDNODE_SIM_DECODE_MS_PER_TOKEN": str(v["pdnode_sim_decode_ms_per_token"]),
                "PDNODE_SIM_STARTUP_S": str(v["pdnode_sim_startup_s"]),
            })
    prefix = v["pdnode_service_prefix"]
    # One virtualenv per release set: an upgrade installs beside the running one.
    # Every version installed into the venv names it, the CUDA 13 Mooncake build too:
    # otherwise changing that version would install into the running release in place.
    release = (f"sglang-{v['pdnode_sglang_version']}" if v["pdnode_engine"] == "sglang" else "sim") + (
        f"-router-{v['pdnode_sglang_router_version']}-mooncake-{v['pdnode_mooncake_version']}"
        f"-cu13-{v['pdnode_mooncake_cuda13_version']}")
    config_dir = v["pdnode_config_dir"]
    install = {
        "user": v["pdnode_service_user"], "root": v["pdnode_install_root"],
        "venv": f"{v['pdnode_install_root']}/venvs/{release}", "config_dir": config_dir,
        "engine": v["pdnode_engine"], "prefix": prefix, "target": f"{prefix}.target",
        **{f"unit_{role}": f"{prefix}-{role}.service" for role in ("prefill", "decode", "router")},
        "python": f"{v['pdnode_install_root']}/venvs/{release}/bin/python",
        "api_key_path": f"{config_dir}/api-key",
        "admin_key_path": f"{config_dir}/router-admin-key",
    }
    prefill = _server_args(v, "prefill", ib_map)
    decode = _server_args(v, "decode", ib_map)
    return Plan(
        host=host,
        install=install,
        prefill=prefill,
        decode=decode,
        router=router,
        ports={k: p for k, p in ports.items()},
        gpus={"prefill": list(v["pdnode_prefill_gpus"]), "decode": list(v["pdnode_decode_gpus"])},
        environment=environment,
        settings=v,
        warnings=warnings,
        services=_services(install, prefill, decode, router, with_api_key=bool(v["pdnode_api_key_file"])),
    )


def _url_host(host: str) -> str:
    """A bind address as a client reaches it: a wildcard is reached on loopback (the
    gate runs on the node itself), IPv6 goes in brackets."""
    if host == "0.0.0.0":  # noqa: S104 - a bind address read, not bound here
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _services(install: dict[str, Any], prefill: dict[str, Any], decode: dict[str, Any],
              router: dict[str, Any], with_api_key: bool) -> dict[str, dict[str, Any]]:
    """unit, exec argv and readiness URLs of each service."""
    py = install["python"]
    cfg = install["config_dir"]
    key = ["--api-key-file", install["api_key_path"]] if with_api_key else []
    services: dict[str, dict[str, Any]] = {}
    for role, args in (("prefill", prefill), ("decode", decode)):
        base = f"http://{_url_host(args['host'])}"
        ready = [f"{base}:{args['port']}/health"]
        if role == "prefill":
            # The bootstrap server answers /route once every prefill rank registered.
            ready.append(f"{base}:{args['disaggregation_bootstrap_port']}/route?prefill_dp_rank=-1"
                         "&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")
        services[role] = {
            "unit": install[f"unit_{role}"],
            # --watchdog-url: the launcher's sidecar feeds systemd's watchdog from /health
            # (only when the unit sets WatchdogSec=).
            "exec": [py, "-m", "pdnode.launcher", "--engine", install["engine"], "--watchdog-url", ready[0],
                     f"{cfg}/{role}.json", *key],
            "ready": ready,
        }
    # The router's worker-management API needs the admin key, always (clients hold only
    # the API key, if any).
    services["router"] = {
        "unit": install["unit_router"],
        "exec": [py, "-m", "pdnode.router_launch", f"{cfg}/router.json",
                 "--admin-key-file", install["admin_key_path"], *key],
        # /readiness turns 200 once a prefill and a decode are registered; gate there.
        "ready": [f"http://{_url_host(str(router['host']))}:{router['port']}/readiness"],
    }
    return services
