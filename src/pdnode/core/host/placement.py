"""GPU / NUMA / NIC placement from ``nvidia-smi topo -m``: the topology and the results.

Pure functions over what :func:`pdnode.core.host.facts.parse_topo_matrix` returns (the one
parser of that output; this module adds no second one). This module holds the view of
the topology (:class:`Topo`), the result types (:class:`Advice` and its parts, with the
text the CLI prints) and ``register(subparsers)``, which adds ``pdnode placement``. The
judgement itself, per engine instance, is :func:`pdnode.core.host.placement_advice.advise`.

Standard library only, Python >= 3.11. docs/placement.md describes the checks.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Mapping

from ..exits import EXIT_FAILED, EXIT_OK
from .facts import LINK_RANK, nic_ranking
from ..rules.instances import format_ids, gpus_text

ROLES = ("prefill", "decode")
# /2: per engine instance ("instances", keyed by service id) instead of per role.
SCHEMA = "pdnode.placement/2"
# Links that cross the SMP interconnect between NUMA nodes (SOC: older drivers' name).
CROSS_NUMA_LINKS = ("SYS", "SOC")
_NV = re.compile(r"^NV(\d+)$")


# --- small helpers ---------------------------------------------------------------------

def parse_id_list(text: str | None) -> set[int] | None:
    """'0-55,112-167' (nvidia-smi's CPU / NUMA affinity cells) -> {0, ..., 167}; None if
    absent or not a list of ids."""
    if text is None:
        return None
    out: set[int] = set()
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            return None
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            return None
        out.update(range(lo, hi + 1))
    return out or None


def link_cost(link: str | None) -> tuple[int, int]:
    """Order GPU<->GPU link types, best (smallest) first: NV<n> (more links better), then
    hostfacts.LINK_RANK's PCIe types PIX < PXB < PHB < NODE < SYS; unknown last."""
    if link is None:
        return (99, 0)
    m = _NV.match(link)
    if m:
        return (0, -int(m.group(1)))
    if link == "SOC":
        link = "SYS"
    rank = LINK_RANK.get(link)
    return (rank, 0) if rank is not None and link != "X" else (9, 0)


def format_links(counts: Mapping[str, int]) -> str:
    """{'NV18': 4, 'SYS': 2} -> 'NV18 x4, SYS x2' (best first)."""
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: (link_cost(kv[0]), kv[0])))


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def gpu_word(ids: list[int]) -> str:
    return f"GPU{'s' * (len(ids) != 1)} {gpus_text(ids)}"


# --- the topology as this module sees it -------------------------------------------------

class Topo:
    def __init__(self, topo: Mapping[str, Any]):
        if not isinstance(topo, Mapping):
            raise ValueError("the topology is not a parsed `nvidia-smi topo -m` (a dict)")
        self.raw = topo
        self.links: Mapping[str, Mapping[str, str]] = topo.get("links") or {}
        self.gpus = sorted(int(d[3:]) for d in topo.get("devices") or [] if re.fullmatch(r"GPU\d+", d))
        if not self.gpus:
            raise ValueError("the topology lists no GPU (is it `nvidia-smi topo -m` output?)")
        aff = topo.get("affinity") or {}
        self.numa: dict[int, set[int] | None] = {}
        self.cpus: dict[int, set[int] | None] = {}
        for g in self.gpus:
            a = aff.get(f"GPU{g}") or {}
            self.numa[g] = parse_id_list(a.get("numa_affinity"))
            self.cpus[g] = parse_id_list(a.get("cpu_affinity"))
        # A NUMA node's CPUs: the CPU affinity nvidia-smi prints for the GPUs on that node.
        self.node_cpus: dict[int, set[int]] = {}
        self.node_gpus: dict[int, list[int]] = {}
        for g in self.gpus:
            nodes = self.numa[g]
            if nodes is None:
                continue
            for n in nodes:
                self.node_gpus.setdefault(n, []).append(g)
                if self.cpus[g] is not None and len(nodes) == 1:
                    self.node_cpus.setdefault(n, set()).update(self.cpus[g])
        self.nic_rank = nic_ranking(topo)  # hostfacts: GPU -> [{nic, link}], closest first
        self.nics = sorted({r["nic"] for ranked in self.nic_rank.values() for r in ranked})

    def link(self, a: int, b: int) -> str | None:
        return (self.links.get(f"GPU{a}", {}).get(f"GPU{b}")
                or self.links.get(f"GPU{b}", {}).get(f"GPU{a}"))

    def gpu_nic_link(self, gpu: int, nic: str) -> str | None:
        return next((r["link"] for r in self.nic_rank.get(gpu, []) if r["nic"] == nic), None)

    def nodes_of(self, gpus: Iterable[int]) -> tuple[list[int], bool]:
        """Known NUMA nodes of these GPUs, and whether every GPU's node is known."""
        nodes: set[int] = set()
        known = True
        for g in gpus:
            n = self.numa.get(g)
            if n is None:
                known = False
            else:
                nodes |= n
        return sorted(nodes), known

    def cpus_of(self, gpus: Iterable[int]) -> set[int] | None:
        out: set[int] = set()
        for g in gpus:
            if self.cpus.get(g) is None:
                return None
            out |= self.cpus[g]
        return out or None

    def pair_links(self, gpus: list[int]) -> list[str]:
        gs = sorted(gpus)
        return [self.link(a, b) or "?" for i, a in enumerate(gs) for b in gs[i + 1:]]

    def nic_numa(self, nic: str) -> list[int]:
        """NUMA node(s) of a NIC: those of the GPUs it reaches without crossing SYS."""
        nodes: set[int] = set()
        for g in self.gpus:
            link = self.gpu_nic_link(g, nic)
            if link is not None and link not in CROSS_NUMA_LINKS and self.numa.get(g) is not None:
                nodes |= self.numa[g]  # type: ignore[operator]
        return sorted(nodes)


def links_key(links: list[str]) -> tuple[tuple[int, int], ...]:
    """Worst link first: comparing two keys compares the worst links, then the next..."""
    return tuple(sorted((link_cost(x) for x in links), reverse=True))


# --- results -----------------------------------------------------------------------------

@dataclass
class InstanceView:
    id: str                    # the plan's service id, e.g. prefill-0
    role: str                  # prefill | decode
    field: str                 # the inventory entry, e.g. pdnode_prefill_instances[0]
    gpus: list[int]            # as planned
    missing: list[int]         # planned GPUs the topology does not have
    numa: list[int]            # known NUMA nodes of the present GPUs
    numa_known: bool           # every present GPU's NUMA node is known
    cpus: str | None           # CPU affinity (union) of the present GPUs
    links: dict[str, int]      # link type -> pairs among the present GPUs

    @property
    def present(self) -> list[int]:
        return [g for g in self.gpus if g not in self.missing]

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "field": self.field, "gpus": self.gpus, "present": self.present,
                "missing": self.missing, "numa_nodes": self.numa, "numa_known": self.numa_known, "cpus": self.cpus,
                "links": self.links}


@dataclass
class NicCheck:
    instance: str              # service id
    gpu: int
    nic: str
    link: str | None           # GPU <-> NIC in `nvidia-smi topo -m` (None: NIC not in it)
    gpu_numa: list[int]
    nic_numa: list[int]
    same_numa: bool | None     # None: cannot tell (NIC not in the topology / NUMA unknown)
    better: dict[str, str] | None  # closest NIC on the GPU's NUMA node, when this one is not

    def as_dict(self) -> dict[str, Any]:
        return {"instance": self.instance, "gpu": self.gpu, "nic": self.nic, "link": self.link,
                "gpu_numa": self.gpu_numa, "nic_numa": self.nic_numa, "same_numa": self.same_numa,
                "better": self.better}


@dataclass
class Split:
    gpus: dict[str, list[int]]  # instance id -> GPU ids
    numa: dict[str, list[int]]
    links: dict[str, dict[str, int]]
    numa_penalty: int          # sum over instances of (NUMA nodes spanned - 1)
    links_key: tuple[tuple[int, int], ...]

    @property
    def quality(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        return (self.numa_penalty, self.links_key)


@dataclass
class Advice:
    host_gpus: list[int]
    node_gpus: dict[int, list[int]]
    unknown_numa_gpus: list[int]
    nics: list[str]
    instances: dict[str, InstanceView]            # in the plan's order: prefill instances, then decode
    nic_checks: list[NicCheck]
    warnings: list[str]
    recommendation: Split | None
    affinity: dict[str, dict[str, Any]]          # instance id -> CPUAffinity / NUMAPolicy / NUMAMask (recommended)
    ib_devices: dict[int, dict[str, Any]] = field(default_factory=dict)  # GPU -> {nic, link, was}: to set
    fits: bool = True                             # every planned GPU is on this host
    plan_is_recommended: bool = False             # the plan's placement is (as good as) the best
    reason: str = ""                              # why the recommendation beats the plan
    nic_fix_exists: bool = False
    nic_note: str = ""                            # why no NIC was checked

    @property
    def better_exists(self) -> bool:
        return not self.fits or not self.plan_is_recommended or self.nic_fix_exists

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.better_exists else EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        rec = None
        if self.recommendation is not None:
            r = self.recommendation
            rec = {"gpus": r.gpus, "numa_nodes": r.numa, "links": r.links, "numa_penalty": r.numa_penalty,
                   "is_plan": self.plan_is_recommended, "reason": self.reason or None,
                   "affinity": self.affinity, "ib_devices": {str(k): v for k, v in self.ib_devices.items()}}
        return {
            "topology": {"gpus": self.host_gpus, "numa_nodes": {str(n): g for n, g in sorted(self.node_gpus.items())},
                     "unknown_numa_gpus": self.unknown_numa_gpus, "nics": self.nics},
            "instances": {i: v.as_dict() for i, v in self.instances.items()},
            "nics": [c.as_dict() for c in self.nic_checks],
            "warnings": self.warnings,
            "recommendation": rec,
            "fits": self.fits,
            "better_exists": self.better_exists,
            "exit_code": self.exit_code,
        }

    # -- the text the CLI prints ------------------------------------------------------
    def lines(self) -> list[str]:
        out = [self._topology_line()]
        rows = [("instance", "GPUs", "NUMA", "CPUs", "interconnect")]
        for v in self.instances.values():
            gpus = gpus_text(v.gpus)
            if v.missing:
                gpus += " (not on host)" if not v.present else f" ({format_ids(v.missing)} not on host)"
            numa = ",".join(map(str, v.numa)) if v.numa else ("-" if not v.present else "?")
            if v.numa and not v.numa_known:
                numa += ",?"
            if not v.present:
                inter = "-"
            elif len(v.present) == 1:
                inter = "single GPU"
            else:
                inter = format_links(v.links)
            rows.append((v.id, gpus, numa, v.cpus or ("-" if not v.present else "?"), inter))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for i, row in enumerate(rows):
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                out.append("  ".join("-" * w for w in widths))
        out.append(self._nic_line())
        out += [f"warning: {w}" for w in self.warnings] or ["no warnings"]
        out += self._recommendation_lines()
        return out

    def _topology_line(self) -> str:
        parts = [f"topology: {plural(len(self.host_gpus), 'GPU')} ({format_ids(self.host_gpus)})"]
        for n, gs in sorted(self.node_gpus.items()):
            parts.append(f"NUMA node {n}: {gpu_word(gs)}")
        if self.unknown_numa_gpus:
            parts.append(f"NUMA node unknown: {gpu_word(self.unknown_numa_gpus)}")
        parts.append(plural(len(self.nics), "NIC") if self.nics else "no NICs")
        return "; ".join(parts)

    def _nic_line(self) -> str:
        if not self.nic_checks:
            return f"NICs: not checked ({self.nic_note or 'no GPU->NIC mapping given'})"
        counts = Counter(c.link or "not in topology" for c in self.nic_checks)
        links = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: (link_cost(kv[0]), kv[0])))
        off = sum(1 for c in self.nic_checks if c.same_numa is False)
        unknown = sum(1 for c in self.nic_checks if c.same_numa is None)
        n = plural(len(self.nic_checks), "GPU->NIC pair")
        if not off and not unknown:
            return f"NICs: {n}, all on the GPU's NUMA node ({links})"
        bits = [f"{off} on another NUMA node"] if off else []
        bits += [f"{unknown} unknown"] if unknown else []
        return f"NICs: {n}, {', '.join(bits)} ({links})"

    def _recommendation_lines(self) -> list[str]:
        r = self.recommendation
        if r is None:
            sizes = " + ".join(f"{i} {len(v.gpus)}" for i, v in self.instances.items())
            return [f"recommended: none (no split into {sizes} contiguous GPUs fits "
                    f"this host's {plural(len(self.host_gpus), 'GPU')})"]
        head = "recommended: " + ", ".join(f"{i} {gpu_word(g)}" for i, g in r.gpus.items())
        head += " (the plan's placement)" if self.plan_is_recommended else f" ({self.reason})"
        out = [head]
        for i in r.gpus:
            a = self.affinity[i]
            keys = " ".join(f"{k}={a[k]}" for k in ("CPUAffinity", "NUMAPolicy", "NUMAMask") if a.get(k))
            note = f" ({a['note']})" if a.get("note") else ""
            out.append(f"  {i}: {keys or 'no CPUAffinity (CPU affinity unknown)'}{note}")
        if self.ib_devices:
            change = ", ".join(f"{g}: {c['nic']} ({c['link']}, " + (f"was {c['was']})" if c["was"] else "new)")
                               for g, c in sorted(self.ib_devices.items()))
            out.append(f"  pdnode_ib_devices: {change}")
        return out
