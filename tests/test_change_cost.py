"""What a planned restart costs (pdnode.core.change.cost): the layout decides whether requests
are dropped, the plan and the readiness timeout bound the outage, and the measured
figures the runbooks quote still stand in docs/measurements.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from pdnode.core.change import cost as change_cost
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 1800
DRAIN = 300  # pdnode_drain_timeout_s: the lone instance is out of the router while its requests finish


def plan_of(name: str) -> dict:
    hv = load_inventory(ROOT / "inventories" / name)
    return build_plan(hv.variables, hv.host).as_dict()


def layout(prefills: int, decodes: int, coupled: bool = True, delay: int = 15) -> dict:
    """A one-host plan of the shape change_cost reads: services (role, unit, coupling)
    and the cluster's engines (every host's)."""
    services: dict[str, dict] = {}
    for role, n in (("prefill", prefills), ("decode", decodes)):
        for i in range(n):
            services[f"{role}-{i}"] = {"role": role, "unit": f"pd-{role}-{i}.service", "upholds": [],
                                       "bound_to": None, "restart_delay_s": None}
    if prefills == 1 and coupled:
        services["prefill-0"]["upholds"] = [s["unit"] for s in services.values() if s["role"] == "decode"]
    else:
        for s in services.values():
            if s["role"] == "prefill":
                s["restart_delay_s"] = delay
    services["router"] = {"role": "router", "unit": "pd-router.service"}
    engines = {sid: {"role": s["role"]} for sid, s in services.items() if sid != "router"}
    return {"services": services, "cluster": {"engines": engines}, "settings": {"pdnode_drain_timeout_s": DRAIN}}


def test_one_prefill_one_decode_every_restart_is_an_outage():
    costs = change_cost.costs(layout(1, 1), TIMEOUT)
    assert {k: c.drops for k, c in costs.items()} == {"prefill-0": True, "decode-0": True, "router": True,
                                                      "upgrade": True, "router-upgrade": True}
    # the decode bound to the prefill restarts after it: two readiness gates in turn
    assert costs["prefill-0"].units == ("pd-prefill-0.service", "pd-decode-0.service")
    assert costs["prefill-0"].outage_max_s == DRAIN + 2 * TIMEOUT
    assert costs["decode-0"].outage_max_s == DRAIN + TIMEOUT
    assert costs["router"].outage_max_s == TIMEOUT  # not drained: restarted by itself
    assert costs["upgrade"].outage_max_s == DRAIN + 2 * TIMEOUT
    assert costs["router-upgrade"].outage_max_s == DRAIN + 2 * TIMEOUT


def test_two_of_each_role_restart_without_a_drop_when_drained():
    costs = change_cost.costs(layout(2, 2), TIMEOUT)
    for iid in ("prefill-0", "prefill-1", "decode-0", "decode-1"):
        assert not costs[iid].drops and costs[iid].outage_max_s is None, costs[iid]
    assert costs["router"].drops  # one router: clients connect to it
    # An upgrade that keeps the router's package and version leaves the router running (its
    # own venv): nothing dropped. One that changes the router restarts it: an outage.
    assert not costs["upgrade"].drops and "pd-router.service" not in costs["upgrade"].units
    assert costs["router-upgrade"].drops and costs["router-upgrade"].why == costs["router"].why
    assert costs["router-upgrade"].units[-1] == "pd-router.service"


def test_without_the_drain_a_peered_instance_still_loses_its_requests_in_flight():
    cost = change_cost.instance_cost(layout(2, 2), "decode-1", TIMEOUT, drain=False)
    assert cost.drops and cost.outage_max_s is None
    assert "in flight" in cost.why


@pytest.mark.parametrize(("prefills", "decodes", "dropping"), [
    (2, 1, {"decode-0"}),  # 2P1D: the one decode
    (1, 2, {"prefill-0"}),  # 1P2D: the one prefill (uncoupled here)
    (3, 1, {"decode-0"}),
])
def test_only_the_lone_instance_of_a_role_drops(prefills, decodes, dropping):
    costs = change_cost.costs(layout(prefills, decodes, coupled=False), TIMEOUT)
    engines = {k for k, c in costs.items() if k not in ("router", "upgrade", "router-upgrade") and c.drops}
    assert engines == dropping


def test_a_lone_prefill_waits_for_the_decodes_to_drop_it_first():
    cost = change_cost.instance_cost(layout(1, 2, coupled=False, delay=15), "prefill-0", TIMEOUT)
    assert cost.drops and cost.outage_max_s == DRAIN + 15 + TIMEOUT


def test_the_reference_inventories():
    assert change_cost.role_counts(plan_of("gpu01")) == {"prefill": 1, "decode": 1}
    two = change_cost.costs(plan_of("gpu01-2p1d"), TIMEOUT)
    assert [k for k, c in two.items() if c.drops and c.outage_max_s] == ["decode-0", "router", "upgrade",
                                                                          "router-upgrade"]
    assert two["prefill-0"].outage_max_s is None
    one_two = change_cost.costs(plan_of("gpu01-1p2d"), TIMEOUT)
    assert one_two["prefill-0"].drops and not one_two["decode-0"].drops and not one_two["decode-1"].drops


def test_the_quoted_figures_stand_in_measurements_md():
    """Each figure the runbooks quote is in the row it names (a re-measurement that
    changes the row must change the quote)."""
    text = (ROOT / "docs" / "measurements.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    for what, (row, figure) in change_cost.MEASURED.items():
        hits = [r for r in rows if r.split("|")[1].strip().startswith(row)]
        assert len(hits) == 1, f"{what}: no single row of docs/measurements.md starts with {row!r}"
        assert figure in hits[0], f"{what}: {figure!r} is not in the row {hits[0]!r}"
    assert change_cost.ROUTER_RESTART in change_cost.MEASURED


def test_an_upgrade_restarts_a_bound_decode_once_with_its_prefill():
    cost = change_cost.upgrade_cost(layout(1, 2), TIMEOUT, router=True)
    assert cost.units == ("pd-prefill-0.service", "pd-decode-0.service", "pd-decode-1.service", "pd-router.service")
    assert cost.outage_max_s == DRAIN + 2 * TIMEOUT
