"""Every helper that draws a test node's ports draws a set the plan accepts: 10,000 draws
of each, and the plan of the node built on them wherever it could refuse.

A false FAIL came from a draw the plan refused (decode-0's port+233..+239 on the router's
metrics port): tests/standin/node.py drew the node's five ports without the decode's
DP-attention range. The plan is built here for every draw the plan could refuse: one
where a port lies in another's port+233..+239 (whatever instance owns it: the test does
not trust the helper's idea of which have DP attention), and the first draw of each
helper. A draw is the helper's own code on a seeded random stand-in for the socket
binding (the same pool of ports, no sockets): what is tested is which sets it keeps.
"""

from __future__ import annotations

import copy
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdnode.core.plan.build import PlanError, build_plan
from pdnode.core.rules import router_judge
from pdnode.core.rules.ports import DP_ATTENTION_OFFSETS

from . import node as standin_node_module
from .layout_node import layout_ports
from .test_planner_layouts import _variables

TESTS = Path(__file__).resolve().parents[1]
for p in (TESTS / "verify", TESTS / "standin"):  # as tests/verify/conftest.py puts them
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import cluster  # noqa: E402 - needs the path above
import node as verify_node_module  # noqa: E402 - the module cluster.py draws with
import nodeplan  # noqa: E402
from test_bench import bench_node_variables, bench_ports  # noqa: E402

DRAWS = 10_000


def at_risk(ports: list[int]) -> bool:
    """Whether a port lies in another's DP-attention range: the only draws a plan whose
    ports are distinct, in 1024-65296, can refuse, if that other port's owner has DP attention."""
    drawn = set(ports)
    return any(p + off in drawn for p in ports for off in DP_ATTENTION_OFFSETS)


def standin_node_draw() -> tuple[list[int], Callable[[], Any]]:
    ports = standin_node_module.standin_node_ports()
    return list(ports.values()), lambda: nodeplan.plan_for(SimpleNamespace(ports=ports))


def cluster_draw(prefills: list[list[int]], decodes: list[list[int]]) -> Callable[[], tuple[list[int], Callable[[], Any]]]:
    def draw() -> tuple[list[int], Callable[[], Any]]:
        members, router, metrics = cluster.cluster_members(prefills, decodes, {})
        ports = [p for m in members.values() for p in (m.port, m.bootstrap_port) if p] + [router, metrics]
        node = SimpleNamespace(instances=members, router_port=router, router_metrics_port=metrics)
        return ports, lambda: nodeplan.plan_for(node)
    return draw


def layout_draw(name: str) -> Callable[[], tuple[list[int], Callable[[], Any]]]:
    variables = _variables(name)
    services = [s for s in build_plan(copy.deepcopy(variables), "local").as_dict()["services"].values()
                if s["role"] in ("prefill", "decode")]

    def draw() -> tuple[list[int], Callable[[], Any]]:
        router, metrics, engines = layout_ports(services)

        def plan() -> Any:  # the layout's inventory with the drawn ports given
            v = copy.deepcopy(variables)
            v.update(pdnode_router_port=router, pdnode_router_metrics_port=metrics)
            for sid, (port, boot) in engines.items():
                role, index = sid.rsplit("-", 1)
                inst = v[f"pdnode_{role}_instances"][int(index)]
                inst["port"] = port
                if role == "prefill":
                    inst["bootstrap_port"] = boot
            return build_plan(v, "local")
        return [router, metrics, *(p for pair in engines.values() for p in pair)], plan
    return draw


def bench_draw() -> tuple[list[int], Callable[[], Any]]:
    ports = bench_ports()
    root = Path("/opt/pdnode-test")
    return ports, lambda: build_plan(bench_node_variables(root / "model", root, root / "key", ports), "benchnode")


HELPERS = {  # the helper -> one draw: (its ports, the plan of its node on them)
    "standin_node": lambda: standin_node_draw,
    "standin_cluster 2P1D": lambda: cluster_draw([[0, 1], [2, 3]], [[4, 5, 6, 7]]),
    "standin_cluster 1P2D": lambda: cluster_draw([[0, 1, 2, 3]], [[4, 5], [6, 7]]),
    "layout_node 1P2D": lambda: layout_draw("1P2D"),
    "layout_node 2P1D": lambda: layout_draw("2P1D"),
    "bench local_node": lambda: bench_draw,
}


@pytest.fixture
def seeded_binds(monkeypatch) -> Iterator[None]:
    """The helpers' socket binding replaced by a seeded draw from the same pool: the same
    sets a lucky machine could give, reproducible, and 10,000 of them in a second. The
    plan's question to the router package about its arguments is left out: to its parser a
    port is any int (it refuses none of these), and each new port would be a new question
    (~25 ms, and a file in the verdict cache)."""
    rng = random.Random(46)  # noqa: S311 - a reproducible draw of test ports, no secret
    pool = standin_node_module._listen_ports()
    for module in (standin_node_module, verify_node_module):  # tests/verify imports node.py as `node`
        monkeypatch.setattr(module, "_bind_free", lambda n: rng.sample(pool, n))
    monkeypatch.setattr(router_judge, "check", lambda *args, **kwargs: None)
    yield


@pytest.mark.parametrize("helper", HELPERS)
def test_the_port_draw_passes_10000_draws(helper, seeded_binds):
    draw = HELPERS[helper]()
    t0, built, refused = time.monotonic(), 0, []
    for n in range(DRAWS):
        ports, plan = draw()
        assert len(set(ports)) == len(ports), ports
        if n == 0 or at_risk(ports):
            built += 1
            try:
                plan()
            except PlanError as exc:
                refused.append((ports, str(exc).splitlines()[:3]))
    assert refused == [], f"{len(refused)} of {DRAWS} draws refused by the plan, the first: {refused[0]}"
    # the draws did reach sets the plan could refuse (a port in another's DP range): the
    # plan judged those, not only the first
    assert built > 10, built
    print(f"{helper}: {DRAWS} draws, {built} plans built, {time.monotonic() - t0:.2f} s")
