"""A layout change across hosts (issue 45): each host's deploy takes its own steps in the
plan's order, the hosts side by side, so a role the plan's order keeps serving may still
reach zero when one host stops its last instance before another host has started one.
The plan refuses such a change (rule layout-change-keeps-serving) unless accepted; on
gpu-pair (prefills on gpu01, the decode on gpu02), through build_plan with its record."""

from __future__ import annotations

import json

import pytest
from planvars import ROOT

from pdnode.commands import diff
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan

PAIR = ROOT / "inventories" / "gpu-pair"
DECODE = {"tp_size": 4, "attn_dp_size": 4, "ep_size": 4, "moe_dense_tp_size": 1, "enable_dp_lm_head": True}
PREFILL = {"hosts": ["gpu01"], "gpus": [0, 1, 2, 3], "tp_size": 4}


def peers(decodes: list[dict], **more) -> dict[str, dict]:
    out = {}
    for host in ("gpu01", "gpu02"):
        v = dict(load_inventory(PAIR, host).variables)
        v.update(pdnode_prefill_instances=[PREFILL], pdnode_decode_instances=decodes, **more)
        out[host] = v
    return out


def plan(decodes: list[dict], record=None, **more) -> dict:
    p = peers(decodes, **more)
    running = {h: json.dumps(record) for h in p} if record else None
    return build_plan(p["gpu02"], "gpu02", p, running=running).as_dict()


@pytest.fixture(scope="module")
def one_decode_on_gpu02():
    return plan([{"hosts": ["gpu02"], "gpus": [0, 1, 2, 3], **DECODE}])["change"]["converged"]


def test_a_decode_moving_to_another_host_is_refused_where_the_hosts_run_side_by_side(one_decode_on_gpu02):
    """The plan's order starts the new decode on gpu01 before the old one on gpu02 stops,
    but gpu02's deploy may stop it first: refused in one line, unless accepted."""
    moved = [{"hosts": ["gpu01"], "gpus": [4, 5, 6, 7], "name": "fresh", **DECODE}]
    got = plan(moved, one_decode_on_gpu02)["change"]
    assert [s["label"] for s in got["steps"]] == ["start decode-fresh", "stop decode-0"]
    assert [s["hosts"] for s in got["steps"]] == [["gpu01"], ["gpu02"]]
    assert got["windows"] == [] and got["side_by_side"] == ["decode"]
    text = got["refusal"]
    assert text and "\n" not in text and "run on gpu01 and gpu02 side by side" in text, text
    assert "change one host at a time" in text and '"pdnode_allow_unavailable": true' in text
    # upgrade.yml switches one host at a time: the hosts' steps do not overlap there
    assert got["refusal_one_host_at_a_time"] is None
    accepted = plan(moved, one_decode_on_gpu02, pdnode_allow_unavailable=True)["change"]
    assert accepted["refusal"] is None and accepted["side_by_side"] == ["decode"]
    doc, safe = diff.report(got, "the node", "inv")
    assert not safe and "side by side" in diff.text(doc)


def test_steps_on_one_host_or_with_a_peer_serving_are_not_refused(one_decode_on_gpu02):
    # both steps on gpu02: its deploy takes them in the plan's order
    here = plan([{"hosts": ["gpu02"], "gpus": [4, 5, 6, 7], "name": "fresh", **DECODE}], one_decode_on_gpu02)["change"]
    assert {h for s in here["steps"] for h in s["hosts"]} == {"gpu02"}
    assert here["side_by_side"] == [] and here["refusal"] is None
    # two decodes, one moving to gpu01: the other serves whatever the hosts do
    two = plan([{"hosts": ["gpu02"], "gpus": [0, 1, 2, 3], **DECODE}, {"hosts": ["gpu02"], "gpus": [4, 5, 6, 7],
                                                                        **DECODE}])["change"]["converged"]
    moved = plan([{"hosts": ["gpu02"], "gpus": [0, 1, 2, 3], **DECODE},
                  {"hosts": ["gpu01"], "gpus": [4, 5, 6, 7], "name": "fresh", **DECODE}], two)["change"]
    assert {h for s in moved["steps"] for h in s["hosts"]} == {"gpu01", "gpu02"}
    assert moved["side_by_side"] == [] and moved["refusal"] is None
