"""The layouts the planner ranks: every way to split a host's GPUs into engine instances.

PD layouts (xPyD): x prefill instances of one size and y decode instances of one size
using all pdnode_gpu_count GPUs; sizes are powers of two (what SGLang's TP groups and
attention heads divide into). Prefill runs plain TP (attention DP and EP are decode
choices here); a decode instance of size t picks attention-DP and EP sizes among the
powers of two dividing t and EP 1 or t, EP only for MoE kinds. Every PD candidate is judged by the
plan itself (pdnode.core.plan.build.build_plan on the inventory with the candidate's instances):
what the plan refuses is listed as rejected with its first reason, never ranked as
deployable. Colocated layouts (k unified instances) are ranked for comparison only: this
bundle deploys PD.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..plan.build import PlanError, build_plan

# Instance keys the planner decides; every other key of the inventory's first instance of a
# role (mem_fraction_static, extra_args, ...) is carried into each candidate instance.
DECIDED_KEYS = ("name", "gpus", "tp_size", "dp_size", "attn_dp_size", "ep_size", "moe_dense_tp_size",
                "enable_dp_lm_head", "port", "bootstrap_port", "nccl_port")
MOE_KINDS = ("moe", "moe_mla")


@dataclass(frozen=True)
class Inst:
    gpus: tuple[int, ...]
    tp_size: int
    attn_dp_size: int = 1
    ep_size: int = 1

    def label(self) -> str:
        out = f"TP{self.tp_size}"
        if self.attn_dp_size > 1:
            out += f" DP{self.attn_dp_size}"
        if self.ep_size > 1:
            out += f" EP{self.ep_size}"
        return out


@dataclass
class Candidate:
    prefill: tuple[Inst, ...]  # empty: colocated
    decode: tuple[Inst, ...]  # colocated: the unified instances
    deployable: bool = False
    rejected: str | None = None  # the plan's first reason
    kv_path: str | None = None  # how its KV moves, as the plan chose (pdnode.core.plan.kv_path): nvlink, rdma, tcp, nixl
    variables: dict[str, Any] = field(default_factory=dict)

    @property
    def colocated(self) -> bool:
        return not self.prefill

    def label(self) -> str:
        if self.colocated:
            return f"colocated {len(self.decode)}x {self.decode[0].label()}"
        return (f"{len(self.prefill)}P{len(self.decode)}D  P {len(self.prefill)}x {self.prefill[0].label()}"
                f" | D {len(self.decode)}x {self.decode[0].label()}")


def powers_of_two_dividing(n: int) -> list[int]:
    return [p for p in (2 ** i for i in range(n.bit_length())) if p <= n and n % p == 0]


def _blocks(start: int, size: int, count: int) -> list[tuple[int, ...]]:
    return [tuple(range(start + i * size, start + (i + 1) * size)) for i in range(count)]


def _decode_variants(size: int, moe: bool) -> list[tuple[int, int]]:
    """(attn_dp_size, ep_size) choices of a decode instance of `size` GPUs. EP is 1 or the
    whole instance: the two settings deployments use (SGLang's all-to-all MoE backends need
    ep_size == tp_size), and the performance model has no term that tells them apart."""
    eps = sorted({1, size}) if moe else [1]
    return [(adp, ep) for adp in powers_of_two_dividing(size) for ep in eps]


def enumerate_layouts(gpu_count: int, model_kind: str) -> Iterator[Candidate]:
    moe = model_kind in MOE_KINDS
    sizes = powers_of_two_dividing(gpu_count) if gpu_count & (gpu_count - 1) == 0 else [
        p for p in (2 ** i for i in range(gpu_count.bit_length())) if p <= gpu_count]
    for psize in sizes:
        for x in range(1, gpu_count // psize + 1):
            rest = gpu_count - x * psize
            for dsize in sizes:
                if rest <= 0 or rest % dsize:
                    continue
                y = rest // dsize
                prefill = tuple(Inst(g, psize) for g in _blocks(0, psize, x))
                for adp, ep in _decode_variants(dsize, moe):
                    decode = tuple(Inst(g, dsize, adp, ep) for g in _blocks(x * psize, dsize, y))
                    yield Candidate(prefill=prefill, decode=decode)
    for usize in sizes:
        if gpu_count % usize:
            continue
        for adp, ep in _decode_variants(usize, moe):
            yield Candidate(prefill=(), decode=tuple(Inst(g, usize, adp, ep)
                                                     for g in _blocks(0, usize, gpu_count // usize)))


def _base(variables: Mapping[str, Any], role: str) -> dict[str, Any]:
    items = variables.get(f"pdnode_{role}_instances")
    first = items[0] if isinstance(items, list) and items and isinstance(items[0], Mapping) else {}
    return {k: v for k, v in first.items() if k not in DECIDED_KEYS}


def instance_entries(cand: Candidate, variables: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """pdnode_prefill_instances / pdnode_decode_instances of a PD candidate."""
    moe = variables.get("pdnode_model_kind") in MOE_KINDS
    out: dict[str, list[dict[str, Any]]] = {}
    for role, insts in (("prefill", cand.prefill), ("decode", cand.decode)):
        base = _base(variables, role)
        entries = []
        for inst in insts:
            entry: dict[str, Any] = {"gpus": list(inst.gpus), "tp_size": inst.tp_size}
            if inst.attn_dp_size > 1:
                entry["attn_dp_size"] = inst.attn_dp_size
                if moe:  # what the shipped MoE examples run with attention DP
                    entry["moe_dense_tp_size"] = 1
                    entry["enable_dp_lm_head"] = True
            if inst.ep_size > 1:
                entry["ep_size"] = inst.ep_size
            entries.append({**base, **entry})
        out[f"pdnode_{role}_instances"] = entries
    return out


def judge(cand: Candidate, variables: Mapping[str, Any], host: str, inventory_dir: str | None = None) -> Candidate:
    """Ask the plan: deployable, or rejected with the plan's first reason (``inventory_dir``:
    where the model's lock file is, for an inventory that names the model's source)."""
    if cand.colocated:
        cand.rejected = "colocated (not deployable by this bundle)"
        return cand
    trial = {k: v for k, v in variables.items() if not k.startswith(("pdnode_prefill_", "pdnode_decode_"))}
    trial.update(instance_entries(cand, variables))
    cand.variables = trial
    try:
        plan = build_plan(trial, host, None, inventory_dir)
    except PlanError as exc:
        cand.rejected = str(exc.problems[0]) if exc.problems else "refused by the plan"
        return cand
    cand.deployable = True
    cand.kv_path = plan.cluster["kv"]["path"]
    return cand
