"""A layout change as steps (issue 45): which instance starts, restarts, stops, in which
order, and how many prefills and decodes serve after each step.

Identity is what an instance is, not where it stands in the list: an instance of the new
layout whose role, hosts, GPUs and arguments are those of one that runs now keeps running
(``keep``), whatever its index; one whose role, hosts and GPUs are unchanged but whose
arguments differ restarts in place (``restart``); an instance named (``name:``) on both
sides is the same instance wherever it moved. The rest stop (``stop``, the old ones) or
start (``start``, the new ones). Arguments that follow from the index (ports) are not
part of what an instance is.

The order keeps each role serving where some order can: ``order`` searches the orders of
the steps (a start only once the GPUs it needs are free: the old instances on them have
stopped) for one in which no step leaves a role with no instance serving; where none
exists, one with the fewest such steps. New instances whose GPUs are free start first
(surge), before the ones they replace stop. The search is exact (every order, memoised)
up to EXACT_LIMIT steps, greedy beyond; tests/test_layout_change.py holds it to a
brute-force search over every order on generated small cases.

Pure: instances in, steps out (pdnode.commands.diff reads the inventories).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

ROLES = ("prefill", "decode")
# Steps up to which every order is searched (2^n memoised states); beyond: greedy.
EXACT_LIMIT = 16
# ServerArgs that follow from where an instance stands in the list, not from what it is.
INDEX_ARGS = frozenset({"port", "disaggregation_bootstrap_port", "nccl_port", "dist_init_addr", "host",
                        "served_model_name", "base_gpu_id"})


@dataclass(frozen=True)
class Instance:
    id: str  # the plan's service id (prefill-0, decode-fast, ...)
    role: str  # prefill | decode
    gpus: tuple[tuple[str, int], ...]  # (host, GPU) pairs: where it runs
    shape: str = ""  # what it runs: its arguments without the index's (canonical JSON)
    named: bool = False  # the inventory gave it a name

    @property
    def where(self) -> frozenset[tuple[str, int]]:
        return frozenset(self.gpus)


def shape_of(args: dict[str, Any]) -> str:
    """The arguments that say what an instance is (INDEX_ARGS left out), canonical."""
    return json.dumps({k: v for k, v in sorted(args.items()) if k not in INDEX_ARGS}, sort_keys=True, default=str)


@dataclass(frozen=True)
class Action:
    kind: str  # start | stop | restart
    role: str
    old: str | None  # the running instance's id (stop, restart)
    new: str | None  # the new instance's id (start, restart)
    frees: frozenset[tuple[str, int]] = frozenset()  # GPUs a stop frees
    needs: frozenset[tuple[str, int]] = frozenset()  # GPUs a start needs free

    @property
    def label(self) -> str:
        if self.kind == "restart":
            return f"restart {self.old}" + (f" as {self.new}" if self.new != self.old else "")
        return f"{self.kind} {self.old if self.kind == 'stop' else self.new}"


@dataclass
class Matching:
    keep: list[tuple[Instance, Instance]] = field(default_factory=list)  # (old, new)
    restart: list[tuple[Instance, Instance]] = field(default_factory=list)
    stop: list[Instance] = field(default_factory=list)
    start: list[Instance] = field(default_factory=list)


def match(old: Sequence[Instance], new: Sequence[Instance]) -> Matching:
    """Pair the running instances with the new layout's (see the module doc)."""
    m = Matching()
    left_old, left_new = list(old), list(new)

    def take(pred) -> list[tuple[Instance, Instance]]:
        pairs = []
        for n in list(left_new):
            o = next((o for o in left_old if pred(o, n)), None)
            if o is not None:
                pairs.append((o, n))
                left_old.remove(o)
                left_new.remove(n)
        return pairs

    for o, n in take(lambda o, n: o.named and n.named and o.id == n.id):
        if (o.role, o.where) != (n.role, n.where):  # a named instance moved: stop there, start here
            m.stop.append(o)
            m.start.append(n)
        elif o.shape == n.shape:
            m.keep.append((o, n))
        else:
            m.restart.append((o, n))
    m.keep += take(lambda o, n: (o.role, o.where, o.shape) == (n.role, n.where, n.shape))
    m.restart += take(lambda o, n: (o.role, o.where) == (n.role, n.where))
    m.stop += left_old
    m.start += left_new
    return m


def actions(m: Matching) -> list[Action]:
    out = [Action("restart", o.role, o.id, n.id) for o, n in m.restart]
    out += [Action("stop", o.role, o.id, None, frees=o.where) for o in m.stop]
    out += [Action("start", n.role, None, n.id, needs=n.where) for n in m.start]
    return out


@dataclass(frozen=True)
class Step:
    action: Action
    serving: dict[str, int]  # after the step
    least: dict[str, int]  # the fewest serving during it (a restart's or stop's dip)
    at_zero: tuple[str, ...]  # roles the node had that no instance serves at some moment of it


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    start: dict[str, int]  # serving before the change
    exact: bool  # the order came from the exhaustive search

    @property
    def zero_steps(self) -> list[Step]:
        return [s for s in self.steps if s.at_zero]


def _counts(m: Matching) -> dict[str, int]:
    c = dict.fromkeys(ROLES, 0)
    for o, _ in m.keep + m.restart:
        c[o.role] += 1
    for o in m.stop:
        c[o.role] += 1
    return c


def _apply(counts: dict[str, int], a: Action) -> tuple[dict[str, int], dict[str, int]]:
    """(serving after, fewest serving during) an action: a start serves once it has
    started, a restart is away while it restarts, a stop from its start on."""
    after = dict(counts)
    if a.kind == "start":
        after[a.role] += 1
    elif a.kind == "stop":
        after[a.role] -= 1
    least = {r: min(counts[r], after[r]) - (1 if a.kind == "restart" and r == a.role else 0) for r in ROLES}
    return after, least


def cost(counts: dict[str, int], a: Action, roles: Iterable[str]) -> int:
    """The roles the step leaves with no instance serving at some moment (each a step of
    an outage for that role's requests)."""
    return sum(1 for r in roles if _apply(counts, a)[1][r] <= 0)


def _ready(a: Action, done: frozenset[int], acts: Sequence[Action]) -> bool:
    """A start waits until every stop freeing one of its GPUs is done, and the stop of the
    running instance of its name (one unit: it stops there before it starts here)."""
    if a.kind != "start":
        return True
    return all(i in done for i, b in enumerate(acts) if b.kind == "stop" and (b.frees & a.needs or b.old == a.new))


def _preference(a: Action) -> tuple[int, str]:
    # starts first (surge), then restarts, then stops; by name for a stable order
    return ({"start": 0, "restart": 1, "stop": 2}[a.kind], a.label)


def order(m: Matching) -> Plan:
    acts = sorted(actions(m), key=_preference)
    start = _counts(m)
    roles = [r for r in ROLES if start[r] > 0]  # a role the node never had cannot drop
    n = len(acts)
    exact = n <= EXACT_LIMIT

    def counts_of(done: frozenset[int]) -> dict[str, int]:
        c = dict(start)
        for i in done:
            c = _apply(c, acts[i])[0]
        return c

    if exact:
        @cache
        def best(done: frozenset[int]) -> tuple[int, tuple[int, ...]]:
            if len(done) == n:
                return 0, ()
            c = counts_of(done)
            found: tuple[int, tuple[int, ...]] | None = None
            for i in range(n):
                if i in done or not _ready(acts[i], done, acts):
                    continue
                here = cost(c, acts[i], roles)
                if found is not None and here >= found[0]:
                    continue
                rest_cost, rest = best(done | {i})
                if found is None or here + rest_cost < found[0]:
                    found = (here + rest_cost, (i, *rest))
                    if found[0] == 0:
                        break
            assert found is not None, "a start whose GPUs no stop frees"
            return found

        sequence = best(frozenset())[1]
    else:
        done: set[int] = set()
        seq: list[int] = []
        while len(seq) < n:
            c = counts_of(frozenset(done))
            ready = [i for i in range(n) if i not in done and _ready(acts[i], frozenset(done), acts)]
            i = min(ready, key=lambda j: (cost(c, acts[j], roles), _preference(acts[j])))
            done.add(i)
            seq.append(i)
        sequence = tuple(seq)
    steps, c = [], dict(start)
    for i in sequence:
        after, least = _apply(c, acts[i])
        steps.append(Step(acts[i], after, least, tuple(r for r in roles if least[r] <= 0)))
        c = after
    return Plan(tuple(steps), start, exact)


def side_by_side(change: Plan, host_of: Callable[[Action], str]) -> dict[str, int]:
    """Role -> the fewest of its instances serving at some moment when each host takes its
    own steps in the plan's order but the hosts run side by side (the deploy's handlers:
    HOST_OF names the host whose handlers take an action). The hosts can reach their lows
    at the same moment, so the worst is the start plus each host's lowest dip: a stop
    counts from its start, a start once it is done, a restart is away while it runs."""
    worst = {r: change.start[r] for r in ROLES}
    by_host: dict[str, list[Action]] = {}
    for step in change.steps:
        by_host.setdefault(host_of(step.action), []).append(step.action)
    for actions in by_host.values():
        for role in ROLES:
            now = low = 0
            for a in (a for a in actions if a.role == role):
                if a.kind == "stop":
                    now -= 1
                low = min(low, now - (1 if a.kind == "restart" else 0))
                if a.kind == "start":
                    now += 1
            worst[role] += low
    return worst


def plan_change(old: Sequence[Instance], new: Sequence[Instance]) -> tuple[Matching, Plan]:
    m = match(old, new)
    return m, order(m)
