"""Field failure 4 (sglang#13054) reproduced in the stand-in: one failed Mooncake write
blacklists the decode's session, and every later hand-off to that decode fails at once
while both engines stay healthy; SGLang 0.5.23's failed-session probe lifts it (and counts
sglang:failed_session_recoveries_total); with the probe off, the pair stays broken. The
blacklist's rules (backoff, idle drop) are pdnode.standin.sessions', read from
srt/disaggregation/mooncake/conn.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from pdnode.standin.sessions import FailedSessions

from .node import metric_sum, standin_node

BODY = {"text": "hello " * 32, "sampling_params": {"max_new_tokens": 2}}
DEAD = "Decode instance could be dead, remote mooncake session"


def _hand_off(node) -> tuple[int, str]:
    prefill, decode = node.pd_request("/generate", BODY)
    return (200 if prefill.status == 200 and decode.status == 200 else prefill.status), prefill.text + decode.text


def _break_the_session(node) -> None:
    node.set_faults("prefill", ["transfer_fail"])
    status, text = _hand_off(node)
    assert status == 500 and "injected fault transfer_fail" in text, text
    node.set_faults("prefill", [])
    assert node.get(node.decode_url + "/health", auth=False).status == 200  # the decode looks healthy


@pytest.mark.integration
def test_one_failed_write_blacklists_the_pair_until_the_probe_lifts_it(tmp_path):
    # The probe's pass runs every second and probes a session listed since the last pass at
    # once (SGLang's _run_one_probe_pass), so it may lift the session before the next
    # hand-off: a hand-off is refused as a dead session or, once lifted, served; never
    # anything else. That the list alone refuses hand-offs is the probe-off test's.
    with standin_node(tmp_path, env={"SGLANG_FAILED_SESSION_PROBE_INTERVAL_S": "1"}) as node:
        _break_the_session(node)
        t0 = time.monotonic()
        while (answer := _hand_off(node))[0] != 200 and time.monotonic() - t0 < 20:
            assert answer[0] == 500 and DEAD in answer[1], answer
            time.sleep(0.2)
        assert answer[0] == 200, "the probe never lifted the session"
        assert metric_sum(node.metrics("prefill"), "sglang:failed_session_recoveries_total") == 1
        assert "recovered via probe; un-blacklisted" in node.log("prefill")


@pytest.mark.integration
def test_with_the_probe_off_the_pair_stays_broken(tmp_path):
    with standin_node(tmp_path, env={"SGLANG_ENABLE_FAILED_SESSION_PROBE": "false",
                                     "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S": "0.5"}) as node:
        _break_the_session(node)
        status, text = _hand_off(node)  # the transport is fine again: the list is what fails it
        assert status == 500 and DEAD in text, text
        time.sleep(2)  # four probe intervals: nothing probes
        status, text = _hand_off(node)
        assert status == 500 and DEAD in text, text
        assert metric_sum(node.metrics("prefill"), "sglang:failed_session_recoveries_total") == 0


def _blacklist(answers: list[bool], **kw) -> tuple[FailedSessions, list[str], list[int]]:
    asked: list[str] = []
    recovered: list[int] = []

    async def prober(session_id: str) -> bool:
        asked.append(session_id)
        return answers.pop(0)

    settings = {"probe": True, "interval_s": 1.0, "max_interval_s": 4.0, "idle_timeout_s": 600.0, **kw}
    return FailedSessions(**settings, on_recovered=lambda: recovered.append(1), prober=prober), asked, recovered


def test_a_failing_probe_backs_off_to_the_maximum_then_a_good_one_lifts(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    blacklist, asked, recovered = _blacklist([False, False, False, True])
    blacklist.mark_failed("10.0.0.2:16000")
    assert blacklist.refuses("10.0.0.2:16000") and not blacklist.refuses("10.0.0.3:16000")
    probes_at = []
    for _ in range(40):  # a pass every 0.5 s for 20 s
        before = len(asked)
        asyncio.run(blacklist.probe_once())
        if len(asked) > before:
            probes_at.append(clock[0] - 100.0)
        clock[0] += 0.5
    # probed at once, then after 2, 4 and 4 s (doubling from the interval, capped): lifted
    assert probes_at == [0.0, 2.0, 6.0, 10.0], probes_at
    assert recovered == [1] and not blacklist.refuses("10.0.0.2:16000")


def test_a_session_nobody_asks_for_is_dropped_without_a_recovery(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    blacklist, asked, recovered = _blacklist([False] * 10, idle_timeout_s=5.0)
    blacklist.mark_failed("10.0.0.2:16000")
    asyncio.run(blacklist.probe_once())
    clock[0] = 6.0
    asyncio.run(blacklist.probe_once())
    assert not blacklist.refuses("10.0.0.2:16000") and recovered == [] and asked == ["10.0.0.2:16000"]
