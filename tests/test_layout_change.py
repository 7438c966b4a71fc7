"""A layout change as steps (pdnode.core.change.layout_change, issue 45): identity by what
an instance is, and an order that keeps each role serving wherever some order can --
checked on the issue's cases and against a brute-force search over every order of 240
generated layout pairs (add, remove, move, resize, rename, change arguments; 1-3 hosts)."""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from pdnode.core.change import layout_change as lc
from pdnode.core.change.layout_change import Instance


def inst(iid: str, gpus: list[int], host: str = "h1", shape: str = "", named: bool = False) -> Instance:
    return Instance(iid, iid.split("-")[0], tuple((host, g) for g in gpus), shape, named)


def labels(plan) -> list[str]:
    return [s.action.label for s in plan.steps]


def test_2p2d_to_3p1d_and_back_keeps_the_decode_that_stays_and_serves_throughout():
    """The issue's field case: the decode on GPUs 6-7 is decode-1 before and decode-0 after;
    it is the same instance (same GPUs, same arguments), so it keeps running."""
    p2d2 = [inst("prefill-0", [0, 1]), inst("prefill-1", [2, 3]), inst("decode-0", [4, 5]), inst("decode-1", [6, 7])]
    p3d1 = [inst("prefill-0", [0, 1]), inst("prefill-1", [2, 3]), inst("prefill-2", [4, 5]), inst("decode-0", [6, 7])]
    m, plan = lc.plan_change(p2d2, p3d1)
    assert [(o.id, n.id) for o, n in m.keep] == [("prefill-0", "prefill-0"), ("prefill-1", "prefill-1"),
                                                  ("decode-1", "decode-0")]
    assert labels(plan) == ["stop decode-0", "start prefill-2"] and plan.zero_steps == []
    assert [s.serving for s in plan.steps] == [{"prefill": 2, "decode": 1}, {"prefill": 3, "decode": 1}]
    back = lc.plan_change(p3d1, p2d2)[1]
    assert labels(back) == ["stop prefill-2", "start decode-0"] and back.zero_steps == []


def test_4p_tp1_to_2p_tp2_needs_the_order_that_keeps_two_old_prefills():
    old = [inst(f"prefill-{g}", [g], shape="tp1") for g in range(4)] + [inst("decode-0", [4, 5]),
                                                                        inst("decode-1", [6, 7])]
    new = [inst("prefill-0", [0, 1], shape="tp2"), inst("prefill-1", [2, 3], shape="tp2"),
           inst("decode-0", [4, 5]), inst("decode-1", [6, 7])]
    plan = lc.plan_change(old, new)[1]
    assert plan.zero_steps == [] and plan.exact
    # each new prefill starts once the two it replaces stopped, while the other two serve
    seq = labels(plan)
    assert seq.index("start prefill-0") > max(seq.index("stop prefill-0"), seq.index("stop prefill-1"))
    assert min(s.serving["prefill"] for s in plan.steps) == 1


def test_1p2d_to_2p1d_has_no_order_that_keeps_a_prefill():
    old = [inst("prefill-0", [0, 1, 2, 3]), inst("decode-0", [4, 5]), inst("decode-1", [6, 7])]
    new = [inst("prefill-0", [0, 1]), inst("prefill-1", [2, 3]), inst("decode-0", [4, 5, 6, 7])]
    plan = lc.plan_change(old, new)[1]
    # the new prefills need the old one's GPUs, the new decode both old decodes': each role
    # is at zero for a stop and a start, one role at a time, whatever the order
    assert labels(plan) == ["stop decode-0", "stop decode-1", "start decode-0", "stop prefill-0", "start prefill-0",
                            "start prefill-1"]
    assert [s.at_zero for s in plan.zero_steps] == [("decode",), ("decode",), ("prefill",), ("prefill",)]
    assert brute_force_best(lc.match(old, new)) == 4


def test_a_named_instance_is_itself_wherever_it_stands_and_a_moved_one_restarts_elsewhere():
    old = [inst("decode-fast", [4, 5], named=True), inst("prefill-0", [0, 1])]
    new = [inst("prefill-0", [0, 1]), inst("decode-fast", [6, 7], named=True)]
    m = lc.match(old, new)
    assert [o.id for o in m.stop] == ["decode-fast"] and [n.id for n in m.start] == ["decode-fast"]
    plan = lc.order(m)
    # one name, one unit: it stops where it ran before it starts where it runs now (no surge;
    # an unnamed instance would be a new one, and could start first)
    assert labels(plan) == ["stop decode-fast", "start decode-fast"]
    assert [s.at_zero for s in plan.zero_steps] == [("decode",), ("decode",)]


def test_changed_arguments_restart_in_place():
    old = [inst("prefill-0", [0, 1], shape="a"), inst("prefill-1", [2, 3], shape="a"), inst("decode-0", [4, 5])]
    new = [inst("prefill-0", [0, 1], shape="b"), inst("prefill-1", [2, 3], shape="b"), inst("decode-0", [4, 5])]
    plan = lc.plan_change(old, new)[1]
    assert labels(plan) == ["restart prefill-0", "restart prefill-1"] and plan.zero_steps == []
    lone = lc.plan_change(old[2:], [inst("decode-0", [4, 5], shape="c")])[1]
    assert [s.at_zero for s in lone.steps] == [("decode",)]


def test_the_shape_leaves_out_what_follows_from_the_index():
    a = lc.shape_of({"tp_size": 2, "port": 30000, "disaggregation_bootstrap_port": 8998, "mem_fraction_static": 0.8})
    b = lc.shape_of({"mem_fraction_static": 0.8, "tp_size": 2, "port": 30010, "disaggregation_bootstrap_port": 9000})
    assert a == b and a != lc.shape_of({"tp_size": 4, "mem_fraction_static": 0.8})


# --- against every order ---------------------------------------------------------------------

def brute_force_best(m: lc.Matching) -> int:
    """The fewest role-steps at zero over EVERY order whose starts wait for their GPUs."""
    acts = lc.actions(m)
    start = lc._counts(m)
    roles = [r for r in lc.ROLES if start[r] > 0]
    best = None
    for perm in itertools.permutations(range(len(acts))):
        done: set[int] = set()
        c, total, ok = dict(start), 0, True
        for i in perm:
            if not lc._ready(acts[i], frozenset(done), acts):
                ok = False
                break
            total += lc.cost(c, acts[i], roles)
            c = lc._apply(c, acts[i])[0]
            done.add(i)
        if ok and (best is None or total < best):
            best = total
    assert best is not None
    return best


def random_layout(rng: random.Random, hosts: list[str], gpus: int, named: bool) -> list[Instance]:
    """Instances over the hosts' GPUs: each a role, a run of 1, 2 or 4 GPUs, one of two shapes."""
    out, n = [], {"prefill": 0, "decode": 0}
    for host in hosts:
        g = 0
        while g < gpus:
            size = rng.choice([s for s in (1, 2, 4) if g + s <= gpus])
            if rng.random() < 0.8:
                role = rng.choice(lc.ROLES)
                iid = f"{role}-{rng.choice('ab') if named else n[role]}"
                n[role] += 1
                out.append(Instance(iid, role, tuple((host, x) for x in range(g, g + size)),
                                    rng.choice(["s1", "s2"]), named and iid not in {i.id for i in out}))
            g += size
    return out


CASES = []
_rng = random.Random(45)  # noqa: S311 -- reproducible cases, not a secret
while len(CASES) < 240:
    hosts = [f"h{i}" for i in range(_rng.randint(1, 3))]
    gpus = 4 if len(hosts) > 1 else _rng.choice([4, 6, 8])
    named = _rng.random() < 0.2
    old, new = random_layout(_rng, hosts, gpus, named), random_layout(_rng, hosts, gpus, named)
    if len(lc.actions(lc.match(old, new))) <= 7:  # every order of up to 7 steps: at most 5,040
        CASES.append((old, new))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_order_is_as_good_as_the_best_of_every_order(case):
    old, new = CASES[case]
    m = lc.match(old, new)
    plan = lc.order(m)
    got = sum(len(s.at_zero) for s in plan.steps)
    want = brute_force_best(m)
    assert got == want, (labels(plan), want)
    # never a role at zero where some order avoids it
    assert (want == 0) == (plan.zero_steps == [])
    # the steps account for every change, and the counts add up to the new layout
    assert len(plan.steps) == len(m.restart) + len(m.stop) + len(m.start)
    if plan.steps:
        assert plan.steps[-1].serving == {r: sum(1 for i in new if i.role == r) for r in lc.ROLES}


def interleavings(seqs: list[list[lc.Action]]):
    """Every merge of SEQS that keeps each one's order."""
    if all(not s for s in seqs):
        yield []
        return
    for i, s in enumerate(seqs):
        if s:
            for rest in interleavings([*seqs[:i], s[1:], *seqs[i + 1:]]):
                yield [s[0], *rest]


def host_of(a: lc.Action, m: lc.Matching) -> str:
    gpus = next(i.gpus for i in (*m.stop, *m.start, *(n for _, n in m.restart)) if i.id == (a.old if a.kind == "stop"
                                                                                            else a.new))
    return gpus[0][0]


@pytest.mark.parametrize("case", [i for i, (old, _) in enumerate(CASES) if len({h for x in old for h, _ in x.gpus}) > 1])
def test_the_hosts_side_by_side_worst_is_the_worst_of_every_interleaving(case):
    """lc.side_by_side (the deploy's hosts, each taking its own steps in order, at once)
    against every interleaving of the hosts' sequences, on the generated multi-host cases."""
    old, new = CASES[case]
    m = lc.match(old, new)
    plan = lc.order(m)
    where = functools.partial(host_of, m=m)
    seqs: dict[str, list[lc.Action]] = {}
    for step in plan.steps:
        seqs.setdefault(where(step.action), []).append(step.action)
    worst = dict(plan.start)
    for merged in interleavings(list(seqs.values())):  # at most 7 steps: at most 5,040
        c = dict(plan.start)
        for a in merged:
            c, least = lc._apply(c, a)
            worst = {r: min(worst[r], least[r]) for r in lc.ROLES}
    assert lc.side_by_side(plan, where) == worst, [s.action.label for s in plan.steps]


def test_the_generated_pairs_cover_what_the_issue_names():
    kinds = {"keep": 0, "restart": 0, "stop": 0, "start": 0, "zero": 0, "multi_host": 0, "renumbered": 0}
    for old, new in CASES:
        m = lc.match(old, new)
        for k in ("keep", "restart", "stop", "start"):
            kinds[k] += bool(getattr(m, k))
        kinds["zero"] += brute_force_best(m) > 0
        kinds["multi_host"] += len({h for i in old for h, _ in i.gpus}) > 1
        kinds["renumbered"] += any(o.id != n.id for o, n in m.keep)
    assert all(v >= 10 for v in kinds.values()), kinds


def test_beyond_the_exact_limit_the_order_is_greedy_and_still_complete():
    old = [inst(f"prefill-{g}", [g], shape="x") for g in range(8)] + [inst(f"decode-{g}", [g], "h2") for g in range(8)]
    new = [inst(f"prefill-{g}", [g], shape="y") for g in range(8)] + [inst(f"decode-{g}", [g], "h2", "z")
                                                                      for g in range(8)] + [
        inst("prefill-x", [0], "h3"), inst("decode-x", [1], "h3")]
    plan = lc.plan_change(old, new)[1]
    assert not plan.exact and len(plan.steps) == 18 and plan.zero_steps == []


# --- pdnode diff --from OLD NEW ----------------------------------------------------------------

def _inventory(tmp_path, name: str, prefills: list, decodes: list):
    import shutil

    from planvars import ROOT
    inv = tmp_path / name
    (inv / "host_vars").mkdir(parents=True)
    shutil.copy(ROOT / "inventories" / "demo" / "hosts.yml", inv / "hosts.yml")
    (inv / "group_vars").symlink_to(ROOT / "inventories" / "demo" / "group_vars")
    import json
    (inv / "host_vars" / "pdnode-demo.yml").write_text(json.dumps(
        {"pdnode_prefill_instances": [{"gpus": g, "tp_size": len(g)} for g in prefills],
         "pdnode_decode_instances": [{"gpus": g, "tp_size": len(g)} for g in decodes]}))
    return inv


def test_diff_of_two_inventories_keeps_the_decode_that_stays(tmp_path, capsys):
    import json

    from pdnode.commands.cli import main
    p2d2 = _inventory(tmp_path, "2p2d", [[0, 1], [2, 3]], [[4, 5], [6, 7]])
    p3d1 = _inventory(tmp_path, "3p1d", [[0, 1], [2, 3], [4, 5]], [[6, 7]])
    assert main(["diff", "--from", str(p2d2), str(p3d1)]) == 0
    out = capsys.readouterr().out
    assert "keeps running: decode-1 on pdnode-demo:6,7" in out
    assert "note: pdnode_decode_instances[0] (decode-0 by its index) is decode-1" in out
    assert "1. stop decode-0" in out and "2. start prefill-2" in out and "every step keeps" in out
    assert main(["diff", "--json", "--from", str(p2d2), str(p3d1)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "pdnode.diff/1" and doc["windows"] == []
    assert [(s["label"], s["serving_after"]) for s in doc["steps"]] == [
        ("stop decode-0", {"prefill": 2, "decode": 1}), ("start prefill-2", {"prefill": 3, "decode": 1})]


def test_diff_names_the_window_no_order_avoids_and_exits_1(tmp_path, capsys):
    import json

    from pdnode.commands.cli import main
    one_p = _inventory(tmp_path, "1p2d", [[0, 1, 2, 3]], [[4, 5], [6, 7]])
    two_p = _inventory(tmp_path, "2p1d", [[0, 1], [2, 3]], [[4, 5, 6, 7]])
    assert main(["diff", "--json", "--from", str(one_p), str(two_p)]) == 1
    doc = json.loads(capsys.readouterr().out)
    windows = {w["role"]: w for w in doc["windows"]}
    # each window: the last instance's drop from the router (smg) and stop, then the new
    # one's start (inventories/demo: the stand-in's pdnode_sim_startup_s 1.0 and its gate)
    # and join; the prefill, which ran before under its name, first waits until the decodes
    # dropped it (its restart_delay_s)
    from pdnode.core.change import window
    from pdnode.core.plan.build import build_plan
    from pdnode.core.inventory.read import inventory_variables
    peers = inventory_variables(two_p)
    delay = build_plan(peers["pdnode-demo"], "pdnode-demo", peers).services["prefill-0"]["restart_delay_s"]
    start = 1.0 + window.STANDIN_GATE_S + window.JOIN_S
    assert windows["decode"]["expected_s"] == round(window.stop_seconds("smg") + start, 1)
    assert windows["prefill"]["expected_s"] == round(window.stop_seconds("smg") + delay + start, 1)
    assert "pdnode_sim_startup_s" in windows["prefill"]["source"]
    assert windows["prefill"]["steps"] == [4, 5] and windows["decode"]["steps"] == [2, 3]


def test_diff_of_an_unreadable_inventory_is_one_line_exit_2(tmp_path, capsys):
    from pdnode.commands.cli import main
    assert main(["diff", "--from", str(tmp_path / "nothing"), str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pdnode diff: ") and "Traceback" not in err[0]


@pytest.mark.integration
def test_diff_of_a_node_whose_host_cannot_be_reached_is_one_line_exit_2(tmp_path, capsys):
    """`pdnode diff INVENTORY` reads the hosts (playbooks/read.yml): one that does not
    answer is named in one line, exit 2, no traceback."""
    import json

    from pdnode.commands.cli import main
    inv = _inventory(tmp_path, "2p2d", [[0, 1], [2, 3]], [[4, 5], [6, 7]])
    (inv / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"pdnode-demo": {
        "ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9,
        "ansible_ssh_common_args": "-o ConnectTimeout=3 -o BatchMode=yes"}}}}))
    assert main(["diff", str(inv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pdnode diff: could not read what the node runs: "), err
    assert "UNREACHABLE" in err[0] and "Traceback" not in err[0]
