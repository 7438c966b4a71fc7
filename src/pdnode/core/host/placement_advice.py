"""Placement advice per engine instance: the plan's GPUs against ``nvidia-smi topo -m``.

:func:`advise` reports, per prefill/decode instance of the plan (``plan["services"]``),
the NUMA node(s), CPU affinity and GPU interconnect of its GPUs, warns when a better
placement of the instances on the host's GPUs exists (NUMA locality first, then the GPU
links), checks each GPU's RDMA NIC against the GPU's NUMA node, and recommends a
placement and a ``CPUAffinity=``/``NUMAPolicy=``/``NUMAMask=`` per instance as data.
The topology view and the result types are :mod:`pdnode.core.host.placement`'s.

Standard library only, Python >= 3.11. docs/placement.md describes the checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .facts import parse_topo_matrix
from .placement import (CROSS_NUMA_LINKS, ROLES, Advice, InstanceView, NicCheck, Split, gpu_word, gpus_text,
                        links_key, Topo, format_ids, format_links)


def engine_instances(services: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plan's prefill and decode services as ``{id, role, field, gpus}``, in the plan's
    order; ``field`` names the inventory entry (``pdnode_decode_instances[1]``), counted
    per role in that order (the plan lists each role's instances in inventory order)."""
    items = services.values() if isinstance(services, Mapping) else None
    if items is None:
        raise ValueError("the plan's services must be a mapping of service id -> service")
    out: list[dict[str, Any]] = []
    per_role: Counter[str] = Counter()
    for svc in items:
        if not isinstance(svc, Mapping) or svc.get("role") not in ROLES:
            continue
        sid, gpus = svc.get("id"), svc.get("gpus")
        if not isinstance(gpus, (list, tuple)) or not gpus or \
                not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
            raise ValueError(f"service {sid!r}: gpus must be a non-empty list of GPU ids, not {gpus!r}")
        role = svc["role"]
        out.append({"id": str(sid), "role": role, "field": f"pdnode_{role}_instances[{per_role[role]}]",
                    "gpus": list(gpus)})
        per_role[role] += 1
    if not out:
        raise ValueError("the plan has no prefill or decode service")
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


def _split(t: Topo, gpus: dict[str, list[int]]) -> Split:
    numa, links, penalty, all_links = {}, {}, 0, []
    for sid, ids in gpus.items():
        nodes, _ = t.nodes_of(ids)
        numa[sid] = nodes
        penalty += max(0, len(nodes) - 1)
        pl = t.pair_links(ids)
        links[sid] = dict(Counter(pl))
        all_links += pl
    return Split(gpus=gpus, numa=numa, links=links, numa_penalty=penalty, links_key=links_key(all_links))


def candidate_splits(host_gpus: list[int], sizes: Mapping[str, int],
                     starts: Mapping[str, int] | None = None) -> list[dict[str, list[int]]]:
    """Every way to give each instance a contiguous, disjoint window of the host's GPU ids.

    Instances of the same size are interchangeable for the quality of a placement, so
    only one order of their windows is listed: ascending, matched to the instances in the
    order of their planned first GPU (``starts``; else the order of ``sizes``). That
    matching also moves each instance the least. It keeps eight 1-GPU instances at one
    candidate instead of 8! of them."""
    present = set(host_gpus)
    windows = {size: [list(range(a, a + size)) for a in host_gpus if all(g in present for g in range(a, a + size))]
               for size in set(sizes.values())}
    position = {sid: i for i, sid in enumerate(sizes)}
    order = sorted(sizes, key=lambda s: (sizes[s], (starts or {}).get(s, 0), position[s]))
    out: list[dict[str, list[int]]] = []

    def place(k: int, used: set[int], chosen: dict[str, list[int]]) -> None:
        if k == len(order):
            out.append({sid: chosen[sid] for sid in sizes})
            return
        sid = order[k]
        prev = order[k - 1] if k else None
        floor = chosen[prev][0] if prev is not None and sizes[prev] == sizes[sid] else -1
        for w in windows[sizes[sid]]:
            if w[0] > floor and not used & set(w):
                chosen[sid] = w
                place(k + 1, used | set(w), chosen)
        chosen.pop(sid, None)

    place(0, set(), {})
    return out


def _affinity(t: Topo, gpus: list[int]) -> dict[str, Any]:
    """What the instance's systemd unit could use: the CPUs of its NUMA node and a memory
    policy that prefers that node (``preferred``, not ``bind``: a full node spills instead
    of failing allocations)."""
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


def _fix_text(fields: Mapping[str, str], gpus: dict[str, list[int]], numa: dict[str, list[int]] | None = None,
              plan: Mapping[str, list[int]] | None = None) -> str:
    """``pdnode_prefill_instances[0].gpus: [2, 3] (NUMA 0), ...`` for the instances whose
    GPUs change (all of them without ``plan``)."""
    parts = []
    for sid, ids in gpus.items():
        if plan is not None and plan.get(sid) == ids:
            continue
        where = f" (NUMA {','.join(map(str, numa[sid]))})" if numa and numa.get(sid) else ""
        parts.append(f"{fields[sid]}.gpus: {ids}{where}")
    return ", ".join(parts)


def _nic_checks(t: Topo, views: dict[str, InstanceView], nic_map: dict[int, list[str]],
                warnings: list[str]) -> tuple[list[NicCheck], bool]:
    """Each mapped NIC on its GPU's NUMA node (a SYS path crosses the sockets)."""
    checks: list[NicCheck] = []
    nic_fix = False
    mapped = sorted(g for g in nic_map if any(g in v.present for v in views.values()))
    if mapped and not t.nics:
        warnings.append(f"the NIC mapping names NICs for {gpu_word(mapped)} but the topology shows no NIC, so they "
                        "were not checked. Fix: capture `nvidia-smi topo -m` on the host with its NICs (driver "
                        "loaded), or use pdnode_transfer_backend: mooncake_tcp on a host without RDMA.")
    for sid, view in views.items() if t.nics else ():
        for g in view.present:
            for dev in nic_map.get(g, []):
                link = t.gpu_nic_link(g, dev)
                gnuma, _ = t.nodes_of([g])
                nnuma = t.nic_numa(dev) if link is not None else []
                same = None if link is None else link not in CROSS_NUMA_LINKS
                better = None
                if same is False:
                    alt = next((r for r in t.nic_rank.get(g, []) if r["link"] not in CROSS_NUMA_LINKS), None)
                    better = dict(alt) if alt else None
                checks.append(NicCheck(sid, g, dev, link, gnuma, nnuma, same, better))
                gn = ",".join(map(str, gnuma)) or "?"
                if link is None:
                    nic_fix = True
                    legend = ", ".join(t.nics) or "none"
                    warnings.append(f"{sid} GPU {g} -> {dev}: {dev} is not in the topology (its NICs: {legend}). "
                                    f"Fix: map GPU {g} to a NIC of the topology in pdnode_ib_devices.")
                elif same is False:
                    where = f"NUMA node {','.join(map(str, nnuma))}" if nnuma else "another NUMA node"
                    head = (f"{sid} GPU {g} -> {dev} crosses {link}: {dev} is on {where}, GPU {g} on NUMA node "
                            f"{gn} (RDMA transfers of the KV cache cross the sockets).")
                    if better:
                        nic_fix = True
                        warnings.append(f"{head} Fix: map GPU {g} to {better['nic']} ({better['link']}, NUMA node "
                                        f"{gn}) in pdnode_ib_devices.")
                    else:
                        warnings.append(f"{head} Fix: none in the inventory: no NIC of this host is on NUMA node "
                                        f"{gn}; add one on that socket or accept the cross-socket path.")
    return checks, nic_fix


def advise(topo: Mapping[str, Any] | str, services: Mapping[str, Any],
           nics: Mapping[Any, Any] | None = None) -> Advice:
    """Placement advice for a plan's engine instances on the host that ``topo`` describes.

    ``topo``: :func:`pdnode.core.host.facts.parse_topo_matrix`'s result (or the raw text, which
    is parsed with it); ``services``: the plan's ``services`` (service id -> service with
    ``id``, ``role``, ``gpus``; the router and any other role are skipped); ``nics``:
    ``pdnode_ib_devices`` (physical GPU id -> ``mlx5_N`` or a comma list), or None.
    Raises ValueError when the inputs cannot be used.
    """
    if isinstance(topo, str):
        topo = parse_topo_matrix(topo)
    t = Topo(topo)
    engines = engine_instances(services)
    plan = {e["id"]: e["gpus"] for e in engines}
    fields = {e["id"]: e["field"] for e in engines}
    nic_map = _normalize_nics(nics)
    present = set(t.gpus)
    warnings: list[str] = []

    views: dict[str, InstanceView] = {}
    for e in engines:
        here = [g for g in e["gpus"] if g in present]
        nodes, known = t.nodes_of(here)
        cpus = t.cpus_of(here)
        views[e["id"]] = InstanceView(id=e["id"], role=e["role"], field=e["field"], gpus=e["gpus"],
                                      missing=[g for g in e["gpus"] if g not in present], numa=nodes,
                                      numa_known=known, cpus=format_ids(cpus) if cpus else None,
                                      links=dict(Counter(t.pair_links(here))))
    fits = not any(v.missing for v in views.values())

    sizes = {sid: len(ids) for sid, ids in plan.items()}
    starts = {sid: ids[0] for sid, ids in plan.items()}
    splits = [_split(t, s) for s in candidate_splits(t.gpus, sizes, starts)]
    plan_split = _split(t, dict(plan)) if fits else None

    def rank(s: Split) -> tuple[Any, ...]:
        moved = sum(s.gpus[i] != plan[i] for i in plan)
        shift = sum(abs(s.gpus[i][0] - plan[i][0]) for i in plan)
        return (s.quality, moved, shift, tuple(s.gpus[i][0] for i in plan))

    best = min(splits, key=rank) if splits else None
    if plan_split is not None and (best is None or plan_split.quality <= best.quality):
        best = plan_split  # the plan's own placement wins every tie
    plan_is_best = plan_split is not None and best is plan_split

    # Does not fit: say so first, with what would.
    if not fits:
        need = sum(sizes.values())
        missing = sorted({g for v in views.values() for g in v.missing})
        host = f"{len(t.gpus)} ({gpu_word(t.gpus)})"
        if best is not None:
            fix = f"use GPUs this host has: {_fix_text(fields, best.gpus, plan=plan)}"
        elif len(t.gpus) >= 2:
            half = len(t.gpus) // 2
            fix = (f"run against the host the inventory describes, or plan at most {len(t.gpus)} GPUs in all "
                   f"(e.g. pdnode_prefill_instances[0].gpus: {t.gpus[:half]}, "
                   f"pdnode_decode_instances[0].gpus: {t.gpus[half:2 * half]})")
        else:
            fix = ("run against the host the inventory describes; a PD node needs at least 2 GPUs "
                   "(prefill and decode on different GPUs)")
        planned = ", ".join(f"{sid} {gpus_text(ids)}" for sid, ids in plan.items())
        warnings.append(
            f"the plan needs {need} GPUs ({planned}) but the host has {host}: {gpu_word(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} not on this host. Fix: {fix}.")

    reason = ""
    if plan_split is not None and best is not None and not plan_is_best:
        fix = _fix_text(fields, best.gpus, best.numa, plan)
        # NUMA: an instance spans nodes while a placement keeps every instance on one node.
        if best.numa_penalty == 0:
            for sid in plan:
                if len(plan_split.numa[sid]) > 1:
                    warnings.append(
                        f"{sid} GPUs {gpus_text(plan[sid])} span NUMA nodes "
                        f"{','.join(map(str, plan_split.numa[sid]))} while a placement keeps each instance on one "
                        f"NUMA node. Fix: {fix}.")
        # Interconnect: the instance's links are worse than the recommended placement gives it.
        for sid in plan:
            mine, theirs = t.pair_links(plan[sid]), t.pair_links(best.gpus[sid])
            if links_key(mine) > links_key(theirs):
                warnings.append(
                    f"{sid} GPUs {gpus_text(plan[sid])} are linked by {format_links(Counter(mine))}, worse than "
                    f"GPUs {gpus_text(best.gpus[sid])} ({format_links(Counter(theirs))}). Fix: {fix}.")
        if best.numa_penalty < plan_split.numa_penalty:
            reason = ("better: each instance on one NUMA node" if best.numa_penalty == 0
                      else "better: fewer instances across NUMA nodes")
        else:
            both_plan = Counter(link for ids in plan.values() for link in t.pair_links(ids))
            both_best = Counter(link for ids in best.gpus.values() for link in t.pair_links(ids))
            reason = f"better GPU links: {format_links(both_best)} instead of {format_links(both_plan)}"
    elif not fits and best is not None:
        reason = "the plan's GPUs are not all on this host"

    checks, nic_fix = _nic_checks(t, views, nic_map, warnings)
    nic_note = ""
    if nic_map and not checks:
        nic_note = ("the topology shows no NIC" if not t.nics
                    else "none of the plan's mapped GPUs is on this host")
    elif not nic_map:
        nic_note = "no GPU->NIC mapping given"

    affinity: dict[str, dict[str, Any]] = {}
    to_add: dict[int, dict[str, Any]] = {}
    if best is not None:
        affinity = {sid: _affinity(t, ids) for sid, ids in best.gpus.items()}
        if nic_map and t.nics:
            for g in sorted(g for ids in best.gpus.values() for g in ids):
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
        nics=t.nics, instances=views, nic_checks=checks, warnings=warnings, recommendation=best, affinity=affinity,
        ib_devices=to_add, fits=fits, plan_is_recommended=plan_is_best, reason=reason, nic_fix_exists=nic_fix,
        nic_note=nic_note,
    )
