"""Node description (``pdnode_*`` variables) -> validated plan.

Every rule that SGLang 0.5.23 / sglang-router 0.3.2 enforce, and every rule that keeps
one 8-GPU host sane, lives here once. Callers: the CLI, the Ansible filter, the tests.
All problems are collected and reported together, one line each, naming the inventory
variable, the value, the rule and the fix.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ...node import releases
from . import cluster, kv_path, managed
from . import model as model_plan
from ..inventory import deferred
from ..rules import argtable, disagg, environment_types, guards, mooncake_select, router_judge, values
from ..resources import controller_dir
from ..rules import instances as inst_rules
from ..inventory.fields import BY_NAME, FIELDS, INSTANCE_KEYS_BY_NAME, REQUIRED, RETIRED_ROLE_VARIABLES, THRESHOLD_KEYS
from ..rules.instances import Instance
from ...node.router_launch import router_argv
from ..rules.ports import BASES, allocate, reserved_ports
from ..change import cost as change_cost
from ..change import identity, window
from ..change import layout_change as lc
from .schema import SCHEMA_ID
from .roles.pd_services import ENGINE_UNIT
from .roles.views import views

MODEL_KINDS = ("moe_mla", "moe", "dense")
ENGINES = ("sglang", "sim")
# SGLang's choices are mooncake, nixl, ascend, fake, mori, mooncake_tcp; this bundle
# deploys P->D on one NVIDIA host, so ascend/mori (other vendors) and fake (decode-only
# benchmarking, refused by prefill) are not offered.
TRANSFER_BACKENDS = ("mooncake", "mooncake_tcp", "nixl")
IB_DEVICE_BACKENDS = ("mooncake", "nixl")
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
# Distribution -> its version variable (pdnode.node.router_launch starts either, docs/smg.md).
ROUTER_PACKAGES = {"sglang-router": "pdnode_sglang_router_version", "smg": "pdnode_smg_version"}
# The policy an unset pdnode_router_policy means: per package, the one measured to lose no
# request when an instance dies (docs/smg.md's failure table; docs/decisions.md says why).
ROUTER_DEFAULT_POLICY = {"sglang-router": "cache_aware", "smg": "power_of_two"}
OWNED_ROUTER_ARGS = {
    "pd_disaggregation": "(always on)", "prefill": "pdnode_prefill_instances",
    "decode": "pdnode_decode_instances", "worker_urls": "pdnode_prefill_instances/pdnode_decode_instances", "host": "pdnode_router_host",
    "port": "pdnode_router_port", "prometheus_host": "pdnode_router_metrics_host",
    "prometheus_port": "pdnode_router_metrics_port", "policy": "pdnode_router_policy",
    "worker_startup_timeout_secs": "pdnode_router_worker_startup_timeout_s",
    "cb_timeout_duration_secs": "pdnode_router_circuit_open_s",
    "api_key": "(a secret file, never a variable)",
}
# Controller paths in the description are relative to the controller directory (a
# checkout's root; with the installed package, the directory pdnode runs in).
REPO_ROOT = controller_dir()
_IB_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Problem:
    rule_id: str  # pdnode.rules: what --json reports and docs list
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
    host: str  # the inventory host this plan deploys
    install: dict[str, Any]  # user, root, venv, config_dir, prefix, target, key paths, state dirs, CUDA major
    # Per service id (prefill-<name>..., decode-<name>..., router) that runs on THIS host,
    # in start order: its unit, the argv systemd runs, the URLs its readiness gate waits
    # for, its files, arguments and environment. Templates and tasks only read these
    # (docs/architecture.md).
    services: dict[str, dict[str, Any]]
    ports: dict[str, int]
    settings: dict[str, Any]  # the validated pdnode_* values, defaults filled in
    # Every host of the layout and every engine instance on it, the router's public URL
    # (pdnode.core.plan.cluster); on one host: this host on loopback.
    cluster: dict[str, Any] = field(default_factory=dict)
    firewall: dict[str, Any] = field(default_factory=dict)
    warnings: list[Problem] = field(default_factory=list)
    # Where the model comes from and what its files state (pdnode.core.plan.model); {}
    # when the inventory names no pdnode_model_source.
    model: dict[str, Any] = field(default_factory=dict)
    # The change from what the node runs (its record) to this layout (_change).
    change: dict[str, Any] = field(default_factory=dict)

    def engines(self, role: str | None = None) -> list[dict[str, Any]]:
        return [s for s in self.services.values()
                if s["role"] in ("prefill", "decode") and (role is None or s["role"] == role)]

    def router_argv(self) -> list[str]:
        return router_argv(self.services["router"]["args"])

    def as_dict(self) -> dict[str, Any]:
        doc = {
            "schema": SCHEMA_ID, "host": self.host, "install": self.install, "services": self.services,
            "router_argv": self.router_argv() if "router" in self.services else [], "ports": self.ports,
            "settings": self.settings, "cluster": self.cluster, "firewall": self.firewall, "model": self.model,
            "change": self.change,
            "warnings": [str(w) for w in self.warnings],
            # every path the deploy's roles write, its mode and owner, what a re-run restores
            "managed": managed.paths(self.install, self.services, bool(self.settings.get("pdnode_api_key_file"))),
        }
        # what each role reads, computed from the records above (pdnode.core.plan.roles)
        doc["roles"] = views(doc)
        return doc


def _show(value: Any) -> str:
    if isinstance(value, str):
        # repr: a newline or escape in a value shows as \n, never as a new line
        return repr(value) if len(value) <= 120 else f"{value[:100]!r}... ({len(value)} characters)"
    return str(value)


def known_server_args() -> frozenset[str]:
    text = resources.files("pdnode").joinpath(f"data/serverargs-{releases.SGLANG}.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


class _Checker:
    """Collects problems; typed getters that report instead of raising."""

    def __init__(self, variables: dict[str, Any]):
        self.raw = variables
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def error(self, rule_id: str, field_: str, value: Any, rule: str, fix: str) -> None:
        self.problems.append(Problem(rule_id, field_, value, rule, fix))

    def warn(self, rule_id: str, field_: str, value: Any, rule: str, fix: str) -> None:
        self.warnings.append(Problem(rule_id, field_, value, rule, fix, "warning"))

    def get(self, name: str) -> Any:
        spec = BY_NAME[name]
        if name not in self.raw or self.raw[name] is None and spec.default is not None:
            if spec.default is REQUIRED:
                if not _retired_for(self.raw, name):  # else check_retired's one line says it all
                    self.error("variable-required",
                               name, None, "is required and not set", f"set {name} ({spec.doc}) in group_vars")
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
            "str_list": lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
            "float_or_none": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
            "instance_list": lambda v: isinstance(v, list),
        }[spec.kind](value)
        if isinstance(value, str) and "{{" in value:
            self.error("value-templated", name, value, "templated values are not supported in the node description",
                       "write the literal value; the plan is computed without Ansible")
            return None
        if not ok:
            want = {"int_list": "a list of integers", "str_list": "a list of names", "int_or_none": "an integer or null",
                    "str_or_none": "a non-empty string or null", "str": "a non-empty string", "int": "an integer",
                    "float": "a number", "bool": "true or false", "dict": "a mapping",
                    "float_or_none": "a number or null", "instance_list": "a list of instance mappings"}[spec.kind]
            fix = f"write {name} as {want} ({spec.doc})"
            if isinstance(value, str) and spec.kind not in ("str", "str_or_none"):
                # ansible-playbook -e NAME=VALUE hands every value over as a string
                fix += f" unquoted; -e {name}=... is a string too: on the command line give JSON, -e '{{\"{name}\": ...}}'"
            self.error("variable-type", name, value, f"must be {want}", fix)
            return None
        return float(value) if spec.kind == "float" or (spec.kind == "float_or_none" and value is not None) else value


def _retired_for(raw: dict[str, Any], name: str) -> bool:
    """Whether the one-instance variables that ``name`` (pdnode_<role>_instances) replaced are set."""
    role = name.removesuffix("instances")
    return name.endswith("_instances") and any(n.startswith(role) for n in raw if n in RETIRED_ROLE_VARIABLES)


def _deferred(c: _Checker) -> None:
    """Values the inventory's reading did not compute because they need code run on the
    controller (pdnode.core.inventory.deferred): refused where they reach a unit, an environment
    file, argv or ServerArgs; else a warning, and the plan is computed without them."""
    kept: dict[str, Any] = {}
    for name in c.raw:
        found = deferred.leaves(c.raw[name], name)
        if not found or (name.startswith("pdnode_") and not deferred.lands_in_unit(name)
                         and name not in deferred.DEPLOY_TIME_FIELDS):
            kept[name] = c.raw[name]  # (an unknown pdnode_* name: refused as unknown, as written)
            continue
        for where, leaf in found:
            text = str.__str__(leaf)
            if deferred.lands_in_unit(name):
                c.error("value-needs-lookup", where, text, deferred.REFUSED_RULE.format(needs=leaf.needs),
                        deferred.REFUSED_FIX)
            else:
                c.warn("value-templated-at-deploy", where, text, deferred.WARNED_RULE.format(needs=leaf.needs),
                       deferred.WARNED_FIX)
    if len(kept) != len(c.raw):
        c.raw = kept


def _unknown_variables(c: _Checker) -> None:
    for name in sorted(c.raw):
        if name.startswith("pdnode_") and name not in BY_NAME and name not in RETIRED_ROLE_VARIABLES:
            close = [f.name for f in FIELDS if _similar(name, f.name)]
            hint = f"did you mean {close[0]}?" if close else "see docs/inventory.md for the variables"
            role, _, key = name.removeprefix("pdnode_").partition("_")
            if key in INSTANCE_KEYS_BY_NAME and role in INSTANCE_KEYS_BY_NAME[key].roles:
                hint = f"{key} is a key of each entry of pdnode_{role}_instances"
            c.error("variable-unknown",
                    name, c.raw[name], "is not a variable this bundle knows", f"remove or rename it ({hint})")


def _similar(a: str, b: str) -> bool:
    import difflib
    return difflib.SequenceMatcher(None, a, b).ratio() > 0.85


def _check_port(c: _Checker, name: str, port: Any) -> None:
    if isinstance(port, int) and not 1024 <= port <= 65535:
        c.error("port-range",
                name, port, "must be an unprivileged TCP port (1024-65535)", "choose a port in 1024-65535")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_transfer(c: _Checker, backend: Any, ib: Any, used_gpus: list[int]) -> dict[int, str]:
    if isinstance(backend, str) and backend not in TRANSFER_BACKENDS:
        why = {"fake": "decode-only benchmarking; prefill refuses it and it cannot move KV from P to D",
               "ascend": "Ascend NPUs, not NVIDIA GPUs", "mori": "AMD GPUs, not NVIDIA GPUs"}.get(
            backend, "not a transfer backend this bundle deploys")
        c.error("transfer-backend-supported",
                "pdnode_transfer_backend", backend, why, f"use one of {', '.join(TRANSFER_BACKENDS)}")
        return {}
    if not isinstance(ib, dict) or not ib:
        return {}
    if backend not in IB_DEVICE_BACKENDS:
        c.error("ib-devices-need-rdma-backend",
                "pdnode_ib_devices", ib, f"RDMA devices cannot be used with pdnode_transfer_backend={backend!r} "
                "(SGLang silently drops --disaggregation-ib-device there, so the mapping would do nothing)",
                "remove pdnode_ib_devices, or use the mooncake backend over RDMA")
        return {}
    mapping: dict[int, str] = {}
    for key, dev in ib.items():
        try:
            gpu = int(key)
        except (TypeError, ValueError):
            c.error("ib-device-key-gpu-id",
                    f"pdnode_ib_devices.{key}", dev, "keys must be physical GPU ids", "write e.g. 0: mlx5_0")
            continue
        names = [d.strip() for d in str(dev).split(",")] if isinstance(dev, str) else []
        if not names or not all(_IB_NAME.match(n) for n in names):
            c.error("ib-device-name",
                    f"pdnode_ib_devices.{key}", dev, "must be an RDMA device name or a comma list of them",
                    "write the name as in /sys/class/infiniband, e.g. mlx5_0")
            continue
        mapping[gpu] = ",".join(names)
    unmapped = [g for g in used_gpus if g not in mapping]
    if unmapped and mapping:
        c.error("ib-devices-cover-gpus",
                "pdnode_ib_devices", ib, f"has no device for GPUs {unmapped} used by the engine instances "
                "(SGLang raises 'No IB devices configured for GPU n')",
                "map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)")
    return mapping


def _check_thresholds(c: _Checker, thresholds: Any) -> None:
    if not isinstance(thresholds, dict):
        return
    for key, value in thresholds.items():
        name = f"pdnode_verify_thresholds.{key}"
        if key not in THRESHOLD_KEYS:
            c.error("threshold-known",
                    name, value, "is not a known threshold", f"use one of {', '.join(THRESHOLD_KEYS)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            c.error("threshold-positive",
                    name, value, "must be a positive number", "write a number in the unit of its name")


def build_plan(variables: dict[str, Any], host: str = "node",
               inventory: Mapping[str, Mapping[str, Any]] | None = None, inventory_dir: str | None = None,
               model_lock: dict[str, Any] | None = None, running: Mapping[str, str | None] | None = None,
               started: Mapping[str, float] | None = None,
               processes: Mapping[str, Mapping[str, str | None]] | None = None,
               strangers: Mapping[str, Iterable[str]] | None = None) -> Plan:
    """Validate a node description and derive the plan of ``host``; raise PlanError with
    all problems. ``inventory`` maps every inventory host to its variables (only the
    hosts a multi-host layout names are read: their address and layout description);
    ``inventory_dir`` (Ansible's inventory_dir) holds the model's lock file; ``model_lock``
    (an upgrade's way back: the lock the serving commit was verified against) replaces it.
    ``running``: each host's record of the layout it runs (pdnode.core.change.identity;
    None or all None: none, instances are named by their index); ``started``: unit -> seconds
    its last start took on the node (systemd's record), for a change's windows;
    ``processes``: unit -> what its process runs now (python, model_commit: the
    layout_read module's), so that a new release or model commit restarts count;
    ``strangers``: host -> the units of the prefix it runs that its record does not name."""
    c = _Checker(variables)
    _deferred(c)
    if c.problems:  # what the value is, is not known: the rest would judge a template's text
        raise PlanError(c.problems)
    _unknown_variables(c)
    inst_rules.check_retired(c)
    v = {f.name: c.get(f.name) for f in FIELDS}
    known = known_server_args()
    # Every value that reaches a unit, an environment file, argv or a path: strict patterns.
    skip = values.backstop(c.raw, [f.name for f in FIELDS], c.error)
    values.check_settings(v, skip, c.error)
    values.check_role_values(c.raw, c.error, c.warn)
    if "pdnode_api_key_file" not in {p.field for p in c.problems}:
        guards.check_api_key_file(c.error, v["pdnode_api_key_file"], REPO_ROOT)  # exactly one key, never shown
    allow = guards.allowed(c.error, v["pdnode_allow_exposing_args"])
    if v["pdnode_model_load_format"] is not None and "pdnode_model_load_format" not in skip:
        values.check_load_format(c.error, v["pdnode_model_load_format"])

    if v["pdnode_engine"] is not None and v["pdnode_engine"] not in ENGINES:
        c.error("engine-known",
                "pdnode_engine", v["pdnode_engine"], "unknown engine", "use sglang (real) or sim (stand-in)")
    if v["pdnode_model_kind"] is not None and v["pdnode_model_kind"] not in MODEL_KINDS:
        c.error("model-kind-known",
                "pdnode_model_kind", v["pdnode_model_kind"], "unknown model kind", f"use one of {', '.join(MODEL_KINDS)}")
    # The model's own files, where a source pins them: the facts the inventory need not type.
    model, facts = model_plan.resolve(c.error, c.warn, v, inventory_dir, REPO_ROOT, model_lock)
    if facts is not None:
        v["pdnode_model_kind"] = v["pdnode_model_kind"] or facts.kind
        v["pdnode_model_controller_path"] = v["pdnode_model_controller_path"] or str(facts.directory)
    elif v["pdnode_model_kind"] is None and "pdnode_model_kind" not in {p.field for p in c.problems}:
        c.error("model-kind-needed", "pdnode_model_kind", None,
                "is not set, and no model files say it (pdnode_model_source hf:// with its lock and cache)",
                f"set pdnode_model_kind ({', '.join(MODEL_KINDS)}), or name the model with pdnode_model_source "
                "and run `pdnode model lock INVENTORY`")
    if isinstance(v["pdnode_model_path"], str) and not v["pdnode_model_path"].startswith("/"):
        c.error("model-path-absolute", "pdnode_model_path", v["pdnode_model_path"],
                "must be an absolute local path (otherwise SGLang and the router try to reach a model hub)",
                "download the model to the host and give its directory")
    for name in ("pdnode_install_root", "pdnode_config_dir"):
        if isinstance(v[name], str) and not v[name].startswith("/"):
            c.error("path-absolute",
                    name, v[name], "must be an absolute path", "write it from the root, e.g. /opt/sglang-pd")
    if isinstance(v["pdnode_service_user"], str) and v["pdnode_service_user"] == "root":
        c.error("service-user-not-root", "pdnode_service_user", "root", "the services must not run as root",
                "use a dedicated system user such as sglang")
    if isinstance(v["pdnode_gpu_count"], int) and v["pdnode_gpu_count"] < 1:
        c.error("gpu-count-positive",
                "pdnode_gpu_count", v["pdnode_gpu_count"], "must be at least 1", "set the number of GPUs of the host")
    if isinstance(v["pdnode_drain_timeout_s"], int) and v["pdnode_drain_timeout_s"] < 1:
        c.error("drain-timeout-positive", "pdnode_drain_timeout_s", v["pdnode_drain_timeout_s"],
                "must be at least 1 (seconds a planned stop waits for the instance's requests)", "use e.g. 300")
    probe = v["pdnode_pair_probe_interval_s"]
    if isinstance(probe, int) and probe != 0 and not PAIR_PROBE_MIN_INTERVAL_S <= probe <= 3600:
        c.error("pair-probe-interval-range", "pdnode_pair_probe_interval_s", probe,
                f"must be 0 (no probe) or {PAIR_PROBE_MIN_INTERVAL_S}-3600 seconds (each run sends a request to "
                f"every pair, and waits for each at most {PAIR_PROBE_TIMEOUT_S} s)", "use e.g. 60")
    for name in ("pdnode_sim_prefill_ms_per_token", "pdnode_sim_decode_ms_per_token", "pdnode_sim_startup_s",
                 "pdnode_sim_decode_ms_per_request", "pdnode_sim_max_running_per_rank", "pdnode_sim_kv_bytes_per_token"):
        floor = 1 if BY_NAME[name].kind == "int" else 0
        if isinstance(v[name], (int, float)) and v[name] < floor:
            c.error("sim-value-range", name, v[name], f"must be {floor} or more", f"use e.g. {BY_NAME[name].default}")
    worker_host = v["pdnode_worker_host"]
    if isinstance(worker_host, str) and not _is_loopback(worker_host) and "pdnode_worker_host" not in {
            p.field for p in c.problems}:  # not twice: a value its pattern refused
        c.error("worker-host-loopback",
                "pdnode_worker_host", worker_host, "prefill and decode must listen on loopback only "
                "(the router is the node's one public endpoint)", "use 127.0.0.1")

    # The instances: each alone, then together (GPUs, ports)
    kind = v["pdnode_model_kind"]
    engines: list[Instance] = []
    for role in inst_rules.ROLES:
        if f"pdnode_{role}_instances" not in skip:
            engines += inst_rules.read(c, role, v[f"pdnode_{role}_instances"])
    layout = cluster.place(c, v, engines, host, inventory)  # before the sizes: a spanning instance's GPUs
    for inst in engines:
        inst_rules.check(c, inst, v["pdnode_gpu_count"], kind, known)
    inst_rules.check_shared_gpus(c, engines)
    disagg.check(c, v)
    inst_rules.check_same_disagg_settings(c, engines, disagg.engine_defaults(v))
    inst_rules.check_same_kv_layout(c, engines)
    inst_rules.check_same_context_length(c, engines)
    inst_rules.check_prefill_dp_replicas(c, engines)
    inst_rules.check_attention_tp(c, engines, kind)
    inst_rules.check_hicache_hisparse(c, engines)
    _check_capacity(c, v, engines, skip, facts)
    ib_map = _check_transfer(c, v["pdnode_transfer_backend"], v["pdnode_ib_devices"],
                             sorted({g for i in engines if host in i.hosts for g in i.gpus}))
    kv = None
    if layout is not None and not c.problems:
        kv = _kv_path(c, v, layout.multi_host, ib_map)
    _check_thresholds(c, v["pdnode_verify_thresholds"])
    # Arguments that open a door (a listener beyond loopback, no key, data off the node):
    # only with pdnode_allow_exposing_args; a field refused for another cause is not repeated.
    guards.check_engine_doors(c.error, c.warn, allow, [(f"{i.field}.extra_args", i.extra_args) for i in engines],
                              v["pdnode_model_load_format"], {p.field for p in c.problems})
    _check_router(c, v, allow)
    fixed = {"router.port": ("pdnode_router_port", v["pdnode_router_port"]),
             "router.metrics_port": ("pdnode_router_metrics_port", v["pdnode_router_metrics_port"])}
    sharing = model_plan.shares(model, layout)
    if sharing:  # one download per layout: the first engine host serves the others
        fixed["model.share_port"] = ("pdnode_model_share_port", v["pdnode_model_share_port"])
    # What the node runs names the instances that stay (issue 45), before ports are given.
    try:
        recorded = identity.read(running or {})
    except identity.RecordError as exc:
        c.error("layout-record-readable", exc.where, None, exc.problem, exc.fix)
        recorded = None
    now_running = recorded.running if recorded is not None else None
    notes = identity.adopt(engines, now_running) if not c.problems else []
    ports = allocate(c, engines, fixed, identity.avoid_ports(now_running, engines))
    for name in ("pdnode_router_port", "pdnode_router_metrics_port") + (("pdnode_model_share_port",) if sharing else ()):
        _check_port(c, name, v[name])
    if v["pdnode_router_port"] == 30000:
        c.warn("router-port-not-30000",
               "pdnode_router_port", 30000, "30000 is SGLang's default server port (and sglang-router's); "
               "it is easy to collide with a worker started by hand", "prefer 8000")

    if c.problems or layout is None:
        raise PlanError(c.problems)
    plan = _derive(v, engines, ib_map, ports, c.warnings, layout, kv)
    plan.model = model_plan.with_share(model or {}, plan.cluster, host, ports.get("model.share_port"))
    if plan.model.get("share", {}).get("seed") == host:  # the peers fetch from this host
        plan.firewall["tcp_ports"] = sorted({*plan.firewall["tcp_ports"], plan.model["share"]["port"]})
    if plan.model.get("commit"):
        # The commit is part of what an engine started with: a new one restarts each
        # engine by the deploy's drain-and-restart, as a changed argument does.
        for svc in plan.engines():
            svc["environment"]["PDNODE_MODEL_COMMIT"] = plan.model["commit"]
    plan.change = _change(v, engines, recorded, notes, plan, model or {}, started or {}, processes or {},
                          strangers or {})
    if "router" in plan.services:
        # The router package decides whether it starts with these arguments: ask it (the
        # plan's argv, the keys the launcher adds), once everything else holds.
        extras = v["pdnode_router_extra_args"] if isinstance(v["pdnode_router_extra_args"], dict) else {}
        router_judge.check(c.error, c.warn, plan.services["router"]["args"], v["pdnode_router_package"],
                           v[ROUTER_PACKAGES[v["pdnode_router_package"]]], [str(k) for k in extras],
                           api_key=bool(v["pdnode_api_key_file"]))
        if c.problems:
            raise PlanError(c.problems)
    return plan


def _check_capacity(c: _Checker, v: dict[str, Any], engines: list[Instance], skip: set[str],
                    facts: model_plan.ModelFacts | None = None) -> None:
    """Do the weights fit each instance's GPUs (with KV room)? Only when the inventory
    says how big they are (pdnode_model_weights_gb or pdnode_model_controller_path)."""
    from ..rules import capacity  # reads files only when a controller path is set

    if {"pdnode_model_weights_gb", "pdnode_model_controller_path"} & skip:
        return
    try:
        if facts is not None and facts.weight_bytes and v["pdnode_model_weights_gb"] is None:
            found: tuple[int, str] | None = (facts.weight_bytes, facts.weight_source)
        else:
            found = capacity.weight_bytes(v, REPO_ROOT)
    except capacity.WeightsError as exc:
        c.error(exc.rule_id, exc.field, exc.value, exc.rule, exc.fix)
        return
    if found is None:
        return
    described = [{"field": i.field, "id": i.id, "tp_size": i.tp_size, "dp_size": i.dp_size, "gpus": i.gpus,
                  "mem_fraction_static": i.mem_fraction_static}
                 for i in engines if isinstance(i.tp_size, int) and isinstance(i.mem_fraction_static, float)]
    count = v["pdnode_gpu_count"] if isinstance(v["pdnode_gpu_count"], int) else None
    for f in capacity.check_instances(described, v["pdnode_gpu_model"], found[0], found[1], count):
        (c.error if f.severity == "error" else c.warn)(f.rule_id, f.field, f.value, f.rule, f.fix)


def _check_router(c: _Checker, v: dict[str, Any], allow: set[str]) -> None:
    package = v["pdnode_router_package"]
    if package not in ROUTER_PACKAGES:
        c.error("router-package-known", "pdnode_router_package", package, "is not a router package pdnode starts",
                f"use one of {', '.join(ROUTER_PACKAGES)}")
        package = "sglang-router"
    if v["pdnode_router_policy"] is None:
        v["pdnode_router_policy"] = ROUTER_DEFAULT_POLICY[package]
    choices = max((len(v[f"pdnode_{role}_instances"]) for role in ("prefill", "decode")
                   if isinstance(v[f"pdnode_{role}_instances"], list)), default=1)
    if package == "smg" and v["pdnode_router_policy"] == "cache_aware" and choices > 1:
        # measured (docs/smg.md): smg 1.13 retries on the same dead prefill and charges the
        # decode's breaker too; 2P1D answered 503 for 180 s, until its health checks dropped it.
        # No smg setting was measured to prevent it under load (a 1 s / 1-failure health check
        # only races the breaker: docs/smg.md), so the pair is refused, not warned about.
        c.error("router-smg-cache-aware", "pdnode_router_policy", "cache_aware",
                "with smg 1.13 and several prefills or decodes, one dead instance fails requests and can take "
                "the node down for minutes (retries stay on the dead prefill and open the decode's breaker: "
                "180 s measured, docs/smg.md)",
                "use power_of_two (or unset it; round_robin also lost 0 requests), or pdnode_router_package: "
                "sglang-router")
    if v["pdnode_router_policy"] is not None and v["pdnode_router_policy"] not in ROUTER_POLICIES:
        c.error("router-policy-known",
                "pdnode_router_policy", v["pdnode_router_policy"], "not a PD routing policy pdnode offers",
                f"use one of {', '.join(ROUTER_POLICIES)}")
    router_extra = v["pdnode_router_extra_args"] if isinstance(v["pdnode_router_extra_args"], dict) else {}
    for key, value in router_extra.items():
        if key == "dp_aware":
            c.error("router-dp-aware-broken",
                    "pdnode_router_extra_args.dp_aware", value, "is broken in PD mode in sglang-router 0.3.2",
                    "remove it")
        elif key in OWNED_ROUTER_ARGS:
            c.error("router-arg-owned",
                    f"pdnode_router_extra_args.{key}", value, f"is set by the plan from {OWNED_ROUTER_ARGS[key]}",
                    "remove it from pdnode_router_extra_args")
        elif key in argtable.load(argtable.ROUTER_TABLES[package]) and guards.router_door(c.error, c.warn, allow,
                                                                                           key, value):
            continue  # an argument of the package that opens a door: refused (one line per cause)
        else:
            values.check_router_arg(c.error, key, value, package)  # known name, type, choices, secrets
    metrics_host = v["pdnode_router_metrics_host"]
    if isinstance(metrics_host, str) and not _is_loopback(metrics_host):
        c.warn("router-metrics-loopback",
               "pdnode_router_metrics_host", metrics_host, "router metrics are reachable beyond this host",
               "bind them to 127.0.0.1 unless a remote Prometheus scrapes them")


def _server_args(v: dict[str, Any], inst: Instance, bootstrap_port: int, ib_map: dict[int, str],
                 layout: cluster.Layout) -> dict[str, Any]:
    # One host: loopback. Several: the host's address, which its peers reach (the
    # firewall admits only them).
    bind = layout.address(layout.host) if layout.multi_host else v["pdnode_worker_host"]
    args: dict[str, Any] = {
        "model_path": v["pdnode_model_path"],
        "served_model_name": v["pdnode_model_served_name"],
        "host": bind,
        "port": inst.port,
        "tp_size": inst.tp_size,
        "base_gpu_id": inst.gpus[0],
        "gpu_id_step": inst.gpu_id_step,
        "mem_fraction_static": inst.mem_fraction_static,
        "disaggregation_mode": inst.role,
        "disaggregation_transfer_backend": v["pdnode_transfer_backend"],
        # Decode learns each request's prefill bootstrap from the router; its own value
        # is SGLang's fallback only.
        "disaggregation_bootstrap_port": bootstrap_port,
        "enable_metrics": True,
    }
    if inst.nccl_port is not None:
        args["nccl_port"] = inst.nccl_port
    if inst.spans_hosts:
        args["nnodes"] = inst.nnodes
        args["node_rank"] = inst.hosts.index(layout.host)
        args["dist_init_addr"] = f"{_url_host(layout.address(inst.hosts[0]))}:{inst.dist_init_port}"
    if inst.dp_size > 1:
        args["dp_size"] = inst.dp_size
    if inst.attn_dp_size > 1:
        args["attn_dp_size"] = inst.attn_dp_size
    if inst.ep_size is not None and inst.ep_size > 1 and v["pdnode_model_kind"] != "dense":
        args["ep_size"] = inst.ep_size
    if inst.moe_dense_tp_size is not None and v["pdnode_model_kind"] != "dense":
        args["moe_dense_tp_size"] = inst.moe_dense_tp_size
    if inst.enable_dp_lm_head:
        args["enable_dp_lm_head"] = True
    if ib_map:
        # Keys are physical GPU ids: SGLang looks up base_gpu_id + rank * gpu_id_step.
        args["disaggregation_ib_device"] = {str(g): ib_map[g] for g in inst.gpus}
    if v["pdnode_model_load_format"]:
        args["load_format"] = v["pdnode_model_load_format"]
    args.update(disagg.server_args(v))
    args.update(inst.extra_args)
    return args


def _release(v: dict[str, Any]) -> str:
    # One virtualenv per release set: an upgrade installs beside the running one.
    # Every version installed into the venv names it, the CUDA 13 Mooncake build too:
    # otherwise changing that version would install into the running release in place.
    return (f"sglang-{v['pdnode_sglang_version']}" if v["pdnode_engine"] == "sglang" else "sim") + (
        (f"-router-{v['pdnode_sglang_router_version']}" if v["pdnode_router_package"] != "smg"
         else f"-smg-{v['pdnode_smg_version']}") + f"-mooncake-{v['pdnode_mooncake_version']}"
        f"-cu13-{v['pdnode_mooncake_cuda13_version']}")


def router_venv_name(package: str, version: str) -> str:
    """The router's venv directory name: router-smg-1.13.0, router-sglang-router-0.3.2."""
    return f"router-{package}-{version}"


def _kv_path(c: _Checker, v: dict[str, Any], multi_host: bool, ib_map: dict[int, str]) -> dict[str, Any]:
    """The layout's KV path (pdnode.core.plan.kv_path), with the TTFT it adds to the layout's prompt
    size; TCP on real engines is a warning that says what it costs. The engines' environment
    is judged against the path: what the plan says must be what they will do."""
    kv = kv_path.choose(v, multi_host, bool(ib_map))
    env = v["pdnode_engine_environment"]
    judged = kv_path.judge_environment(env, kv["path"], multi_host, ib_map)
    for found in judged:
        where = f"pdnode_engine_environment.{found.variable}"
        if found.verdict == "owned":
            c.error("kv-environment-owned", where, env[found.variable], found.why, found.fix)
        elif found.verdict == "contradicts":
            c.error("kv-environment-contradicts", where, env[found.variable], found.why, found.fix)
        else:
            c.warn("kv-environment-surprising", where, env[found.variable], found.why, found.fix)
    said = {found.variable for found in judged}
    for name, value in env.items():
        if name not in said and environment_types.presence_looks_off(name, value):
            c.warn("environment-presence-switch", f"pdnode_engine_environment.{name}", value,
                   f"{environment_types.TYPES[name].library} tests it for presence only "
                   f"({environment_types.TYPES[name].source}): {str(value)!r} turns it on like any other value",
                   "remove it to turn the switch off, or write 1 to say that it is on")
    per_token, source = kv_path.kv_bytes_per_token(v, REPO_ROOT)
    seconds = kv_path.handoff_seconds(per_token, v["pdnode_kv_prompt_tokens"], kv["gb_s"])
    floor, floor_why = kv_path.floor_gb_s(kv["path"])
    kv.update(bytes_per_token=per_token, bytes_source=source, prompt_tokens=v["pdnode_kv_prompt_tokens"],
              handoff_s=None if seconds is None else round(seconds, 4), floor_gb_s=floor, floor_source=floor_why)
    if kv["path"] == "tcp" and v["pdnode_engine"] == "sglang":
        cost = (f"about {seconds:.2f} s of TTFT for a {v['pdnode_kv_prompt_tokens']}-token prompt "
                f"({per_token} KV bytes per token, {source})" if seconds is not None
                else "an unknown share of TTFT (set pdnode_model_kv_bytes_per_token to see it)")
        c.warn("kv-over-tcp",
               "pdnode_transfer_backend", v["pdnode_transfer_backend"],
               f"KV moves from prefill to decode over TCP at about {kv['gb_s']:g} GB/s: {cost}",
               "map each GPU to an RDMA NIC (pdnode_ib_devices, backend mooncake), or keep prefill and decode on "
               "one host (pdnode_kv_intranode_nvlink: NVLink)")
    return kv


def applied_dir(prefix: str) -> str:
    """The root-only records of a prefix's services: the digests each was last (re)started
    with, and the layout the node runs (pdnode.core.change.identity)."""
    return f"/var/lib/pdnode/applied/{prefix}"


def _derive(v: dict[str, Any], engines: list[Instance], ib_map: dict[int, str], ports: dict[str, int],
            warnings: list[Problem], layout: cluster.Layout, kv: dict[str, Any]) -> Plan:
    host = layout.host
    prefix, config_dir, root = v["pdnode_service_prefix"], v["pdnode_config_dir"], v["pdnode_install_root"]
    venv = f"{root}/venvs/{_release(v)}"
    package = v["pdnode_router_package"]
    router_venv = f"{root}/venvs/{router_venv_name(package, v[ROUTER_PACKAGES[package]])}"
    install = {
        "user": v["pdnode_service_user"], "root": root, "venv": venv, "config_dir": config_dir,
        "engine": v["pdnode_engine"], "prefix": prefix, "target": f"{prefix}.target",
        "python": f"{venv}/bin/python",
        # roles/mooncake installs its transfer check here (_mooncake_check_tool); the verify
        # measures the KV path with it
        "kv_check_tool": f"{venv}/bin/pdnode-mooncake-loopback-check.py",
        "api_key_path": f"{config_dir}/api-key",
        "admin_key_path": f"{config_dir}/router-admin-key",
        # systemd's StateDirectory= of every unit (a name under /var/lib) and the service
        # user's home: both the prefix's, so two prefixes on one host share nothing
        "state_directory": prefix,
        "home": f"/var/lib/{prefix}",
        # root-only records of the digests each service was last (re)started with
        "applied_dir": applied_dir(prefix),
        # the CUDA major of the pinned driver branch (DCGM's package flavor)
        "cuda_major": mooncake_select.branch_cuda_major(v["pdnode_driver_branch"]),
        # what the sglang role pip-installs for the router (sglang_router_requirement)
        "router_package": v["pdnode_router_package"],
        "router_requirement": f"{v['pdnode_router_package']}=={v[ROUTER_PACKAGES[v['pdnode_router_package']]]}",
        # The router runs from a venv of its own, named by its package and version only: a
        # new release that keeps the router's leaves its unit as it is, and the router
        # running (docs/decisions.md, "The router in its own venv").
        "router_venv": router_venv,
        "router_python": f"{router_venv}/bin/python",
    }
    env_common = {"HF_HUB_OFFLINE": "1", **{str(k): str(val) for k, val in v["pdnode_engine_environment"].items()}}
    if layout.multi_host:
        # The address a rank advertises to its peers (bootstrap registration, KV hand-off)
        env_common[kv_path.ADDRESS_VARIABLE] = layout.address(host)
    env_common.update(disagg.environment(v))  # the hand-off's timeouts and heartbeat, explicit
    env_common.update(kv["environment"])  # what the chosen KV path needs in every engine
    if v["pdnode_engine"] == "sim":
        env_common.update({
            "PDNODE_SIM_PREFILL_MS_PER_TOKEN": str(v["pdnode_sim_prefill_ms_per_token"]),
            "PDNODE_SIM_DECODE_MS_PER_TOKEN": str(v["pdnode_sim_decode_ms_per_token"]),
            "PDNODE_SIM_STARTUP_S": str(v["pdnode_sim_startup_s"]),
            "PDNODE_SIM_DECODE_MS_PER_REQUEST": str(v["pdnode_sim_decode_ms_per_request"]),
            "PDNODE_SIM_MAX_RUNNING_PER_RANK": str(v["pdnode_sim_max_running_per_rank"]),
            "PDNODE_SIM_KV_BYTES_PER_TOKEN": str(v["pdnode_sim_kv_bytes_per_token"]),
            # the stand-in paces its hand-off to the path's speed (its bytes cross loopback)
            "PDNODE_SIM_KV_GB_S": str(kv["gb_s"]),
        })
    key = ["--api-key-file", install["api_key_path"]] if v["pdnode_api_key_file"] else []
    # A decode's own bootstrap port is SGLang's fallback only (the router names each request's
    # prefill): a constant, so that which prefill comes first never restarts the decodes.
    decode_bootstrap = BASES[("prefill", "bootstrap_port")][0]
    services: dict[str, dict[str, Any]] = {}
    for inst in engines:
        if host not in inst.hosts:
            continue
        args = _server_args(v, inst, inst.bootstrap_port if inst.role == "prefill" else decode_bootstrap, ib_map,
                            layout)
        args["disaggregation_transfer_backend"] = kv["backend"]  # mooncake under NVLink (pdnode.core.plan.kv_path)
        base = f"http://{_url_host(args['host'])}"
        # Node rank 0 serves the API; a rank >= 1 of an instance spanning hosts serves only
        # SGLang's dummy health server on the same port (200 once its schedulers run).
        serves = args.get("node_rank", 0) == 0
        ready = [f"{base}:{inst.port}/health"]
        svc: dict[str, Any] = {
            "id": inst.id, "role": inst.role, "name": inst.name, "unit": f"{prefix}-{inst.id}.service",
            "host": host, "config": f"{config_dir}/{inst.id}.json", "env_file": f"{config_dir}/{inst.id}.env",
            "args": args, "environment": dict(env_common), "gpus": list(inst.gpus),
            "url": f"{base}:{inst.port}" if serves else None,
        }
        if inst.role == "prefill" and serves:
            # The bootstrap server answers /route once every prefill rank registered.
            ready.append(f"{base}:{inst.bootstrap_port}/route?prefill_dp_rank=-1"
                         "&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")
        if inst.role == "prefill":
            svc["bootstrap_port"] = inst.bootstrap_port
        svc["ready"] = ready
        # --watchdog-url: the launcher's sidecar feeds systemd's watchdog from /health
        # (only when the unit sets WatchdogSec=).
        svc["exec"] = [install["python"], "-m", "pdnode.node.launcher", "--engine", install["engine"],
                       "--watchdog-url", ready[0], svc["config"], *key]
        services[inst.id] = svc
    _couple(services, env_common, coupled=not layout.multi_host)
    everywhere = _cluster(v, engines, layout)
    everywhere["kv"] = kv = {k: val for k, val in kv.items() if k != "environment"}
    # The link measured on the host by the verify (real engines; a layout on one host: the
    # check's two processes run on one host): one check per prefill GPU -> decode GPU.
    everywhere["kv"]["checks"] = kv_path.link_checks(
        kv["path"], [(p.id, p.gpus[0], d.id, d.gpus[0]) for p in engines if p.role == "prefill"
                     for d in engines if d.role == "decode"], ib_map) \
        if v["pdnode_engine"] == "sglang" and not layout.multi_host else []
    everywhere["kv"]["floor_from_path"] = (v["pdnode_engine"] == "sglang"
                                           and "kv_transfer_speed_min_gb_s" not in v["pdnode_verify_thresholds"])
    if layout.router_host == host:
        services["router"] = _router_service(v, everywhere, install, key, layout)
    return Plan(host=host, install=install, services=services, ports=ports, settings=_settings(v, engines, layout.multi_host, kv),
                cluster=everywhere, firewall=cluster.firewall(layout, services, ports, env_common), warnings=warnings)


def _change(v: dict[str, Any], engines: list[Instance], recorded: identity.Record | None,
            notes: list[str], plan: Plan, model: dict[str, Any], started: Mapping[str, float],
            processes: Mapping[str, Mapping[str, str | None]],
            strangers: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """The change from what the node runs (RECORDED) to this layout:
    - its steps in order (pdnode.core.change.identity, layout_change); a new release or
      model commit restarts every instance that stays (PROCESSES, else the record, say
      what runs now);
    - the windows of the steps that leave a role at zero (pdnode.core.change.window, from
      the node's measured starts, STARTED), and the roles the hosts' steps, taken side by
      side, may leave at zero;
    - the running instances it stops, and the record the deploy writes (with where the
      change started until its steps are done) and its converged form;
    - the ``refusal``, one line or None (_change_refusal): deploy.yml and upgrade.yml
      assert it before anything changes; the playbooks that change no layout plan anyway."""
    runs = {"python": plan.install["python"], "model_commit": plan.model.get("commit")}
    running = recorded.running if recorded is not None else None
    reserved = {e.id: reserved_ports(e) for e in engines}
    record = identity.record(engines, plan.cluster["engines"], reserved, runs)
    doc: dict[str, Any] = {"by": "index" if running is None else "record", "notes": notes, "record": record,
                           "converged": record, "record_file": f"{plan.install['applied_dir']}/{identity.RECORD_FILE}",
                           "steps": [], "windows": [], "side_by_side": [], "stops": {}, "strangers": {},
                           "refusal": None, "refusal_one_host_at_a_time": None}
    restarting = identity.runs_changed(running, engines, runs, processes)
    found = identity.change(running, engines, restarting)
    if found is None or recorded is None:
        return doc
    _, steps = found
    if steps.steps:
        # Until its steps are done, the record says where the change started: a rerun
        # after an interruption takes them again (pd_services writes ``converged`` after).
        doc["record"] = identity.record(engines, plan.cluster["engines"], reserved, runs, recorded.running_doc)
    by_id = {e.id: e for e in engines}
    units = {iid: e["unit"] for iid, e in plan.cluster["engines"].items()}

    def measured(iid: str) -> tuple[float, str] | None:
        """The node's own start time for IID: its unit's last, else its role's slowest."""
        if units[iid] in started and iid in running:
            return started[units[iid]], f"{units[iid]} started in {started[units[iid]]:.1f} s"
        role = [(started[r.unit], r.unit) for r in running.values() if r.role == by_id[iid].role and r.unit in started]
        if role:
            seconds, unit = max(role)
            return seconds, f"its role's slowest start, {unit} in {seconds:.1f} s"
        return None

    def estimate(iid: str) -> tuple[float | None, str]:
        e = by_id[iid]
        return window.start_estimate(v, model, len(e.gpus) * e.nnodes, measured(iid))

    # One of several prefills that ran before under its name waits until every decode has
    # dropped it (the deploy's hold: restart_delay_s) before it starts.
    delay = next((s["restart_delay_s"] for s in plan.services.values() if s.get("restart_delay_s")), 0) or 0

    def hold(a: Any) -> float:
        return float(delay) if a.role == "prefill" and a.new in running else 0.0

    def label(a: Any) -> str:
        why = restarting.get(a.new) if a.kind == "restart" else None
        return f"{a.label} ({why})" if why else a.label

    doc["steps"] = [{"kind": s.action.kind, "role": s.action.role, "id": s.action.new or s.action.old,
                     "was": s.action.old, "label": label(s.action), "serving": s.serving, "at_zero": list(s.at_zero),
                     "hosts": sorted({h for h, _ in running[s.action.old].gpus}) if s.action.kind == "stop"
                     else list(by_id[s.action.new].hosts)}
                    for s in steps.steps]
    doc["windows"] = window.windows(steps, estimate, window.stop_seconds(v["pdnode_router_package"]), hold)
    # Each host's handlers take its own steps, the hosts side by side: a role the plan's
    # order keeps serving may still reach zero when the steps of several hosts interleave.
    def host_of(a: Any) -> str:
        return running[a.old].gpus[0][0] if a.kind == "stop" else by_id[a.new].hosts[0]

    if len({host_of(s.action) for s in steps.steps}) > 1:
        worst = lc.side_by_side(steps, host_of)
        zero = {w["role"] for w in doc["windows"]}
        doc["side_by_side"] = [r for r in lc.ROLES if steps.start[r] > 0 and worst[r] <= 0 and r not in zero]
    doc["stops"] = {s.action.old: {"unit": running[s.action.old].unit,
                                   "hosts": sorted({h for h, _ in running[s.action.old].gpus}),
                                   "worker": running[s.action.old].worker}
                    for s in steps.steps if s.action.kind == "stop"}
    known = recorded.units | {e["unit"] for e in plan.cluster["engines"].values()}
    engine_unit = re.compile(f"{re.escape(v['pdnode_service_prefix'])}-{ENGINE_UNIT}")
    doc["strangers"] = {h: sorted(u for u in units_there if engine_unit.fullmatch(u) and u not in known)
                        for h, units_there in sorted(strangers.items())}
    doc["strangers"] = {h: us for h, us in doc["strangers"].items() if us}
    doc["refusal"] = _change_refusal(v, doc, recorded, restarting, side_by_side=True)
    # upgrade.yml switches one host at a time (serial: 1): the hosts' steps do not overlap
    doc["refusal_one_host_at_a_time"] = _change_refusal(v, doc, recorded, restarting, side_by_side=False)
    return doc


def _change_refusal(v: dict[str, Any], doc: dict[str, Any], recorded: identity.Record,
                    restarting: Mapping[str, str], side_by_side: bool) -> str | None:
    """The first reason the deploy does not start the change (deploy.yml and upgrade.yml
    assert it; SIDE_BY_SIDE: the hosts take their steps at once, as deploy.yml's do), in one line: engine units the plan cannot place, an unfinished change to
    another layout, a step that leaves a role with no instance serving (unless accepted)."""
    record_file = doc["record_file"]
    for host, units in doc["strangers"].items():
        return str(Problem(
            "layout-record-names-what-runs", "pdnode_service_prefix", ", ".join(units),
            f"{host} runs {len(units)} engine unit(s) of the prefix that neither its record of the layout ({record_file}) "
            "nor this inventory names (started by hand, or by a deploy of another inventory with the same prefix); the "
            "deploy does not stop what it did not start; nothing was stopped",
            f"stop and disable them on {host} (systemctl disable --now {units[0]}), or deploy the inventory that runs "
            f"them; or remove {record_file} (the deploy then stops every engine unit of the prefix it does not plan)"))
    if recorded.before is not None and doc["record"]["engines"] != recorded.doc["engines"]:
        was = ", ".join(sorted(recorded.engines))
        return str(Problem(
            "layout-change-finishes-first", "pdnode_prefill_instances", was,
            f"an earlier deploy was interrupted while it changed the node to the layout of {was} (its record "
            f"{record_file} still names the layout it started from): the node may run parts of both; nothing was "
            "stopped", "finish that change first (run the deploy again with the inventory it had), then deploy "
            f"this one; or remove {record_file} (the deploy then names instances by their index)"))
    if side_by_side and doc["side_by_side"] and not doc["windows"] and not v["pdnode_allow_unavailable"]:
        role = doc["side_by_side"][0]
        hosts = sorted({h for step in doc["steps"] for h in step["hosts"]})
        return str(Problem(
            "layout-change-keeps-serving", f"pdnode_{role}_instances", ", ".join(hosts),
            f"the steps of this change run on {' and '.join(hosts)} side by side (each host's deploy takes its own "
            f"steps in order, not the layout's order across hosts): a {role} may have none serving while one host "
            "stops its last before another has started one; nothing was stopped",
            "change one host at a time (first an inventory that only adds the new instances, then the one that "
            f"removes the old), or accept the window with -e '{change_cost.ACCEPT_WINDOW}' (`pdnode diff INVENTORY` "
            "shows the steps)"))
    if doc["windows"] and not v["pdnode_allow_unavailable"]:
        w = min(doc["windows"], key=lambda w: w["steps"][0])  # the first step that leaves a role at zero
        first = doc["steps"][w["steps"][0] - 1]
        secs = f"about {w['expected_s']:.0f} s" if w["expected_s"] is not None else "a window of unknown length"
        return str(Problem(
            "layout-change-keeps-serving", f"pdnode_{w['role']}_instances", first["id"],
            f"no order of this change keeps a {w['role']} serving: step {w['steps'][0]} ({first['label']}) "
            f"leaves none for {secs} ({w['source']}); nothing was stopped",
            (f"add a second {w['role']} (GPUs for it: one serves while the other restarts)"
             if first["kind"] == "restart" and first["id"] in restarting else
             f"keep one {w['role']} on the GPUs and keys it runs with (or name it), add one the running ones "
             "leave room for")
            + f", or accept the window with -e '{change_cost.ACCEPT_WINDOW}' (`pdnode diff INVENTORY` shows the steps)"))
    return None


def _cluster(v: dict[str, Any], engines: list[Instance], layout: cluster.Layout) -> dict[str, Any]:
    """Every host of the layout and every engine instance (where it serves HTTP: its
    first host), as the router and the verifier on any host see them."""
    def url(inst: Instance) -> str:
        where = layout.address(inst.hosts[0]) if layout.multi_host else v["pdnode_worker_host"]
        return f"http://{_url_host(where)}:{inst.port}"

    instances: dict[str, dict[str, Any]] = {}
    for inst in engines:
        entry: dict[str, Any] = {"id": inst.id, "role": inst.role, "hosts": list(inst.hosts),
                                 "address": layout.address(inst.hosts[0]), "url": url(inst),
                                 "unit": f"{v['pdnode_service_prefix']}-{inst.id}.service"}
        if inst.role == "prefill":
            entry["bootstrap_port"] = inst.bootstrap_port
        instances[inst.id] = entry
    router_address = layout.address(layout.router_host) if layout.multi_host else v["pdnode_router_host"]
    return {
        "multi_host": layout.multi_host,
        "hosts": {h: {"address": a, "services": [i.id for i in engines if h in i.hosts]
                      + (["router"] if h == layout.router_host else [])} for h, a in layout.hosts.items()},
        "router": {"host": layout.router_host, "url": f"http://{_url_host(router_address)}:{v['pdnode_router_port']}"},
        "engines": instances,
    }


def _couple(services: dict[str, dict[str, Any]], environment: dict[str, str], coupled: bool) -> None:
    """Which engine units go down and up together (docs/decisions.md, "Restart coupling").

    With one prefill, the node cannot serve while it is down, so its decodes go down and
    come back with it (a clean pairing costs no availability). With several prefills a
    decode is bound to none: a dead prefill must not take the decodes (and with them
    the other prefills' traffic) down. But a decode keeps a prefill's bootstrap and rank
    state until its heartbeats to that prefill fail; a prefill back sooner than that
    meets a decode holding its old ranks, and every hand-off between them fails (measured
    on the demo node). So with several prefills a prefill stays down, after a crash or
    for a planned restart, until every decode has dropped it: ``restart_delay_s``."""
    prefills = [s for s in services.values() if s["role"] == "prefill"]
    decodes = [s for s in services.values() if s["role"] == "decode"]
    for s in services.values():
        s["bound_to"], s["upholds"], s["restart_delay_s"] = None, [], None
    if len(prefills) == 1 and coupled:
        prefills[0]["upholds"] = [d["unit"] for d in decodes]
        for d in decodes:
            d["bound_to"] = prefills[0]["unit"]
        return
    for p in prefills:
        p["restart_delay_s"] = heartbeat_detection_s(environment)


# The time one round of a decode's heartbeat checks takes beyond its interval: each check
# of a stopped prefill is a refused connection (milliseconds); one second covers the
# checks of the other, live prefills and the thread's scheduling.
HEARTBEAT_SLACK_S = 1.0


def heartbeat_detection_s(environment: dict[str, str]) -> int:
    """Seconds after which every decode has dropped a stopped prefill (docs/decisions.md,
    "When a decode drops a stopped prefill"): SGLang 0.5.23's decode checks each prefill
    it knows every SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL (default 5 s, at least 2) and
    drops it at the ..._HEARTBEAT_MAX_FAILURE-th failed check in a row (default 2, at
    least 1): at most interval x failures after the stop, plus the checks' own time (a
    refused connection fails at once; HEARTBEAT_SLACK_S covers scheduling), rounded up."""
    def number(name: str, default: float, floor: float) -> float:
        try:
            return max(floor, float(environment.get(name, default)))
        except ValueError:
            return default
    interval = number("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0, 2.0)
    failures = number("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2.0, 1.0)
    return int(-(-(interval * int(failures) + HEARTBEAT_SLACK_S) // 1))


def _router_service(v: dict[str, Any], everywhere: dict[str, Any], install: dict[str, str],
                    key: list[str], layout: cluster.Layout) -> dict[str, Any]:
    engines: dict[str, dict[str, Any]] = everywhere["engines"]
    router: dict[str, Any] = {
        "pd_disaggregation": True,
        "prefill": [[e["url"], e["bootstrap_port"]] for e in engines.values() if e["role"] == "prefill"],
        "decode": [e["url"] for e in engines.values() if e["role"] == "decode"],
        "host": v["pdnode_router_host"],
        "port": v["pdnode_router_port"],
        "prometheus_host": v["pdnode_router_metrics_host"],
        "prometheus_port": v["pdnode_router_metrics_port"],
        "policy": v["pdnode_router_policy"],
        "worker_startup_timeout_secs": v["pdnode_router_worker_startup_timeout_s"],
        "cb_timeout_duration_secs": v["pdnode_router_circuit_open_s"],
    }
    if install["router_package"] == "smg":
        # smg colours its log even into a pipe; journald would keep every line as a blob
        router["log_json"] = True
    router.update(v["pdnode_router_extra_args"])
    cfg = install["config_dir"]
    url = f"http://{_url_host(str(router['host']))}:{router['port']}"
    return {
        "id": "router", "role": "router", "name": "router", "unit": f"{install['prefix']}-router.service",
        "host": layout.host, "config": f"{cfg}/router.json", "env_file": f"{cfg}/router.env", "args": router,
        "environment": {"HF_HUB_OFFLINE": "1"}, "gpus": [], "url": url,
        "metrics_url": f"http://{_url_host(str(router['prometheus_host']))}:{router['prometheus_port']}/metrics",
        # The router's worker-management API needs the admin key, always (clients hold
        # only the API key, if any).
        "exec": [install["router_python"], "-m", "pdnode.node.router_launch", f"{cfg}/router.json",
                 "--router-package", install["router_package"],
                 "--admin-key-file", install["admin_key_path"], *key],
        # /readiness turns 200 once a prefill and a decode are registered; gate there.
        "ready": [f"{url}/readiness"],
        # Whenever the router starts (a reboot, a crash, a restart) its worker list is made
        # the plan's once it is ready: a planned worker it lacks is put back when its engine
        # answers (smg#752: workers gone after a reboot). The spec names key files, never
        # keys; the deploy's own reconcile reads the same spec (pd_services).
        "reconcile_spec_file": f"{cfg}/router-workers.json",
        "reconcile_spec": {
            "router": everywhere["router"]["url"], "admin_key_file": install["admin_key_path"],
            "api_key_file": install["api_key_path"] if key else None,
            "timeout_s": v["pdnode_drain_timeout_s"], "workers": list(engines.values())},
        "post_start": [install["router_python"], "-m", "pdnode.node.drain", "reconcile",
                       "--spec", f"{cfg}/router-workers.json"],
        # Arguments a running router takes through its admin API (the deploy's pdnode.node.drain
        # adds and removes workers): a change of only these restarts nothing
        # (docs/decisions.md, "The router's worker list changes without a restart").
        "live_args": ["prefill", "decode"],
        "bound_to": None, "upholds": [], "restart_delay_s": None,
        **({"pair_probe": _pair_probe(v, install, engines, key)} if v["pdnode_pair_probe_interval_s"] else {}),
    }


# Each probe waits this long for a pair at most (a one-token request: milliseconds on a
# working pair; long enough that a queue behind heavy load is not taken for a broken pair,
# which the TTFT alerts name instead). The timer starts the next run this long after the
# last one ended, so runs never overlap.
PAIR_PROBE_TIMEOUT_S = 60
PAIR_PROBE_MIN_INTERVAL_S = 30


def _pair_probe(v: dict[str, Any], install: dict[str, str], engines: dict[str, dict[str, Any]],
                key: list[str]) -> dict[str, Any]:
    """The per-pair probe (pdnode.node.pair_probe) the router's host runs on a timer: no
    metric of SGLang or the router names a failing prefill-decode pair (field failure 4,
    sglang#13054). Its spec names the key file, never the key."""
    prefix, cfg = install["prefix"], install["config_dir"]
    spec_file = f"{cfg}/pair-probe.json"
    # where it writes its metrics and the host's node exporter reads them (its textfile
    # collector): the probe unit's StateDirectory=, readable by the exporter's user
    textfile_dir = f"/var/lib/{prefix}-metrics"
    return {
        "service": f"{prefix}-pair-probe.service", "timer": f"{prefix}-pair-probe.timer",
        "interval_s": v["pdnode_pair_probe_interval_s"], "textfile_dir": textfile_dir,
        "spec_file": spec_file,
        "spec": {"engines": [{k: e[k] for k in ("id", "role", "url", "bootstrap_port") if k in e}
                             for e in engines.values()],
                 "api_key_file": install["api_key_path"] if key else None, "timeout_s": PAIR_PROBE_TIMEOUT_S,
                 "out": f"{textfile_dir}/pairs.prom"},
        "exec": [install["router_python"], "-m", "pdnode.node.pair_probe", "--spec", spec_file],
    }


def _settings(v: dict[str, Any], engines: list[Instance], multi_host: bool, kv: dict[str, Any]) -> dict[str, Any]:
    """The validated values, instances normalised (every key filled, ports allocated;
    where they run only when the layout spans hosts). Real engines' KV-speed floor, when
    the inventory sets none, is the path's (pdnode.core.plan.kv_path.floor_gb_s): the verify and the
    alert rules read it from here."""
    out = dict(v)
    if kv["floor_from_path"]:
        out["pdnode_verify_thresholds"] = {**v["pdnode_verify_thresholds"], "kv_transfer_speed_min_gb_s": kv["floor_gb_s"]}
    keys = ("name", "gpus", "tp_size", "dp_size", "attn_dp_size", "ep_size", "moe_dense_tp_size", "enable_dp_lm_head",
            "port", "bootstrap_port", "nccl_port", "mem_fraction_static", "extra_args")
    keys += ("hosts", "dist_init_port") if multi_host else ()
    for role in ("prefill", "decode"):
        out[f"pdnode_{role}_instances"] = [
            {k: (getattr(i, k) if k not in ("extra_args", "hosts") else type(getattr(i, k))(getattr(i, k)))
             for k in keys if k != "bootstrap_port" or role == "prefill"}
            for i in engines if i.role == role]
    return out


def _url_host(host: str) -> str:
    """A bind address as a client reaches it: a wildcard is reached on loopback (the
    gate runs on the node itself), IPv6 goes in brackets."""
    if host == "0.0.0.0":  # noqa: S104 - a bind address read, not bound here
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
