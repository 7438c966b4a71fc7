"""GPU / NUMA / NIC placement advice from ``nvidia-smi topo -m``.

Pure functions over what :func:`pdnode.hostfacts.parse_topo_matrix` returns (the one
parser of that output; this module adds no second one). :func:`advise` reports, per role
(prefill, decode), the NUMA node(s), CPU affinity and GPU interconnect of its GPUs, warns
when a better split of the host's GPUs exists (NUMA locality first, then the GPU links),
checks each GPU's RDMA NIC against the GPU's NUMA node, and recommends a split and a
``CPUAffinity=``/``NUMAPolicy=``/``NUMAMask=`` per role as data (the units are not
changed here). ``register(subparsers)`` adds ``pdnode placement`` to the CLI.

Standard library only, Python >= 3.11. docs/placement.md describes the checks.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Mapping

from .hostfacts import LINK_RANK, nic_ranking, parse_topo_matrix

ROLES = ("prefill", "decode")
SCHEMA = "pdnode.placement/1"
EXIT_OK, EXIT_BETTER, EXIT_CANNOT_RUN = 0, 1, 2
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


def format_ids(ids: Iterable[int]) -> str:
    """{0, 1, 2, 3, 7} -> '0-3,7' (the format of CPUAffinity= and of nvidia-smi)."""
    values = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


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


def _gpus_text(ids: list[int]) -> str:
    return format_ids(ids) if ids else "-"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _gpu_word(ids: list[int]) -> str:
    return f"GPU{'s' * (len(ids) != 1)} {_gpus_text(ids)}"


# --- the topology as this module sees it -------------------------------------------------

class _Topo:
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


def _links_key(links: list[str]) -> tuple[tuple[int, int], ...]:
    """Worst link first: comparing two keys compares the worst links, then the next..."""
    return tuple(sorted((link_cost(x) for x in links), reverse=True))


# --- results -----------------------------------------------------------------------------

@dataclass
class RoleView:
    role: str
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
        return {"gpus": self.gpus, "present": self.present, "missing": self.missing, "numa_nodes": self.numa,
                "numa_known": self.numa_known, "cpus": self.cpus, "links": self.links}


@dataclass
class NicCheck:
    role: str
    gpu: int
    nic: str
    link: str | None           # GPU <-> NIC in `nvidia-smi topo -m` (None: NIC not in it)
    gpu_numa: list[int]
    nic_numa: list[int]
    same_numa: bool | None     # None: cannot tell (NIC not in the topology / NUMA unknown)
    better: dict[str, str] | None  # closest NIC on the GPU's NUMA node, when this one is not

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "gpu": self.gpu, "nic": self.nic, "link": self.link, "gpu_numa": self.gpu_numa,
                "nic_numa": self.nic_numa, "same_numa": self.same_numa, "better": self.better}


@dataclass
class Split:
    gpus: dict[str, list[int]]
    numa: dict[str, list[int]]
    links: dict[str, dict[str, int]]
    numa_penalty: int          # sum over roles of (NUMA nodes spanned - 1)
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
    roles: dict[str, RoleView]
    nic_checks: list[NicCheck]
    warnings: list[str]
    recommendation: Split | None
    affinity: dict[str, dict[str, Any]]          # role -> CPUAffinity / NUMAPolicy / NUMAMask (recommended split)
    ib_devices: dict[int, dict[str, Any]] = field(default_factory=dict)  # GPU -> {nic, link, was}: to set
    fits: bool = True                             # every planned GPU is on this host
    plan_is_recommended: bool = False             # the plan's split is (as good as) the best
    reason: str = ""                              # why the recommendation beats the plan
    nic_fix_exists: bool = False
    nic_note: str = ""                            # why no NIC was checked

    @property
    def better_exists(self) -> bool:
        return not self.fits or not self.plan_is_recommended or self.nic_fix_exists

    @property
    def exit_code(self) -> int:
        return EXIT_BETTER if self.better_exists else EXIT_OK

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
            "roles": {r: v.as_dict() for r, v in self.roles.items()},
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
        rows = [("role", "GPUs", "NUMA", "CPUs", "interconnect")]
        for role in ROLES:
            v = self.roles[role]
            gpus = _gpus_text(v.gpus)
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
            rows.append((role, gpus, numa, v.cpus or ("-" if not v.present else "?"), inter))
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
        parts = [f"topology: {_plural(len(self.host_gpus), 'GPU')} ({format_ids(self.host_gpus)})"]
        for n, gs in sorted(self.node_gpus.items()):
            parts.append(f"NUMA node {n}: {_gpu_word(gs)}")
        if self.unknown_numa_gpus:
            parts.append(f"NUMA node unknown: {_gpu_word(self.unknown_numa_gpus)}")
        parts.append(_plural(len(self.nics), "NIC") if self.nics else "no NICs")
        return "; ".join(parts)

    def _nic_line(self) -> str:
        if not self.nic_checks:
            return f"NICs: not checked ({self.nic_note or 'no GPU->NIC mapping given'})"
        counts = Counter(c.link or "not in topology" for c in self.nic_checks)
        links = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: (link_cost(kv[0]), kv[0])))
        off = sum(1 for c in self.nic_checks if c.same_numa is False)
        unknown = sum(1 for c in self.nic_checks if c.same_numa is None)
        n = _plural(len(self.nic_checks), "GPU->NIC pair")
        if not off and not unknown:
            return f"NICs: {n}, all on the GPU's NUMA node ({links})"
        bits = [f"{off} on another NUMA node"] if off else []
        bits += [f"{unknown} unknown"] if unknown else []
        return f"NICs: {n}, {', '.join(bits)} ({links})"

    def _recommendation_lines(self) -> list[str]:
        r = self.recommendation
        if r is None:
            p, d = (len(self.roles[x].gpus) for x in ROLES)
            return [f"recommended: none (no split into prefill {p} + decode {d} contiguous GPUs fits "
                    f"this host's {_plural(len(self.host_gpus), 'GPU')})"]
        head = f"recommended: prefill {_gpu_word(r.gpus['prefill'])}, decode {_gpu_word(r.gpus['decode'])}"
        head += " (the plan's placement)" if self.plan_is_recommended else f" ({self.reason})"
        out = [head]
        for role in ROLES:
            a = self.affinity[role]
            keys = " ".join(f"{k}={a[k]}" for k in ("CPUAffinity", "NUMAPolicy", "NUMAMask") if a.get(k))
            note = f" ({a['note']})" if a.get("note") else ""
            out.append(f"  {role}: {keys or 'no CPUAffinity (CPU affinity unknown)'}{note}")
        if self.ib_devices:
            change = ", ".join(f"{g}: {c['nic']} ({c['link']}, " + (f"was {c['was']})" if c["was"] else "new)")
                               for g, c in sorted(self.ib_devices.items()))
            out.append(f"  pdnode_ib_devices: {change}")
        return out


# --- the advice --------------------------------------------------------------------------

def _normalize_plan(plan_gpus: Mapping[str, Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for role in ROLES:
        gpus = plan_gpus.get(role) if isinstance(plan_gpus, Mapping) else None
        if not isinstance(gpus, (list, tuple)) or not gpus or not all(isinstance(g, int) and g >= 0 for g in gpus):
            raise ValueError(f"plan_gpus[{role!r}] must be a non-empty list of GPU ids, not {gpus!r}")
        out[role] = list(gpus)
    return out


def _normalize_nics(nics: Mapping[Any, Any] | None) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for key, dev in (nics or {}).items():
        try:
            gpu = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"NIC mapping key {key!r} is not a GPU id") from None
        names = [d.strip() for d in str(dev).split(",") if d.strip()]
        if names:
            out[gpu] = names
    return out


def _split(t: _Topo, gpus: dict[str, list[int]]) -> Split:
    numa, links, penalty, all_links = {}, {}, 0, []
    for role in ROLES:
        nodes, _ = t.nodes_of(gpus[role])
        numa[role] = nodes
        penalty += max(0, len(nodes) - 1)
        pl = t.pair_links(gpus[role])
        links[role] = dict(Counter(pl))
        all_links += pl
    return Split(gpus=gpus, numa=numa, links=links, numa_penalty=penalty, links_key=_links_key(all_links))


def candidate_splits(host_gpus: list[int], sizes: Mapping[str, int]) -> list[dict[str, list[int]]]:
    """Every way to give each role a contiguous, disjoint window of the host's GPU ids."""
    present = set(host_gpus)
    windows = {role: [list(range(a, a + sizes[role])) for a in host_gpus
                      if all(g in present for g in range(a, a + sizes[role]))] for role in ROLES}
    return [{"prefill": p, "decode": d} for p in windows["prefill"] for d in windows["decode"]
            if not set(p) & set(d)]


def _affinity(t: _Topo, gpus: list[int]) -> dict[str, Any]:
    """What the role's systemd unit could use: the CPUs of its NUMA node and a memory policy
    that prefers that node (``preferred``, not ``bind``: a full node spills instead of
    failing allocations)."""
    nodes, known = t.nodes_of(gpus)
    out: dict[str, Any] = {"numa_nodes": nodes, "CPUAffinity": None, "NUMAPolicy": None, "NUMAMask": None,
                           "note": None}
    if not known or not nodes:
        cpus = t.cpus_of(gpus)
        out.update(CPUAffinity=format_ids(cpus) if cpus else None, note="NUMA node unknown: no NUMAPolicy")
        return out
    cpus = set().union(*(t.node_cpus.get(n, set()) for n in nodes)) if all(n in t.node_cpus for n in nodes) else None
    out["CPUAffinity"] = format_ids(cpus) if cpus else None
    if len(nodes) == 1:
        out.update(NUMAPolicy="preferred", NUMAMask=str(nodes[0]))
    else:
        out["note"] = f"spans NUMA nodes {','.join(map(str, nodes))}: no NUMAPolicy"
    if cpus is None:
        out["note"] = "; ".join(x for x in (out["note"], "CPU list of the NUMA node unknown") if x)
    return out


def _fix_text(gpus: dict[str, list[int]], numa: dict[str, list[int]] | None = None) -> str:
    parts = []
    for role in ROLES:
        where = f" (NUMA {','.join(map(str, numa[role]))})" if numa and numa[role] else ""
        parts.append(f"pdnode_{role}_gpus: {gpus[role]}{where}")
    return ", ".join(parts)


def advise(topo: Mapping[str, Any] | str, plan_gpus: Mapping[str, Any],
           nics: Mapping[Any, Any] | None = None) -> Advice:
    """Placement advice for a plan's GPUs on the host that ``topo`` describes.

    ``topo``: :func:`pdnode.hostfacts.parse_topo_matrix`'s result (or the raw text, which
    is parsed with it); ``plan_gpus``: ``Plan.gpus`` (role -> physical GPU ids); ``nics``:
    ``pdnode_ib_devices`` (physical GPU id -> ``mlx5_N`` or a comma list), or None.
    Raises ValueError when the inputs cannot be used.
    """
    if isinstance(topo, str):
        topo = parse_topo_matrix(topo)
    t = _Topo(topo)
    plan = _normalize_plan(plan_gpus)
    nic_map = _normalize_nics(nics)
    present = set(t.gpus)
    warnings: list[str] = []

    roles: dict[str, RoleView] = {}
    for role in ROLES:
        gs = plan[role]
        here = [g for g in gs if g in present]
        nodes, known = t.nodes_of(here)
        cpus = t.cpus_of(here)
        roles[role] = RoleView(role=role, gpus=gs, missing=[g for g in gs if g not in present], numa=nodes,
                               numa_known=known, cpus=format_ids(cpus) if cpus else None,
                               links=dict(Counter(t.pair_links(here))))
    fits = not any(v.missing for v in roles.values())

    sizes = {role: len(plan[role]) for role in ROLES}
    splits = [_split(t, s) for s in candidate_splits(t.gpus, sizes)]
    plan_split = _split(t, plan) if fits else None

    def rank(s: Split) -> tuple[Any, ...]:
        moved = sum(s.gpus[r] != plan[r] for r in ROLES)
        shift = sum(abs(s.gpus[r][0] - plan[r][0]) for r in ROLES)
        return (s.quality, moved, shift, s.gpus["prefill"][0], s.gpus["decode"][0])

    best = min(splits, key=rank) if splits else None
    if plan_split is not None and (best is None or plan_split.quality <= best.quality):
        best = plan_split  # the plan's own split wins every tie
    plan_is_best = plan_split is not None and best is plan_split

    # Does not fit: say so first, with what would.
    if not fits:
        need = sum(sizes.values())
        missing = sorted({g for v in roles.values() for g in v.missing})
        host = f"{len(t.gpus)} ({_gpu_word(t.gpus)})"
        if best is not None:
            fix = f"use GPUs this host has: {_fix_text(best.gpus)}"
        elif len(t.gpus) >= 2:
            half = len(t.gpus) // 2
            fix = (f"run against the host the inventory describes, or plan at most {len(t.gpus)} GPUs in all "
                   f"(e.g. {_fix_text({'prefill': t.gpus[:half], 'decode': t.gpus[half:2 * half]})})")
        else:
            fix = ("run against the host the inventory describes; a PD node needs at least 2 GPUs "
                   "(prefill and decode on different GPUs)")
        warnings.append(
            f"the plan needs {need} GPUs (prefill {_gpus_text(plan['prefill'])}, decode {_gpus_text(plan['decode'])}) "
            f"but the host has {host}: {_gpu_word(missing)} {'are' if len(missing) > 1 else 'is'} not on this host. "
            f"Fix: {fix}.")

    reason = ""
    if plan_split is not None and best is not None and not plan_is_best:
        fix = _fix_text(best.gpus, best.numa)
        # NUMA: a role spans nodes while a split keeps every role on one node.
        if best.numa_penalty == 0:
            for role in ROLES:
                if len(plan_split.numa[role]) > 1:
                    warnings.append(
                        f"{role} GPUs {_gpus_text(plan[role])} span NUMA nodes "
                        f"{','.join(map(str, plan_split.numa[role]))} while a split keeps each role on one "
                        f"NUMA node. Fix: {fix}.")
        # Interconnect: the role's links are worse than the recommended split gives it.
        for role in ROLES:
            mine, theirs = t.pair_links(plan[role]), t.pair_links(best.gpus[role])
            if _links_key(mine) > _links_key(theirs):
                warnings.append(
                    f"{role} GPUs {_gpus_text(plan[role])} are linked by {format_links(Counter(mine))}, worse than "
                    f"GPUs {_gpus_text(best.gpus[role])} ({format_links(Counter(theirs))}). Fix: {fix}.")
        if best.numa_penalty < plan_split.numa_penalty:
            reason = ("better: each role on one NUMA node" if best.numa_penalty == 0
                      else "better: fewer roles across NUMA nodes")
        else:
            both_plan = Counter(t.pair_links(plan["prefill"]) + t.pair_links(plan["decode"]))
            both_best = Counter(t.pair_links(best.gpus["prefill"]) + t.pair_links(best.gpus["decode"]))
            reason = f"better GPU links: {format_links(both_best)} instead of {format_links(both_plan)}"
    elif not fits and best is not None:
        reason = "the plan's GPUs are not all on this host"

    # NICs: each mapped NIC on its GPU's NUMA node (a SYS path crosses the sockets).
    checks: list[NicCheck] = []
    nic_fix = False
    mapped = sorted(g for g in nic_map if any(g in roles[r].present for r in ROLES))
    if mapped and not t.nics:
        warnings.append(f"the NIC mapping names NICs for {_gpu_word(mapped)} but the topology shows no NIC, so they "
                        "were not checked. Fix: capture `nvidia-smi topo -m` on the host with its NICs (driver "
                        "loaded), or use pdnode_transfer_backend: mooncake_tcp on a host without RDMA.")
    for role in ROLES if t.nics else ():
        for g in roles[role].present:
            for dev in nic_map.get(g, []):
                link = t.gpu_nic_link(g, dev)
                gnuma, _ = t.nodes_of([g])
                nnuma = t.nic_numa(dev) if link is not None else []
                same = None if link is None else link not in CROSS_NUMA_LINKS
                better = None
                if same is False:
                    alt = next((r for r in t.nic_rank.get(g, []) if r["link"] not in CROSS_NUMA_LINKS), None)
                    better = dict(alt) if alt else None
                checks.append(NicCheck(role, g, dev, link, gnuma, nnuma, same, better))
                gn = ",".join(map(str, gnuma)) or "?"
                if link is None:
                    nic_fix = True
                    legend = ", ".join(t.nics) or "none"
                    warnings.append(f"{role} GPU {g} -> {dev}: {dev} is not in the topology (its NICs: {legend}). "
                                    f"Fix: map GPU {g} to a NIC of the topology in pdnode_ib_devices.")
                elif same is False:
                    where = f"NUMA node {','.join(map(str, nnuma))}" if nnuma else "another NUMA node"
                    head = (f"{role} GPU {g} -> {dev} crosses {link}: {dev} is on {where}, GPU {g} on NUMA node "
                            f"{gn} (RDMA transfers of the KV cache cross the sockets).")
                    if better:
                        nic_fix = True
                        warnings.append(f"{head} Fix: map GPU {g} to {better['nic']} ({better['link']}, NUMA node "
                                        f"{gn}) in pdnode_ib_devices.")
                    else:
                        warnings.append(f"{head} Fix: none in the inventory: no NIC of this host is on NUMA node "
                                        f"{gn}; add one on that socket or accept the cross-socket path.")

    nic_note = ""
    if nic_map and not checks:
        nic_note = ("the topology shows no NIC" if not t.nics
                    else "none of the plan's mapped GPUs is on this host")
    elif not nic_map:
        nic_note = "no GPU->NIC mapping given"

    affinity: dict[str, dict[str, Any]] = {}
    to_add: dict[int, dict[str, Any]] = {}
    if best is not None:
        affinity = {role: _affinity(t, best.gpus[role]) for role in ROLES}
        if nic_map and t.nics:
            for g in best.gpus["prefill"] + best.gpus["decode"]:
                ranked = t.nic_rank.get(g) or []
                if not ranked:
                    continue
                devs = nic_map.get(g)
                if not devs:
                    to_add[g] = {"nic": ranked[0]["nic"], "link": ranked[0]["link"], "was": None}
                    continue
                links = [t.gpu_nic_link(g, d) for d in devs]
                if any(x is None or x in CROSS_NUMA_LINKS for x in links) and ranked[0]["link"] not in CROSS_NUMA_LINKS:
                    to_add[g] = {"nic": ranked[0]["nic"], "link": ranked[0]["link"], "was": ",".join(devs)}

    node_gpus = {n: sorted(gs) for n, gs in t.node_gpus.items()}
    return Advice(
        host_gpus=t.gpus, node_gpus=node_gpus, unknown_numa_gpus=[g for g in t.gpus if t.numa[g] is None],
        nics=t.nics, roles=roles, nic_checks=checks, warnings=warnings, recommendation=best, affinity=affinity,
        ib_devices=to_add, fits=fits, plan_is_recommended=plan_is_best, reason=reason, nic_fix_exists=nic_fix,
        nic_note=nic_note,
    )


# --- pdnode placement ------------------------------------------------------------------

EPILOG = """\
FILE is the saved output of `nvidia-smi topo -m` on the host (docs/placement.md).
exit codes: 0 the plan's placement is the recommended one (or as good), 1 a better one
exists (or the plan does not fit this topology), 2 the inputs could not be read."""


def _cannot_run(args: argparse.Namespace, why: str) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"schema": SCHEMA, "exit_code": EXIT_CANNOT_RUN, "error": why}, indent=2))
    print(f"pdnode placement: could not run: {why}", file=sys.stderr)
    return EXIT_CANNOT_RUN


def cmd_placement(args: argparse.Namespace) -> int:
    from .inventory import InventoryError, load_inventory
    from .plan import PlanError, build_plan

    try:
        hv = load_inventory(args.inventory, args.host)
    except InventoryError as exc:
        return _cannot_run(args, str(exc))
    try:
        plan = build_plan(hv.variables, hv.host)
    except PlanError as exc:
        n = len(exc.problems)
        return _cannot_run(args, f"the inventory {args.inventory} is invalid ({_plural(n, 'problem')}; "
                                 f"`pdnode check {args.inventory}` lists them)")
    try:
        text = Path(args.topo).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return _cannot_run(args, f"cannot read {args.topo}: {exc.strerror or exc}")
    topo = parse_topo_matrix(text)
    if not any(d.startswith("GPU") for d in topo["devices"]) or not topo["links"]:
        return _cannot_run(args, f"{args.topo} is not `nvidia-smi topo -m` output (no GPU0 header row and matrix)")
    try:
        advice = advise(topo, plan.gpus, plan.settings.get("pdnode_ib_devices") or None)
    except ValueError as exc:
        return _cannot_run(args, str(exc))
    gpu_count = plan.settings.get("pdnode_gpu_count")
    if args.json:
        print(json.dumps({"schema": SCHEMA, "host": plan.host, "inventory": str(args.inventory),
                          "topo_file": str(args.topo), "gpu_count": gpu_count, **advice.as_dict()}, indent=2))
    else:
        print(f"host {plan.host}: plan from {args.inventory} (pdnode_gpu_count={gpu_count}), "
              f"topology from {args.topo}")
        print("\n".join(advice.lines()))
    return advice.exit_code


def register(sub: Any) -> None:
    """Add `pdnode placement` to pdnode's subcommands (called by pdnode.cli)."""
    p = sub.add_parser("placement", help="check GPU/NUMA/NIC placement against `nvidia-smi topo -m` "
                                         "(exit 0 best, 1 a better one exists, 2 cannot read)",
                       description="Check the plan's GPU split, NUMA locality and NICs against the host's "
                                   "`nvidia-smi topo -m`, and recommend a split and CPU affinity per role.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")
    p.add_argument("--topo", required=True, metavar="FILE", help="saved `nvidia-smi topo -m` output of the host")
    p.add_argument("--json", action="store_true", help=f"print the advice as JSON (schema {SCHEMA})")
    p.set_defaults(func=cmd_placement)
