"""Layout changes in the order that keeps serving (issue 45), on the day-2 node under steady
load from the project's load generator (host_load: every answer judged, error chunks
counted, gap and volume bounds):

- 2P2D -> 3P1D -> 2P2D with the instances named by their index, the decode moving from
  index 1 to index 0: the decode on GPUs 6-7 is the same instance throughout (its process
  keeps running) and no request fails;
- 4P2D with TP1 prefills on GPUs 0, 1, 2, 3 -> 2P2D with TP2 prefills on 0-1 and 2-3: two
  old prefills serve while the first new one starts, no request fails;
- 1P2D -> 2P1D, where no order keeps a prefill (nor a decode) serving: refused before any
  unit stops, in one line; with pdnode_allow_unavailable it runs, and the longest time
  without a success is printed beside the plan's longest predicted window (from the node's
  own measured starts) and is at least 70 % of it (the ratio: docs/measurements.md).

After each deploy the router's workers are exactly the node's record's (what the next
plan reads), healthy.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import host_load
import pytest
from test_upgrade import (ALLOW_UNAVAILABLE, PROBE_LOAD, REPO, _env, _inventory, killed_as_engines_restart,
                          playbook, router_workers)

PROBE = "/var/tmp/pdnode-layout-order-probe"
RECORD = "/var/lib/pdnode/applied/sglang-pd/layout.json"
PREFIX = "sglang-pd"
DECODE_TP2 = {"tp_size": 2, "attn_dp_size": 2, "ep_size": 2, "moe_dense_tp_size": 1, "enable_dp_lm_head": True}


def layout(prefills: list[list[int]], decodes: list[list[int]]) -> dict:
    return {"pdnode_prefill_instances": [{"gpus": g, "tp_size": len(g)} for g in prefills],
            "pdnode_decode_instances": [{"gpus": g, **DECODE_TP2} if len(g) == 2 else
                                        {"gpus": g, "tp_size": len(g), "attn_dp_size": len(g), "ep_size": len(g)}
                                        for g in decodes]}


L2P2D = layout([[0, 1], [2, 3]], [[4, 5], [6, 7]])
L3P1D = layout([[0, 1], [2, 3], [4, 5]], [[6, 7]])
L4P2D = layout([[0], [1], [2], [3]], [[4, 5], [6, 7]])
L1P2D = layout([[0, 1, 2, 3]], [[4, 5], [6, 7]])
L2P1D = layout([[0, 1], [2, 3]], [[4, 5, 6, 7]])
# Requests over each change under load: a change that stalls is caught by the gap bound.
MIN_REQUESTS = 100


def record(host) -> dict:
    return json.loads(host.check_output(f"cat {RECORD}"))


def wait_recorded_workers(host, deadline_s: float = 120) -> set[str]:
    """The router lists exactly the record's workers, each healthy (the deploy's reconcile
    already made it so; the health flags may lag a check)."""
    want = {e["worker"]["url"] for e in record(host)["engines"].values()}
    end = time.monotonic() + deadline_s
    while True:
        got = router_workers(host)
        if set(got) == want and all(got.values()):
            return want
        assert time.monotonic() < end, (got, want)
        time.sleep(1)


def pid(host, instance: str) -> str:
    return host.check_output(f"systemctl show -p MainPID --value {PREFIX}-{instance}.service")


def start_from(host, inv, what: str) -> None:
    """The test's first layout, from whatever the node ran (accepting its window)."""
    first = deploy(inv, what, *ALLOW_UNAVAILABLE)
    assert first.returncode == 0, first.stdout[-4000:]
    wait_recorded_workers(host)


def deploy(inv, what: str, *more: str):
    t0 = time.monotonic()
    proc = playbook(inv, "deploy.yml", *more)
    print(f"{what}: {time.monotonic() - t0:.1f} s")
    return proc


def pdnode(command: str, inv) -> tuple[int, dict]:
    """`pdnode COMMAND INVENTORY --json` (diff, status): what the node runs, read from it."""
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "pdnode"), command, str(inv), "--json"], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def diff(inv) -> tuple[int, dict]:
    return pdnode("diff", inv)


def status(inv) -> tuple[int, list[dict]]:
    rc, doc = pdnode("status", inv)
    return rc, doc["instances"]


def under_load(host, changes) -> dict:
    """Run CHANGES (callables) under the load; the load's result."""
    host_load.start(host, PROBE, *PROBE_LOAD)
    try:
        time.sleep(host_load.CHANGE_AFTER_S)
        for change in changes:
            change()
    finally:
        host_load.stop(host, PROBE)
    result = host_load.result(host, PROBE)
    print(json.dumps({k: result[k] for k in ("requests", "ok", "failed", "failures", "longest_gap_s",
                                             "longest_request_s", "first_failures")}))
    return result


@pytest.fixture(scope="module")
def inventories(inventory, tmp_path_factory):
    out = {name: _inventory(inventory, tmp_path_factory.mktemp(name), lay)
           for name, lay in (("2p2d", L2P2D), ("3p1d", L3P1D), ("4p2d", L4P2D), ("1p2d", L1P2D), ("2p1d", L2P1D))}
    yield out
    back = playbook(inventory, "deploy.yml", *ALLOW_UNAVAILABLE)  # the scenario's own layout
    assert back.returncode == 0, back.stdout[-4000:]


@pytest.mark.day2
def test_2p2d_to_3p1d_and_back_keeps_the_moving_decode_and_fails_nothing(host, inventories):
    start_from(host, inventories["2p2d"], "to 2P2D")
    decode = pid(host, "decode-1")
    seen = {}
    # the preview, read from the node: what the deploy below does, and nothing at zero
    rc, preview = diff(inventories["3p1d"])
    assert rc == 0 and [s["label"] for s in preview["steps"]] == ["stop decode-0", "start prefill-2"], preview
    assert {k["instance"] for k in preview["kept"]} == {"prefill-0", "prefill-1", "decode-1"}

    def to_3p1d():
        proc = deploy(inventories["3p1d"], "2P2D -> 3P1D under load")
        assert proc.returncode == 0, proc.stdout[-5000:]
        # the decode on GPUs 6-7 is decode-1 still (index 0 now): its process runs on
        assert pid(host, "decode-1") == decode
        seen["3p1d"] = wait_recorded_workers(host)
        assert not host.service(f"{PREFIX}-decode-0.service").is_running

    def back():
        proc = deploy(inventories["2p2d"], "3P1D -> 2P2D under load")
        assert proc.returncode == 0, proc.stdout[-5000:]
        assert pid(host, "decode-1") == decode
        seen["2p2d"] = wait_recorded_workers(host)

    result = under_load(host, [to_3p1d, back])
    assert sorted(record(host)["engines"]) == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    # what the node runs, read from it: every instance active, listed and healthy, the
    # decode that stayed since before the changes
    rc, rows = status(inventories["2p2d"])
    assert rc == 0 and sorted(r["instance"] for r in rows) == sorted(record(host)["engines"]), rows
    by_id = {r["instance"]: r for r in rows}
    assert all(r["in_router"] and r["healthy"] and r["last_start_s"] for r in rows), rows
    assert by_id["decode-1"]["since"] == host.check_output(
        f"systemctl show -p ActiveEnterTimestamp --value {PREFIX}-decode-1.service")
    assert len(seen["3p1d"]) == 4 and len(seen["2p2d"]) == 4
    assert host_load.zero_drop(result, MIN_REQUESTS) == [], result


@pytest.mark.day2
def test_4p_tp1_to_2p_tp2_keeps_two_old_prefills_serving_while_the_first_new_one_starts(host, inventories):
    start_from(host, inventories["4p2d"], "to 4P2D")
    decodes = {d: pid(host, d) for d in ("decode-0", "decode-1")}

    def to_2p2d():
        proc = deploy(inventories["2p2d"], "4P2D -> 2P2D under load")
        assert proc.returncode == 0, proc.stdout[-5000:]
        steps = [line for line in proc.stdout.splitlines() if "layout change step" in line]
        print("\n".join(steps))
        wait_recorded_workers(host)

    result = under_load(host, [to_2p2d])
    assert {d: pid(host, d) for d in decodes} == decodes  # the decodes ran on
    assert host_load.zero_drop(result, MIN_REQUESTS) == [], result


@pytest.mark.day2
def test_1p2d_to_2p1d_is_refused_before_anything_stops_and_runs_with_the_override(host, inventories):
    start_from(host, inventories["1p2d"], "to 1P2D")
    before = {i: pid(host, i) for i in ("prefill-0", "decode-0", "decode-1")}
    rc, preview = diff(inventories["2p1d"])
    assert rc == 1 and {w["role"] for w in preview["windows"]} == {"prefill", "decode"}, preview
    # the windows from the node's own measured starts (systemd's record), read with the record
    assert all(w["source"].startswith("measured on the node") for w in preview["windows"]), preview
    predicted = max(w["expected_s"] for w in preview["windows"])
    refused = deploy(inventories["2p1d"], "1P2D -> 2P1D (refused)")
    assert refused.returncode != 0
    out = refused.stdout + refused.stderr
    lines = [line for line in out.splitlines() if "no order of this change keeps a" in line]
    assert lines and "pdnode_allow_unavailable" in lines[0] and "nothing was stopped" in lines[0], out[-3000:]
    assert {i: pid(host, i) for i in before} == before  # nothing stopped
    assert "changed=0" in out.split("PLAY RECAP")[-1]
    windows = {}

    def with_override():
        proc = deploy(inventories["2p1d"], "1P2D -> 2P1D with pdnode_allow_unavailable", *ALLOW_UNAVAILABLE)
        assert proc.returncode == 0, proc.stdout[-5000:]
        windows["lines"] = [line for line in proc.stdout.splitlines() if "expected window" in line]
        # the deploy's own report of each window it ran, beside the prediction
        windows["ran"] = [float(s) for s in re.findall(r"window without a \w+: measured ([0-9.]+) s by the deploy",
                                                       proc.stdout)]
        wait_recorded_workers(host)

    result = under_load(host, [with_override])
    measured = result["longest_gap_s"]
    print(f"windows predicted: {windows['lines']}; the longest, {predicted} s, against the longest time without a "
          f"success: {measured} s ({measured / predicted:.2f}x)")
    print(f"the deploy's measured windows: {windows['ran']} s")
    assert windows["lines"] and result["failed"] > 0  # the window the plan named was real
    # one report per window, none shorter than 30 % under the prediction (a busy machine only
    # lengthens the deploy's steps; against the clients' gap it is a benchmark, printed above)
    assert len(windows["ran"]) == len(preview["windows"]), windows
    assert max(windows["ran"]) >= 0.7 * predicted, (windows["ran"], predicted)
    # Not shorter than predicted by more than 30 % (a busy machine only lengthens the steps;
    # the ratio itself is a benchmark: docs/measurements.md, "A layout change in order").
    assert measured >= 0.7 * predicted, (measured, predicted)


@pytest.mark.day2
def test_a_unit_the_record_does_not_name_is_refused_and_nothing_stops(host, inventories):
    """An engine unit of the prefix started by hand (here a transient one): the deploy names
    it in one line and changes nothing; stopped, the same deploy runs."""
    start_from(host, inventories["2p2d"], "to 2P2D")
    before = {i: pid(host, i) for i in ("prefill-0", "prefill-1", "decode-0", "decode-1")}
    stray = f"{PREFIX}-decode-9.service"
    host.run_expect([0], f"systemd-run --unit={stray} --property=RemainAfterExit=no sleep 600")
    try:
        rc, preview = diff(inventories["2p2d"])
        assert rc == 1 and stray in (preview["refusal"] or ""), preview
        refused = deploy(inventories["2p2d"], "2P2D with a unit started by hand (refused)")
        out = refused.stdout + refused.stderr
        lines = [line for line in out.splitlines() if "the deploy does not stop what it did not start" in line]
        assert refused.returncode != 0 and lines and stray in lines[0], out[-3000:]
        assert {i: pid(host, i) for i in before} == before and host.service(stray).is_running
        assert "changed=0" in out.split("PLAY RECAP")[-1]
    finally:
        host.run(f"systemctl stop {stray}")
    again = deploy(inventories["2p2d"], "2P2D once it stopped")
    assert again.returncode == 0, again.stdout[-4000:]
    assert {i: pid(host, i) for i in before} == before


@pytest.mark.day2
def test_an_interrupted_change_is_taken_again_and_another_layout_waits_for_it(host, inventories):
    """2P2D -> 3P1D killed (the controller's whole process group) as its steps begin: the
    record still names where the change started; a deploy of another layout is refused in
    one line; the same deploy again takes the steps and the record converges."""
    start_from(host, inventories["2p2d"], "to 2P2D")
    killed_as_engines_restart(inventories["3p1d"], "deploy.yml")
    unfinished = record(host)
    assert set(unfinished["from"]) == {"prefill-0", "prefill-1", "decode-0", "decode-1"}, unfinished
    other = deploy(inventories["1p2d"], "1P2D while 2P2D -> 3P1D is unfinished (refused)", *ALLOW_UNAVAILABLE)
    out = other.stdout + other.stderr
    assert other.returncode != 0 and "an earlier deploy was interrupted" in out, out[-3000:]
    assert "changed=0" in out.split("PLAY RECAP")[-1]
    again = deploy(inventories["3p1d"], "2P2D -> 3P1D again")
    assert again.returncode == 0, again.stdout[-4000:]
    assert "from" not in record(host) and set(record(host)["engines"]) == {"prefill-0", "prefill-1", "prefill-2",
                                                                           "decode-1"}
    assert set(wait_recorded_workers(host)) == {e["worker"]["url"] for e in record(host)["engines"].values()}
    assert not host.service(f"{PREFIX}-decode-0.service").is_running
    settled = deploy(inventories["3p1d"], "3P1D, nothing to change")
    assert settled.returncode == 0 and "changed=0" in settled.stdout.split("PLAY RECAP")[-1], settled.stdout[-3000:]
