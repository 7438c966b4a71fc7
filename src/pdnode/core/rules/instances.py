"""The engine instances of a node: ``pdnode_prefill_instances`` / ``pdnode_decode_instances``.

Each entry is a mapping of ``fields.INSTANCE_KEYS``. This module reads the entries into
:class:`Instance` values and applies every rule that concerns one instance (or two
instances sharing GPUs), aligned with what SGLang 0.5.23 itself accepts. Problems are
reported through the plan's checker, one line per cause, naming
``pdnode_<role>_instances[i].<key>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import values
from ..inventory.fields import INSTANCE_KEYS, INSTANCE_KEYS_BY_NAME, REQUIRED, RETIRED_ROLE_VARIABLES

ROLES = ("prefill", "decode")
NAME_RE = re.compile(r"^[a-z0-9]{1,12}$")
REMOVED_SERVER_ARGS = {  # removed from SGLang in 2026-03: unknown flags since
    "disaggregation_decode_tp": "decode's TP is its own tp_size: set tp_size on the decode instance",
    "disaggregation_decode_dp": "decode's DP is its own attn_dp_size: set attn_dp_size on the decode instance",
    "disaggregation_prefill_pp": "set pipeline parallelism on the prefill instance itself (pp_size)",
}
# ServerArgs fields the plan derives; extra_args may not override them.
OWNED_SERVER_ARGS = {
    "model_path": "pdnode_model_path", "served_model_name": "pdnode_model_served_name",
    "host": "pdnode_worker_host (one host) or pdnode_node_address (several)", "port": "the instance's port",
    "nnodes": "the instance's hosts", "node_rank": "the instance's hosts (their order)",
    "dist_init_addr": "the instance's first host and dist_init_port", "tp_size": "the instance's tp_size",
    "dp_size": "the instance's dp_size", "attn_dp_size": "the instance's attn_dp_size",
    "ep_size": "the instance's ep_size", "moe_dense_tp_size": "the instance's moe_dense_tp_size",
    "enable_dp_lm_head": "the instance's enable_dp_lm_head", "base_gpu_id": "the instance's gpus",
    "gpu_id_step": "the instance's gpus (their spacing)", "disaggregation_mode": "(fixed by the role)",
    "disaggregation_transfer_backend": "pdnode_transfer_backend",
    "disaggregation_bootstrap_port": "the prefill instance's bootstrap_port",
    "disaggregation_ib_device": "pdnode_ib_devices", "nccl_port": "the instance's nccl_port",
    "mem_fraction_static": "the instance's mem_fraction_static", "enable_metrics": "(always on)",
    "load_format": "pdnode_model_load_format", "api_key": "(a secret file, never a variable)",
}
# MoE all-to-all backends for which SGLang 0.5.23 sets ep_size = tp_size itself
# (arg_groups/overrides.py, _A2A_EP_SPANNING_BACKENDS); "none" and "ascend_tp" keep ep_size.
A2A_EP_IS_TP = frozenset({"deepep", "deepep_v2", "megamoe", "mooncake", "nixl", "ascend_fuseep", "flashinfer",
                          "flashinfer_megamoe", "mori", "pplx"})
_KIND_OK = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "int_or_none": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str) and v != "",
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "int_list": lambda v: isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
    "str_list": lambda v: isinstance(v, list) and all(isinstance(i, str) and i != "" for i in v),
}
_KIND_WORDS = {"int": "an integer", "int_or_none": "an integer or null", "float": "a number",
               "str": "a non-empty string", "bool": "true or false", "dict": "a mapping",
               "int_list": "a list of integers", "str_list": "a list of inventory host names"}


def format_ids(ids: Iterable[int]) -> str:
    """{0, 1, 2, 3, 7} -> '0-3,7' (the format of CPUAffinity= and of nvidia-smi)."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def gpus_text(ids: list[int]) -> str:
    """GPU ids as people read them, '-' for none (every command's tables and runbooks)."""
    return format_ids(ids) if ids else "-"


@dataclass
class Instance:
    role: str
    index: int
    name: str
    gpus: list[int]
    tp_size: int
    dp_size: int
    attn_dp_size: int
    ep_size: int | None
    moe_dense_tp_size: int | None
    enable_dp_lm_head: bool
    port: int | None
    bootstrap_port: int | None
    nccl_port: int | None
    mem_fraction_static: float
    extra_args: dict[str, Any] = field(default_factory=dict)
    # Inventory hosts, in node-rank order; empty until the plan places it (pdnode.core.plan.cluster).
    hosts: list[str] = field(default_factory=list)
    dist_init_port: int | None = None
    reported: set[str] = field(default_factory=set)  # keys already reported as missing or mistyped
    named: bool = False  # the inventory gave its name (else its index names it)
    # named after the running instance it is (pdnode.core.change.identity.adopt)
    adopted: bool = False

    @property
    def id(self) -> str:
        return f"{self.role}-{self.name}"

    @property
    def field(self) -> str:
        return f"pdnode_{self.role}_instances[{self.index}]"

    @property
    def nnodes(self) -> int:
        return max(1, len(self.hosts))

    @property
    def spans_hosts(self) -> bool:
        return len(self.hosts) > 1

    @property
    def gpu_id_step(self) -> int:
        return self.gpus[1] - self.gpus[0] if len(self.gpus) > 1 else 1


def _flow(value: Any) -> str:
    """A value as YAML flow text, for migration hints."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return str(value)


def check_retired(c: Any) -> None:
    """The one-instance variables of earlier releases: one line with the replacement."""
    found = [n for n in RETIRED_ROLE_VARIABLES if n in c.raw]
    if not found:
        return
    parts = []
    for role in ROLES:
        keys = {RETIRED_ROLE_VARIABLES[n]: c.raw[n] for n in found if n.startswith(f"pdnode_{role}_")}
        if keys:
            parts.append(f"pdnode_{role}_instances: [{_flow(keys)}]")
    c.error("variable-retired", found[0], c.raw[found[0]],
            f"the one-instance variables ({', '.join(found)}) were replaced by a list of instances per role "
            "(one spelling for one fact; docs/inventory.md)",
            "write " + " and ".join(parts) + " and remove the old variables")


def _typed(c: Any, where: str, key: str, entry: dict[str, Any], role: str) -> Any:
    spec = INSTANCE_KEYS_BY_NAME[key]
    if key not in entry or (entry[key] is None and spec.kind != "int_or_none"):
        if spec.default is REQUIRED:
            c.error("instance-key-required",
                    f"{where}.{key}", None, "is required and not set", f"set {key} ({spec.doc})")
        return None if spec.default is REQUIRED else spec.default
    value = entry[key]
    if isinstance(value, str) and "{{" in value:
        c.error("value-templated",
                f"{where}.{key}", value, "templated values are not supported in the node description",
                "write the literal value; the plan is computed without Ansible")
        return None
    if not _KIND_OK[spec.kind](value):
        c.error("instance-key-type",
                f"{where}.{key}", value, f"must be {_KIND_WORDS[spec.kind]}", f"write {key} as {_KIND_WORDS[spec.kind]}")
        return None
    return float(value) if spec.kind == "float" else value


def read(c: Any, role: str, entries: Any) -> list[Instance]:
    """Entries of one role -> instances (None fields where a value was wrong)."""
    name = f"pdnode_{role}_instances"
    if not isinstance(entries, list):
        return []
    if not entries:
        c.error("instances-not-empty", name, entries, f"is empty: a PD node needs at least one {role} instance",
                f"list one, e.g. {name}: [{{gpus: [0, 1, 2, 3]}}]")
        return []
    out: list[Instance] = []
    for i, entry in enumerate(entries):
        where = f"{name}[{i}]"
        if not isinstance(entry, dict):
            c.error("instance-mapping",
                    where, entry, "must be a mapping of instance keys", "write e.g. {gpus: [0, 1, 2, 3], tp_size: 4}")
            continue
        for key in entry:
            spec = INSTANCE_KEYS_BY_NAME.get(key)
            if spec is None or role not in spec.roles:
                known = ", ".join(k.name for k in INSTANCE_KEYS if role in k.roles)
                c.error("instance-key-unknown",
                        f"{where}.{key}", entry[key], f"is not a key of a {role} instance", f"use one of {known}")
        got: dict[str, Any] = {}
        reported = set()
        for k in INSTANCE_KEYS:
            if role in k.roles:
                before = len(c.problems)
                got[k.name] = _typed(c, where, k.name, entry, role)
                if len(c.problems) > before:
                    reported.add(k.name)
        inst_name = got["name"] if got["name"] is not None else str(i)
        if not NAME_RE.match(str(inst_name)):
            c.error("instance-name-pattern",
                    f"{where}.name", inst_name, "must be 1-12 characters a-z 0-9 (it names the unit and its files)",
                    "use e.g. a, b or 0")
        out.append(Instance(
            role=role, index=i, name=str(inst_name), gpus=got["gpus"] or [],
            tp_size=got["tp_size"], dp_size=got["dp_size"], attn_dp_size=got["attn_dp_size"],
            ep_size=got["ep_size"], moe_dense_tp_size=got["moe_dense_tp_size"],
            enable_dp_lm_head=got["enable_dp_lm_head"], port=got["port"], bootstrap_port=got.get("bootstrap_port"),
            nccl_port=got["nccl_port"], mem_fraction_static=got["mem_fraction_static"],
            extra_args=got["extra_args"] if isinstance(got["extra_args"], dict) else {}, reported=reported,
            hosts=list(got["hosts"] or []), dist_init_port=got["dist_init_port"], named=got["name"] is not None,
        ))
    names = [i.name for i in out]
    for inst in out:
        if names.count(inst.name) > 1 and names.index(inst.name) != out.index(inst):
            c.error("instance-name-unique",
                    f"{inst.field}.name", inst.name, f"two {role} instances are named {inst.name!r}",
                    "give each instance its own name")
    return out


def check(c: Any, inst: Instance, gpu_count: Any, kind: Any, known: frozenset[str]) -> None:
    """Every rule about one instance."""
    f = inst.field
    _check_sizes(c, inst)
    _check_gpus(c, inst, gpu_count)
    if isinstance(inst.mem_fraction_static, float) and not 0 < inst.mem_fraction_static < 1:
        c.error("mem-fraction-range",
                f"{f}.mem_fraction_static", inst.mem_fraction_static, "must be between 0 and 1", "use e.g. 0.85")
    _check_moe(c, inst, kind)
    _check_extra(c, inst, known)
    if inst.role == "prefill" and isinstance(inst.attn_dp_size, int) and inst.attn_dp_size > 1:
        c.warn("prefill-attn-dp", f"{f}.attn_dp_size", inst.attn_dp_size,
               "DP attention on prefill makes each GPU attend one request: TTFT gets several times worse",
               "use plain TP on prefill (attn_dp_size 1)")


def _check_sizes(c: Any, inst: Instance) -> None:
    """tp_size / dp_size / attn_dp_size. A rule that fails here sets the value to None,
    so the GPU-count rule does not report the same cause a second time."""
    f = inst.field
    for key in ("dp_size", "attn_dp_size"):
        value = getattr(inst, key)
        if isinstance(value, int) and value < 1:
            c.error("size-at-least-1", f"{f}.{key}", value, "must be at least 1", "use 1 to turn it off")
            setattr(inst, key, None)
    n = len(inst.gpus) * inst.nnodes  # an instance spanning hosts uses its gpus on each
    if isinstance(inst.dp_size, int) and inst.dp_size > 1 and isinstance(inst.attn_dp_size, int) \
            and inst.attn_dp_size > 1:
        # SGLang 0.5.23 (handle_data_parallelism): "data-parallel replicas combined with
        # attention data parallelism are not supported" (ValueError)
        c.error("dp-replicas-without-attn-dp",
                f"{f}.dp_size", inst.dp_size, f"DP replicas cannot be combined with DP attention "
                f"(attn_dp_size={inst.attn_dp_size}); SGLang 0.5.23 refuses --dp-size with --attn-dp-size",
                "remove dp_size and list each replica as an instance of its own, or remove attn_dp_size")
        inst.dp_size = None
        return
    if inst.tp_size is None and isinstance(inst.dp_size, int) and inst.dp_size >= 1 and n:
        if n % inst.dp_size:
            c.error("dp-divides-gpus",
                    f"{f}.dp_size", inst.dp_size, f"does not divide the instance's {n} GPUs (each replica has tp_size GPUs)",
                    "list dp_size x tp_size GPUs")
            inst.dp_size = None
            return
        inst.tp_size = n // inst.dp_size
    tp, attn_dp = inst.tp_size, inst.attn_dp_size
    if isinstance(tp, int) and tp < 1:
        c.error("size-at-least-1", f"{f}.tp_size", tp, "must be at least 1", "set the number of GPUs of one replica")
        inst.tp_size = None
        return
    if isinstance(tp, int) and isinstance(attn_dp, int) and tp % attn_dp:
        if n and n % attn_dp == 0 and n != tp:
            # the widely copied "tp 1, dp N" recipe: tp_size is what is wrong
            fix = f"set tp_size: {n} (the instance's GPU count; attention-TP per DP rank is then {n // attn_dp})"
        else:
            good = max(d for d in range(1, tp + 1) if tp % d == 0 and d <= attn_dp)
            fix = f"use an attn_dp_size that divides {tp} (e.g. {good})"
        c.error("tp-divisible-by-attn-dp", f"{f}.tp_size", tp,
                f"is not divisible by attn_dp_size={attn_dp} (SGLang asserts tp_size % attn_dp_size == 0; tp_size "
                "counts ALL GPUs of the instance, attention-TP per DP rank is tp_size/attn_dp_size)", fix)
        inst.tp_size = None
    if isinstance(inst.dp_size, int) and inst.dp_size > 1 and inst.nccl_port is not None:
        # Each replica's scheduler binds the pinned port (PortArgs.init_new per DP rank):
        # the second replica cannot start.
        c.error("nccl-port-not-pinned-with-dp",
                f"{f}.nccl_port", inst.nccl_port, f"cannot be pinned with dp_size={inst.dp_size}: every DP replica "
                "would bind this one port (SGLang's data-parallel controller)",
                "remove nccl_port from this instance; SGLang picks a free port per replica")


def _check_gpus(c: Any, inst: Instance, gpu_count: Any) -> None:
    name, gpus = f"{inst.field}.gpus", inst.gpus
    if not gpus:
        if "gpus" not in inst.reported:
            c.error("gpus-not-empty", name, gpus, "is empty", f"list the physical GPU ids {inst.id} runs on")
        return
    if isinstance(gpu_count, int):
        missing = [g for g in gpus if not 0 <= g < gpu_count]
        if missing:
            c.error("gpus-exist",
                    name, gpus, f"GPU ids {missing} do not exist on a host with pdnode_gpu_count={gpu_count}",
                    f"use ids 0..{gpu_count - 1}")
    step = gpus[1] - gpus[0] if len(gpus) > 1 else 1
    if len(set(gpus)) != len(gpus):
        c.error("gpus-unique", name, gpus, "lists a GPU more than once", "list each GPU once")
        return
    if step < 1 or gpus != [gpus[0] + r * step for r in range(len(gpus))]:
        c.error("gpus-evenly-spaced",
                name, gpus, "must be ascending and evenly spaced (SGLang places rank r on base_gpu_id + r * "
                "gpu_id_step)", f"use e.g. {list(range(min(gpus), min(gpus) + len(gpus)))}")
        return
    tp, dp, nodes = inst.tp_size, inst.dp_size, inst.nnodes
    if isinstance(tp, int) and isinstance(dp, int) and len(gpus) * nodes != tp * dp:
        what = f"tp_size={tp}" + (f" x dp_size={dp} = {tp * dp}" if dp > 1 else "")
        note = (" (with DP attention tp_size is still the instance's total GPU count)"
                if isinstance(inst.attn_dp_size, int) and inst.attn_dp_size > 1 else "")
        has = f"{len(gpus)} GPUs" + (f" on each of {nodes} hosts ({len(gpus) * nodes})" if nodes > 1 else "")
        if (tp * dp) % nodes:
            fix = f"use a tp_size x dp_size that {nodes} hosts share evenly"
        else:
            fix = f"list {tp * dp // nodes} GPUs" + (" per host" if nodes > 1 else "") + f" for {inst.id}"
            if (len(gpus) * nodes) % dp == 0:
                fix += f", or set tp_size: {len(gpus) * nodes // dp}"
        c.error("gpus-match-tp-dp", name, gpus, f"has {has} but {inst.id} runs on {what} GPUs{note}", fix)


def _check_moe(c: Any, inst: Instance, kind: Any) -> None:
    f, tp, ep, dense_tp = inst.field, inst.tp_size, inst.ep_size, inst.moe_dense_tp_size
    a2a = inst.extra_args.get("moe_a2a_backend")
    if isinstance(ep, int):
        if ep < 1:
            c.error("size-at-least-1", f"{f}.ep_size", ep, "must be at least 1", "use 1 for no expert parallelism")
        elif kind == "dense":
            if ep > 1:
                c.warn("dense-ignores-moe",
                       f"{f}.ep_size", ep, "has no effect on a dense model (SGLang ignores it)", "remove it")
        elif isinstance(tp, int) and tp % ep:
            c.error("ep-divides-tp",
                    f"{f}.ep_size", ep, f"does not divide tp_size={tp} (EP is carved out of the TP world)",
                    f"use an ep_size that divides {tp}, e.g. {tp}")
        elif isinstance(tp, int) and a2a in A2A_EP_IS_TP and ep != tp:
            c.error("ep-equals-tp-with-a2a", f"{f}.ep_size", ep,
                    f"must equal tp_size={tp} with moe_a2a_backend={a2a!r}: SGLang 0.5.23 replaces any other "
                    f"ep_size with tp_size for this backend, so {ep} would not take effect",
                    f"leave ep_size out (SGLang sets it to tp_size) or set ep_size: {tp}")
    if dense_tp is not None:
        if kind == "dense":
            c.warn("dense-ignores-moe",
                   f"{f}.moe_dense_tp_size", dense_tp, "has no effect on a dense model (SGLang ignores it)", "remove it")
        elif isinstance(tp, int) and dense_tp not in (1, tp):
            c.error("moe-dense-tp-1-or-tp", f"{f}.moe_dense_tp_size", dense_tp, f"must be unset, 1 or tp_size ({tp})",
                    "use 1 (dense layers data-parallel) or leave it unset")
    if inst.enable_dp_lm_head is True and isinstance(inst.attn_dp_size, int) and inst.attn_dp_size <= 1:
        c.error("dp-lm-head-needs-attn-dp", f"{f}.enable_dp_lm_head", True, "needs DP attention (attn_dp_size > 1)",
                "set attn_dp_size > 1 or set this to false")


def _check_extra(c: Any, inst: Instance, known: frozenset[str]) -> None:
    name = f"{inst.field}.extra_args"
    extra = inst.extra_args
    for key, value in extra.items():
        if key in REMOVED_SERVER_ARGS:
            c.error("extra-arg-removed-flag",
                    f"{name}.{key}", value, "was removed from SGLang in 2026-03 (now an unknown flag)",
                    REMOVED_SERVER_ARGS[key])
        elif key == "enable_dp_attention":
            dp = extra.get("dp_size")
            c.error("extra-arg-deprecated-dp-attention", f"{name}.{key}", value,
                    "is the deprecated DP-attention spelling (--enable-dp-attention --dp-size N; rewritten by SGLang "
                    "to attn_dp_size=N and rejected by its YAML config)",
                    f"remove enable_dp_attention{' and dp_size' if dp is not None else ''} from extra_args and set "
                    f"attn_dp_size: {dp if isinstance(dp, int) else 'N'} on the instance")
        elif key == "dp_size" and "enable_dp_attention" in extra:
            continue  # reported with enable_dp_attention: one cause, one line
        elif key in OWNED_SERVER_ARGS:
            c.error("extra-arg-owned", f"{name}.{key}", value, f"is set by the plan from {OWNED_SERVER_ARGS[key]}",
                    "remove it from extra_args" + (f" and set {key} on the instance" if key in INSTANCE_KEYS_BY_NAME else ""))
        elif key not in known:
            close = [k for k in known if _similar(key, k)]
            hint = f" (did you mean {close[0]}?)" if close else ""
            c.error("extra-arg-unknown", f"{name}.{key}", value, "is not a ServerArgs field of SGLang 0.5.23",
                    f"use a field name from `python -m sglang.launch_server --help` with underscores{hint}")
        else:
            values.check_server_arg(c.error, name, key, value)  # type, choices, secrets


def check_shared_gpus(c: Any, instances: list[Instance]) -> None:
    """No GPU of a host given to two instances (instances on different hosts may both use GPU 0)."""
    owner: dict[tuple[str, int], Instance] = {}
    for inst in instances:
        clash = sorted({(h, g) for h in inst.hosts for g in inst.gpus if (h, g) in owner})
        if clash:
            other = owner[clash[0]]
            on = f" on {clash[0][0]}" if len({h for i in instances for h in i.hosts}) > 1 else ""
            c.error("gpus-not-shared",
                    f"{inst.field}.gpus", inst.gpus,
                    f"GPUs {sorted({g for _, g in clash})}{on} are also used by {other.id} ({other.field})",
                    "give each GPU to one instance")
        for h in inst.hosts:
            for g in inst.gpus:
                owner.setdefault((h, g), inst)


# Disaggregation settings both sides of a hand-off must agree on, with SGLang 0.5.23's
# defaults. One SGLang process cannot see its peers, so this rule is the plan's; the
# fields' help says so (sglang/srt/arg_groups/fields/disagg.py: the allocation policy
# "Set the same policy on both roles", the checksum "Enable on both prefill and decode
# engines"). docs/inventory.md lists the rule.
SAME_ON_EVERY_ENGINE = {
    "disaggregation_decode_allocation_policy": "early",
    "disaggregation_enable_kv_checksum": False,
}


def check_same_disagg_settings(c: Any, instances: list[Instance], defaults: dict[str, Any] | None = None) -> None:
    """Every prefill and decode of the layout ends up with the same value of these: the
    plan's setting (``defaults``), or an instance's extra_args overriding it."""
    for key, default in {**SAME_ON_EVERY_ENGINE, **(defaults or {})}.items():
        seen: dict[Any, Instance] = {}
        for inst in instances:
            value = inst.extra_args.get(key, default)
            if not isinstance(value, (str, bool, int, float, type(None))):
                continue  # a wrong type is reported by the instance's own checks
            seen.setdefault(value, inst)
        if len(seen) > 1:
            (first_value, first), (value, other) = list(seen.items())[:2]
            c.error("disagg-setting-same-everywhere",
                    f"{other.field}.extra_args.{key}", value,
                    f"differs from {first.id} ({first_value!r}{'' if key in first.extra_args else ', the plan setting'}): "
                    "SGLang needs the same value on every prefill and decode of a layout, and one process cannot "
                    "check its peers", f"set {key} to the same value in every instance's extra_args")


# The KV layout a decode checks against its prefill's at run time, when the first request
# arrives (SGLang 0.5.23, srt/disaggregation/common/conn.py, try_ensure_parallel_info:
# "Page size mismatch ... Both servers must use the same --page-size value", "KV cache
# dtype mismatch ... the same --kv-cache-dtype value"): a RuntimeError in the decode then,
# a refusal here before anything starts. The model and the transfer backend cannot
# differ: the plan owns both for every instance (OWNED_SERVER_ARGS).
# With SGLang 0.5.23's defaults: kv_cache_dtype "auto" (srt/arg_groups/fields/model.py);
# page_size None, resolved per engine from its attention backend.
SAME_KV_LAYOUT = {"page_size": None, "kv_cache_dtype": "auto"}


def _first_differing(instances: list[Instance], key: str, default: Any) -> tuple | None:
    """(the first instance, its value, the first instance whose extra_args value of KEY
    differs, that value), or None when all agree or there are none (a missing key counts
    as DEFAULT: an inventory that is refused earlier may reach here with no instances)."""
    if not instances:
        return None
    first = instances[0]
    want = repr(first.extra_args.get(key, default))
    for inst in instances:
        if repr(inst.extra_args.get(key, default)) != want:
            return first, first.extra_args.get(key, default), inst, inst.extra_args.get(key, default)
    return None


def check_same_kv_layout(c: Any, instances: list[Instance]) -> None:
    """Every prefill and decode states the same page_size and kv_cache_dtype, or none
    does (SGLang's default may differ by role: it follows each engine's attention backend)."""
    for key, default in SAME_KV_LAYOUT.items():
        differing = _first_differing(instances, key, default)
        if differing:
            first, first_value, other, value = differing
            shown = "SGLang's default" if first_value is None else repr(first_value)
            c.error("disagg-kv-layout-same", f"{other.field}.extra_args.{key}", value,
                    f"differs from {first.id} ({shown}): "
                    "the decode refuses its prefill's KV at the first request (SGLang 0.5.23, "
                    f"disaggregation/common/conn.py: '{key.replace('_', ' ')} mismatch')",
                    f"set the same {key} in the extra_args of every prefill and decode")


# The longest request each side takes (context_length; None: the model's own, from its
# config.json). Where the two differ, a request between them is admitted by one side and
# refused by the other: a prefill that refuses it (HTTP 400) never sends the KV its
# decode has made room for, and the decode waits until the client gives up (InferenceX
# #2257: `--context-length` given to the prefill only, 33 of 1,000 requests hung for
# 1,800 s); the other way round the decode starts from KV that never came (sglang#30233).
# SGLang 0.5.23's hand-off compares page size, KV dtype and layout, not this
# (disaggregation/common/conn.py), and one process cannot see its peers: the plan's rule.
def check_same_context_length(c: Any, instances: list[Instance]) -> None:
    differing = _first_differing(instances, "context_length", None)
    if differing:
        first, first_value, other, value = differing
        shown = "the model's own" if first_value is None else repr(first_value)
        c.error("disagg-context-length-same", f"{other.field}.extra_args.context_length", value,
                f"differs from {first.id} ({shown}): "
                "a request longer than one side's limit is admitted by "
                "the other, and its decode then waits for KV the prefill refused to make (InferenceX#2257)",
                "set the same context_length in the extra_args of every prefill and decode, or on none")


# A prefill of plain DP replicas (dp_size > 1, no DP attention) fails most hand-offs in
# SGLang 0.5.23 (sglang#29725, closed as inactive; the fixes #29730 and #29733 are not in
# the pin): its KV sender (disaggregation/common/conn.py, CommonKVSender) checks each
# request's bootstrap room against its attention-DP rank, which is 0 in every replica
# (runtime_context.derive_attention_ranks), while a prefill's default dispatch
# (follow_bootstrap_room) sends room r to replica r % dp_size: every request of replicas
# 1..dp_size-1 fails with "follow_bootstrap_room conflict". The documented way out,
# SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1, registers every replica as rank 0
# and the decode then times out instead. tests/conformance/test_prefill_dp_replicas.py
# holds this to the pin.
def check_prefill_dp_replicas(c: Any, instances: list[Instance]) -> None:
    for inst in instances:
        if inst.role == "prefill" and isinstance(inst.dp_size, int) and inst.dp_size > 1 \
                and inst.attn_dp_size in (1, None):
            c.error("disagg-prefill-dp-replicas", f"{inst.field}.dp_size", inst.dp_size,
                    f"makes {inst.id} {inst.dp_size} plain DP replicas, and SGLang 0.5.23 fails every hand-off of "
                    f"replicas 1..{inst.dp_size - 1} ('follow_bootstrap_room conflict': its KV sender compares the "
                    "request's room with the attention-DP rank, 0 in every replica; sglang#29725)",
                    "list each replica as a prefill instance of its own in pdnode_prefill_instances")


def attention_tp(inst: Instance) -> int | None:
    """The ranks one attention layer's KV heads are split over: tp_size, divided by the
    attention-DP size when DP attention is on (SGLang 0.5.23, srt/runtime_context.py);
    None when the instance's sizes were refused."""
    if not isinstance(inst.tp_size, int) or not isinstance(inst.attn_dp_size, int) or inst.attn_dp_size < 1:
        return None
    return inst.tp_size // inst.attn_dp_size if inst.attn_dp_size > 1 else inst.tp_size


def check_attention_tp(c: Any, instances: list[Instance], kind: str | None) -> None:
    """A non-MLA model's KV is split by head over the attention TP ranks, so a decode whose
    attention TP differs from its prefill's gathers or scatters slices of heads (SGLang
    0.5.23, disaggregation/common/conn.py _resolve_rank_mapping, by integer division and
    unchecked; mooncake/conn.py send_kvcache_slice). Sizes that do not divide one another
    map ranks wrongly: refused. Sizes that do are accepted: 0.5.23 maps them (the GQA fixes
    sglang#19086 and #30997 are in), logs its own "Performance is NOT guaranteed", and its
    failed-session probe ends the cascade of sglang#15674 within 30 s; the reference layout
    (prefill attention TP 4, decode 1) is one (docs/field-failures.md, row 9).
    An MLA model keeps the whole latent KV on every rank: any pairing works."""
    if kind == "moe_mla":
        return
    prefills = [(i, attention_tp(i)) for i in instances if i.role == "prefill" and attention_tp(i)]
    decodes = [(i, attention_tp(i)) for i in instances if i.role == "decode" and attention_tp(i)]
    for d, d_tp in decodes:
        for p, p_tp in prefills:
            if max(p_tp, d_tp) % min(p_tp, d_tp):
                c.error("disagg-attn-tp-divides", f"{d.field}.tp_size", d.tp_size,
                        f"gives {d.id} attention TP {d_tp} against {p.id}'s {p_tp}: neither divides the other, and "
                        f"SGLang maps a non-MLA model's KV heads (pdnode_model_kind {kind}) between them by integer "
                        "division without a check", "use attention TP sizes (tp_size / attn_dp_size) that divide "
                        "one another; the same on both moves each request's KV in one piece per rank")
                break  # one line per decode
    check_block_scaled_kv_attention_tp(c, prefills, decodes, kind)


# What the pin slices between attention TP sizes (SGLang 0.5.23, mooncake/conn.py
# maybe_send_extra): KV heads, a hybrid model's sliding-window state (gpt-oss: llm-d#2433,
# which 0.5.16 refused) and its Mamba state (Qwen3-Next). What it does not: the per-block
# scales of the MXFP8 KV cache (kv_cache_dtype mxfp8 gives a non-MLA model the block-scaled
# pool, whose scales ride as a state of their own, StateType.BLOCK_SCALE), for which the
# prefill's transfer worker raises "PD Disaggregation does NOT support PD different TP
# sizes for non-MLA BLOCK_SCALE hybrid models yet" at the first hand-off and the client
# waits. tests/conformance/test_pinned_fixes.py reads all of this in the pin.
BLOCK_SCALED_KV_DTYPES = ("mxfp8",)


def check_block_scaled_kv_attention_tp(c: Any, prefills: list, decodes: list, kind: str | None) -> None:
    """PREFILLS and DECODES: (instance, attention TP) of a non-MLA model's engines."""
    for d, d_tp in decodes:
        dtype = d.extra_args.get("kv_cache_dtype")
        if dtype not in BLOCK_SCALED_KV_DTYPES:
            continue  # the KV layout rule makes every engine's dtype the same
        other = next(((p, p_tp) for p, p_tp in prefills if p_tp != d_tp), None)
        if other:
            p, p_tp = other
            c.error("disagg-attn-tp-block-scaled-kv", f"{d.field}.tp_size", d.tp_size,
                    f"gives {d.id} attention TP {d_tp} against {p.id}'s {p_tp} with kv_cache_dtype {dtype} on a "
                    f"non-MLA model (pdnode_model_kind {kind}): SGLang 0.5.23 does not slice the KV's block scales "
                    "between sizes and fails the first hand-off ('PD Disaggregation does NOT support PD different "
                    "TP sizes for non-MLA BLOCK_SCALE hybrid models yet')",
                    "give every prefill and decode the same attention TP (tp_size / attn_dp_size), or another "
                    "kv_cache_dtype")


# HiCache on a prefill with HiSparse on a decode hangs (sglang#26092, closed as inactive;
# no fix found, and the combined work, sglang#26161, still open). SGLang 0.5.23 checks
# each inside one engine only (srt/arg_groups/hisparse_hook.py, hicache_hook.py); the pair
# spans two processes, so the plan refuses it.
def check_hicache_hisparse(c: Any, instances: list[Instance]) -> None:
    hicache = [i for i in instances if i.role == "prefill" and i.extra_args.get("enable_hierarchical_cache") is True]
    hisparse = [i for i in instances if i.role == "decode" and i.extra_args.get("enable_hisparse") is True]
    if hicache and hisparse:
        c.error("disagg-hicache-hisparse", f"{hisparse[0].field}.extra_args.enable_hisparse", True,
                f"beside HiCache on {hicache[0].id} (enable_hierarchical_cache): a decode with HiSparse hangs on "
                "a HiCache prefill's hand-off (sglang#26092, unfixed in SGLang 0.5.23)",
                "turn off enable_hierarchical_cache on every prefill, or enable_hisparse on every decode")


def _similar(a: str, b: str) -> bool:
    import difflib
    return difflib.SequenceMatcher(None, a, b).ratio() > 0.85
