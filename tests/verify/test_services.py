"""systemctl show output -> unit state; crash loops are failures, a settled restart is not."""

from __future__ import annotations

from pdnode.verify.services import parse_show, judge

SHOW = """Id=sglang-pd-decode.service
LoadState=loaded
ActiveState={active}
SubState={sub}
Result={result}
NRestarts={restarts}
ActiveEnterTimestamp=Sat 2026-11-29 16:00:00 UTC
ActiveEnterTimestampMonotonic={mono}
ExecMainStatus={status}
"""


def state(active="active", sub="running", result="success", restarts=0, mono=100_000_000, status=0):
    return parse_show(SHOW.format(active=active, sub=sub, result=result, restarts=restarts, mono=mono,
                                  status=status), "sglang-pd-decode.service")


def test_active_and_stable():
    ok, ev = judge(state(), now_mono_s=400.0)
    assert ok and "active/running, up 300 s" in ev


def test_restarting_in_a_loop():
    ok, ev = judge(state(restarts=7, mono=395_000_000), now_mono_s=400.0)
    assert not ok and "restarted 7 times, up only 5 s" in ev


def test_restarted_once_long_ago_is_fine():
    ok, ev = judge(state(restarts=1), now_mono_s=4000.0)
    assert ok and "restarted 1 times" in ev


def test_between_restarts():
    ok, ev = judge(state(active="activating", sub="auto-restart", result="exit-code", restarts=3, status=1), 400.0)
    assert not ok and "activating/auto-restart" in ev and "exit-code" in ev and "exit status 1" in ev


def test_failed_and_not_installed():
    assert not judge(state(active="failed", sub="failed", result="exit-code"), 400.0)[0]
    missing = parse_show("Id=x.service\nLoadState=not-found\nActiveState=inactive\n", "x.service")
    ok, ev = judge(missing, 400.0)
    assert not ok and "not installed" in ev
