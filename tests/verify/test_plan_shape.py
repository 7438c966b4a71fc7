"""The verifier reads the plan build_plan makes (inventories/*), and the hand-built plan
of the unit tests (nodeplan.contract_plan) has the same shape where the verifier reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from nodeplan import contract_plan

from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan
from pdnode.verify.checks import all_checks
from pdnode.verify.config import build_run

REPO = Path(__file__).resolve().parents[2]
ENGINE_KEYS = {"id", "role", "name", "unit", "url", "args"}
ROUTER_ARGS = {"host", "port", "prometheus_host", "prometheus_port", "prefill", "decode"}


def real_plan(inventory: str) -> dict:
    hv = load_inventory(str(REPO / "inventories" / inventory), None)
    return build_plan(hv.variables, hv.host).as_dict()


@pytest.mark.parametrize("inventory", ["demo", "gpu01-2p1d", "gpu01-1p2d"])
def test_contract_plan_reads_like_the_real_one(inventory):
    real, fake = real_plan(inventory), contract_plan()
    for plan in (real, fake):
        services = plan["services"]
        assert list(services)[-1] == "router"
        for sid, svc in services.items():
            if svc["role"] in ("prefill", "decode"):
                assert ENGINE_KEYS <= set(svc) and svc["id"] == sid, (inventory, sid)
                assert ("bootstrap_port" in svc) == (svc["role"] == "prefill")
        assert ROUTER_ARGS <= set(services["router"]["args"]), inventory


@pytest.mark.parametrize(("inventory", "prefills", "decodes"), [("gpu01-2p1d", 2, 1), ("gpu01-1p2d", 1, 2)])
def test_every_instance_of_a_real_plan_is_checked(inventory, prefills, decodes):
    plan = real_plan(inventory)
    run = build_run(plan, env={}, on_node=True)
    ids = [i.id for i in run.targets.instances]
    assert ids == [f"prefill-{n}" for n in range(prefills)] + [f"decode-{n}" for n in range(decodes)]
    checks = [c.id for c in all_checks(run)]
    for iid in ids:
        assert iid in checks and f"disaggregation.{iid}" in checks
    assert [c for c in checks if c.startswith("bootstrap.")] == [f"bootstrap.prefill-{n}" for n in range(prefills)]
    # what the router was told is what the router check expects, instance by instance
    assert run.expect.router_prefill == [(i.router_url, i.bootstrap_port) for i in run.targets.role("prefill")]
    assert run.expect.router_decode == [i.router_url for i in run.targets.role("decode")]
    assert run.expect.units == [plan["services"][s]["unit"] for s in plan["services"]]
    for i in run.targets.role("prefill"):
        assert i.bootstrap_url == f"http://127.0.0.1:{plan['services'][i.id]['bootstrap_port']}"
        assert i.ranks == plan["services"][i.id]["args"]["tp_size"]


def test_the_threshold_table_exists_once():
    """core/inventory/thresholds.py is the table; the inventory's validation and docs read the same
    keys (pdnode.core.inventory.fields), the alert rules a subset (pdnode.core.plan.monitoring)."""
    from pdnode.core.inventory import fields
    from pdnode.core.plan import monitoring
    from pdnode.core.inventory import thresholds

    assert fields.THRESHOLD_KEYS == thresholds.THRESHOLD_KEYS
    assert set(monitoring.RULE_THRESHOLDS) <= set(thresholds.THRESHOLDS)
    for key, t in thresholds.THRESHOLDS.items():
        assert t.metric in thresholds.REQUIRED_METRICS[t.role] and key in thresholds.REQUIRED_METRICS[t.role][t.metric]
