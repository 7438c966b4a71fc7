"""What the plan does not guess (issue 45, item 5): a change whose steps did not all run (an
interrupted deploy) and engine units the node runs that its record does not name. The
record names the layout a change started from until the handlers have taken its steps
(``from``; pd_services writes the converged record after them); a rerun of the same
inventory takes the steps again, another layout is refused until that change is finished,
and so is a node running units of the prefix that neither the record nor the inventory
names. Through build_plan, with the records it writes."""

from __future__ import annotations

import json

import pytest
from planvars import changed

from pdnode.commands import diff
from pdnode.core.change import identity
from pdnode.core.plan.build import build_plan


@pytest.fixture(scope="module")
def base():
    from pdnode.core.inventory.read import load_inventory
    from planvars import ROOT
    return load_inventory(ROOT / "inventories" / "gpu01", "gpu01").variables


def layout(base, prefills, decodes):
    def decode(g):
        return {"gpus": g, "tp_size": len(g), "attn_dp_size": len(g), "ep_size": len(g), "moe_dense_tp_size": 1,
                "enable_dp_lm_head": True}
    return changed(base, {"pdnode_prefill_instances": [{"gpus": g, "tp_size": len(g)} for g in prefills],
                          "pdnode_decode_instances": [decode(g) for g in decodes]})


def plan(v, record=None, strangers=None):
    return build_plan(v, "gpu01", running={"gpu01": json.dumps(record)} if record else None,
                      strangers=strangers).as_dict()


@pytest.fixture(scope="module")
def two_to_three(base):
    """2P2D (converged), then the deploy to 3P1D: its record while its steps run."""
    two = plan(layout(base, [[0, 1], [2, 3]], [[4, 5], [6, 7]]))
    three = plan(layout(base, [[0, 1], [2, 3], [4, 5]], [[6, 7]]), two["change"]["converged"])
    return two, three


def test_the_record_names_where_a_change_started_until_its_steps_are_done(two_to_three):
    two, three = two_to_three
    assert "from" not in two["change"]["record"] and two["change"]["record"] == two["change"]["converged"]
    assert three["change"]["record"]["from"] == two["change"]["converged"]["engines"]
    assert three["change"]["converged"] == identity.converged(three["change"]["record"])
    # the role writes the record with "from" and the converged one once its handlers ran
    entry = next(f for f in three["roles"]["pd_services"]["files"] if f["path"] == three["change"]["record_file"])
    assert json.loads(entry["content"]) == three["change"]["record"]
    assert json.loads(entry["converged"]) == three["change"]["converged"]


def test_a_rerun_of_an_interrupted_change_takes_its_steps_again_and_writes_the_same_record(base, two_to_three):
    _, three = two_to_three
    again = plan(layout(base, [[0, 1], [2, 3], [4, 5]], [[6, 7]]), three["change"]["record"])
    assert again["change"]["steps"] == three["change"]["steps"] and again["change"]["refusal"] is None
    assert again["change"]["record"] == three["change"]["record"]  # nothing to write: still unfinished
    # once finished, the same inventory changes nothing
    done = plan(layout(base, [[0, 1], [2, 3], [4, 5]], [[6, 7]]), three["change"]["converged"])
    assert done["change"]["steps"] == [] and "from" not in done["change"]["record"]


def test_another_layout_after_an_interrupted_change_is_refused_in_one_line(base, two_to_three):
    _, three = two_to_three
    other = plan(layout(base, [[0, 1, 2, 3]], [[4, 5], [6, 7]]), three["change"]["record"])
    text = other["change"]["refusal"]
    assert text and "\n" not in text, text
    assert "an earlier deploy was interrupted" in text and "decode-1, prefill-0, prefill-1, prefill-2" in text
    assert three["change"]["record_file"] in text and "run the deploy again with the inventory it had" in text
    # the override of a window does not accept it: nothing says what runs
    assert plan(changed(layout(base, [[0, 1, 2, 3]], [[4, 5], [6, 7]]), {"pdnode_allow_unavailable": True}),
                three["change"]["record"])["change"]["refusal"] == text


def test_hosts_of_one_layout_where_only_some_finished_the_change_read_as_unfinished(two_to_three):
    _, three = two_to_three
    unfinished, finished = json.dumps(three["change"]["record"]), json.dumps(three["change"]["converged"])
    got = identity.read({"a": finished, "b": unfinished})
    assert got.before is not None and set(got.running) == set(json.loads(unfinished)["from"])
    assert identity.read({"a": finished, "b": finished}).before is None
    other = dict(three["change"]["record"], **{"from": {}})
    with pytest.raises(identity.RecordError, match="recorded different layouts"):
        identity.read({"a": unfinished, "b": json.dumps(other)})


def test_engine_units_the_record_and_the_inventory_do_not_name_are_refused(base, two_to_three):
    two, three = two_to_three
    v = layout(base, [[0, 1], [2, 3]], [[4, 5], [6, 7]])
    named = ["sglang-pd-decode-0.service", "sglang-pd-router.service", "sglang-pd-pair-probe.service"]
    quiet = plan(v, two["change"]["converged"], {"gpu01": named})
    assert quiet["change"]["strangers"] == {} and quiet["change"]["refusal"] is None
    odd = plan(v, two["change"]["converged"], {"gpu01": [*named, "sglang-pd-decode-7.service"]})
    assert odd["change"]["strangers"] == {"gpu01": ["sglang-pd-decode-7.service"]}
    text = odd["change"]["refusal"]
    assert "\n" not in text and "gpu01 runs 1 engine unit(s)" in text and "sglang-pd-decode-7.service" in text
    assert "systemctl disable --now sglang-pd-decode-7.service" in text
    # both layouts of an unfinished change are the record's: the old decode-0 is known
    rerun = plan(layout(base, [[0, 1], [2, 3], [4, 5]], [[6, 7]]), three["change"]["record"],
                 {"gpu01": ["sglang-pd-decode-0.service"]})
    assert rerun["change"]["strangers"] == {} and rerun["change"]["refusal"] is None
    # a unit of the new layout is the plan's (started before the deploy: it restarts it)
    assert plan(layout(base, [[0, 1], [2, 3], [4, 5]], [[6, 7]]), two["change"]["converged"],
                {"gpu01": ["sglang-pd-prefill-2.service"]})["change"]["strangers"] == {}


def test_pdnode_diff_prints_the_refusal_and_exits_1(base, two_to_three):
    two, _ = two_to_three
    odd = plan(layout(base, [[0, 1], [2, 3]], [[4, 5], [6, 7]]), two["change"]["converged"],
               {"gpu01": ["sglang-pd-decode-7.service"]})
    doc, safe = diff.report(odd["change"], "the node", "inv")
    assert not safe and doc["refusal"] == odd["change"]["refusal"] and doc["windows"] == []
    assert f"the deploy refuses it: {odd['change']['refusal']}" in diff.text(doc)
    fine, ok = diff.report(plan(layout(base, [[0, 1], [2, 3]], [[4, 5], [6, 7]]),
                                two["change"]["converged"])["change"], "the node", "inv")
    assert ok and fine["refusal"] is None
