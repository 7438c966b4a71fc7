"""Restarts that an instance's keys do not show (issue 45, item 4): a new release (the
interpreter of another venv) or a new model commit restarts every engine that stays. The
plan sees them from what each unit's process runs (the layout_read module's python and
model_commit), else from the record's ``runs``, orders them like any restart (one at a
time, each role serving) and refuses the ones that leave a role at zero -- on gpu01, whose
one prefill and one decode cannot restart without a window."""

from __future__ import annotations

import json

import pytest
from planvars import changed

from pdnode.core.change import cost, identity, window
from pdnode.core.inventory.model_source import Lock, ManifestFile
from pdnode.core.plan.build import build_plan

TWO_BY_TWO = {"pdnode_prefill_instances": [{"gpus": [0, 1], "tp_size": 2}, {"gpus": [2, 3], "tp_size": 2}],
              "pdnode_decode_instances": [{"gpus": [g, g + 1], "tp_size": 2, "attn_dp_size": 2, "ep_size": 2,
                                           "moe_dense_tp_size": 1, "enable_dp_lm_head": True} for g in (4, 6)]}


@pytest.fixture(scope="module")
def base():
    from pdnode.core.inventory.read import load_inventory
    from planvars import ROOT
    return load_inventory(ROOT / "inventories" / "gpu01", "gpu01").variables


def new_release(v):
    """The same layout on another release: another Mooncake CUDA 13 build names another venv."""
    return changed(v, {"pdnode_mooncake_cuda13_version": v["pdnode_mooncake_cuda13_version"] + ".post9"})


def plan(v, record=None, processes=None, inventory_dir=None):
    return build_plan(v, "gpu01", None, inventory_dir, running={"gpu01": json.dumps(record)} if record else None,
                      processes=processes).as_dict()


def engines_running(p, **runs):
    """The layout_read module's answer for P's engine units, each process running RUNS."""
    return {e["unit"]: {"python": p["install"]["python"], "model_commit": None, **runs}
            for e in p["cluster"]["engines"].values()}


def test_the_record_holds_what_every_engine_runs_beyond_its_keys(base):
    p = plan(base)
    for entry in p["change"]["record"]["engines"].values():
        assert entry["runs"] == {"python": p["install"]["python"], "model_commit": None}


def test_a_new_release_on_2p2d_restarts_each_engine_in_turn_with_each_role_serving(base):
    old = plan(changed(base, TWO_BY_TWO))
    new = plan(new_release(changed(base, TWO_BY_TWO)), old["change"]["converged"], engines_running(old))
    assert new["install"]["python"] != old["install"]["python"]
    steps = new["change"]["steps"]
    assert sorted(s["label"] for s in steps) == sorted(f"restart {i} (a new release)"
                                                       for i in ("prefill-0", "prefill-1", "decode-0", "decode-1"))
    assert new["change"]["windows"] == [] and new["change"]["refusal"] is None
    assert all(s["serving"] == {"prefill": 2, "decode": 2} for s in steps)


def test_a_new_release_on_1p1d_is_refused_naming_the_restart_and_runs_with_the_override(base):
    old = plan(base)
    text = plan(new_release(base), old["change"]["converged"], engines_running(old))["change"]["refusal"]
    assert text and "\n" not in text, text
    # the first step that leaves a role at zero; the fix is a second instance of the role
    assert "step 1 (restart decode-0 (a new release))" in text and "keeps a decode serving" in text
    assert "add a second decode" in text and '"pdnode_allow_unavailable": true' in text
    ok = plan(changed(new_release(base), {"pdnode_allow_unavailable": True}), old["change"]["converged"],
              engines_running(old))
    assert ok["change"]["refusal"] is None
    assert {w["role"] for w in ok["change"]["windows"]} == {"prefill", "decode"}


def test_what_the_process_runs_wins_over_the_record(base):
    """A deploy interrupted after it wrote the new record, before the restarts: the
    processes still run the old release, so the rerun restarts them (and refuses on
    1P1D); a process already on the new release is not restarted again."""
    old = plan(base)
    target = new_release(base)
    written = plan(target, old["change"]["record"], engines_running(old))["change"]["record"]
    still_old = plan(target, written, engines_running(old))
    assert {s["label"] for s in still_old["change"]["steps"]} == {"restart prefill-0 (a new release)",
                                                                  "restart decode-0 (a new release)"}
    assert still_old["change"]["refusal"]
    switched = plan(target, old["change"]["converged"], engines_running(plan(target)))
    assert switched["change"]["steps"] == [] and switched["change"]["refusal"] is None


def test_without_a_known_value_nothing_restarts_for_it(base):
    """A stopped unit has nothing to lose; a record from before ``runs`` says nothing."""
    old = plan(base)
    stopped = {u: {"python": None, "model_commit": None} for u in engines_running(old)}
    assert plan(new_release(base), old["change"]["converged"], stopped)["change"]["steps"] == []
    before_runs = json.loads(json.dumps(old["change"]["converged"]))
    for entry in before_runs["engines"].values():
        del entry["runs"]
    assert identity.read({"gpu01": json.dumps(before_runs)}).engines["prefill-0"].runs == {}
    assert plan(new_release(base), before_runs)["change"]["steps"] == []
    # a process that set its own title: its argv[0] is no interpreter, the record decides
    titled = {u: {"python": "sglang::http_server", "model_commit": None} for u in engines_running(old)}
    assert plan(base, old["change"]["converged"], titled)["change"]["steps"] == []
    # offline (no processes read), the record's runs decide: `pdnode diff --from`
    assert plan(new_release(base), old["change"]["converged"])["change"]["refusal"]


def _locked(tmp_path, name, commit):
    where = tmp_path / name
    where.mkdir()
    (where / ".model.lock.json").write_text(Lock("hf://o/m@main", "o/m", "main", commit, (
        ManifestFile("config.json", 800, None),)).text())
    return str(where)


def test_a_new_model_commit_restarts_every_engine_and_on_1p1d_is_refused(base, tmp_path):
    v = changed(base, {"pdnode_model_source": "hf://o/m@main", "pdnode_model_kind": "moe",
                       "pdnode_model_weights_gb": 50.0})
    first, second = "1" * 40, "2" * 40
    old = plan(v, inventory_dir=_locked(tmp_path, "first", first))
    assert {e["runs"]["model_commit"] for e in old["change"]["record"]["engines"].values()} == {first}
    running = engines_running(old, model_commit=first)
    new = plan(v, old["change"]["converged"], running, _locked(tmp_path, "second", second))
    why = f"model commit {first[:12]} -> {second[:12]}"
    assert {s["label"] for s in new["change"]["steps"]} == {f"restart prefill-0 ({why})", f"restart decode-0 ({why})"}
    assert why in new["change"]["refusal"]
    same = plan(v, old["change"]["converged"], running, _locked(tmp_path, "again", first))
    assert same["change"]["steps"] == [] and same["change"]["refusal"] is None
    two = plan(changed(v, TWO_BY_TWO), inventory_dir=_locked(tmp_path, "two", first))
    moved = plan(changed(v, TWO_BY_TWO), two["change"]["converged"], engines_running(two, model_commit=first),
                 _locked(tmp_path, "two-second", second))
    assert len(moved["change"]["steps"]) == 4 and moved["change"]["refusal"] is None


@pytest.mark.parametrize("prefills, decodes", [([[0, 1, 2, 3]], [[4, 5, 6, 7]]), ([[0, 1], [2, 3]], [[4, 5], [6, 7]]),
                                               ([[0, 1], [2, 3]], [[4, 5, 6, 7]]), ([[0], [1], [2]], [[4, 5]]),
                                               ([[0, 1, 2, 3]], [[4, 5], [6, 7]])])
def test_the_runbooks_upgrade_command_accepts_the_window_exactly_where_the_plan_refuses(base, prefills, decodes):
    """cost.upgrade_refused (the upgrade runbook's command) against the plan's refusal of
    the same layout on a new release."""
    def decode(g):
        dp = {"attn_dp_size": len(g), "ep_size": len(g), "moe_dense_tp_size": 1, "enable_dp_lm_head": True}
        return {"gpus": g, "tp_size": len(g), **(dp if len(g) > 1 else {})}

    v = changed(base, {"pdnode_prefill_instances": [{"gpus": g, "tp_size": len(g)} for g in prefills],
                       "pdnode_decode_instances": [decode(g) for g in decodes]})
    old = plan(v)
    refusal = plan(new_release(v), old["change"]["converged"], engines_running(old))["change"]["refusal"]
    assert cost.upgrade_refused(old) == bool(refusal), refusal
    assert not cost.upgrade_refused(plan(changed(v, {"pdnode_allow_unavailable": True})))


def test_the_deploy_measures_each_accepted_window_from_the_steps_it_took(base):
    """The view gives each window's steps as the handlers take them (a bound decode's
    restart is within its prefill's); window.measured reads the handlers' [kind, id, began]."""
    old = plan(base)
    ok = plan(changed(new_release(base), {"pdnode_allow_unavailable": True}), old["change"]["converged"],
              engines_running(old))
    view = {w["role"]: w for w in ok["roles"]["pd_services"]["windows"]}
    assert view["decode"]["steps"] == [{"kind": "restart", "id": "decode-0"}, {"kind": "restart", "id": "prefill-0"}]
    assert view["prefill"]["steps"] == [{"kind": "restart", "id": "prefill-0"}]
    # the handlers took one step: prefill-0's restart (decode-0 restarts with it)
    lines = window.measured(list(view.values()), [["restart", "prefill-0", 100.0]], 112.5)
    assert len(lines) == 2 and all("measured 12.5 s by the deploy" in line for line in lines), lines
    assert f"predicted {view['prefill']['expected_s']:.1f} s" in lines[1]
    # a window from its first step's beginning to its last step's end (the next beginning)
    two = [{"role": "decode", "expected_s": 20.0, "steps": [{"kind": "stop", "id": "decode-1"},
                                                             {"kind": "restart", "id": "decode-0"}]}]
    taken = [["restart", "prefill-1", 0.0], ["stop", "decode-1", 3.0], ["restart", "decode-0", 9.0],
             ["restart", "prefill-0", 24.0]]
    assert window.measured(two, taken, 30.0) == [
        "window without a decode: measured 21.0 s by the deploy (from stop decode-1 to restart decode-0 done), "
        "predicted 20.0 s"]
    assert "not measured here" in window.measured(two, [["restart", "prefill-0", 1.0]], 2.0)[0]
