"""systemctl show output -> unit state. A loop is restarts rising while the verifier
watches; one recovered restart is a warning with its time, never a failure."""

from __future__ import annotations

import time

import pytest
from conftest import minimal_plan
from pdnode.verify import checks_services
from pdnode.verify import services as svc
from pdnode.verify.base import FAIL, PASS, WARN, Ctx
from pdnode.verify.checks_services import check_services
from pdnode.verify.config import build_run
from pdnode.verify.services import judge, parse_show

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
    verdict, ev = judge(state(), now_mono_s=400.0)
    assert verdict == svc.OK and "active/running, up 300 s" in ev


def test_one_recovered_restart_is_a_warning_with_its_time():
    # kill -9 once, systemd restarted it, up again 26 s: the measured false FAIL
    first = state(restarts=1, mono=374_000_000)
    verdict, ev = judge(state(restarts=1, mono=374_000_000), now_mono_s=400.0, first=first, watched_s=4)
    assert verdict == svc.WARN, ev
    assert "restarted 1 times, up again since Sat 2026-11-29 16:00:00 UTC (26 s ago)" in ev
    assert "NRestarts steady at 1 in the 4 s watched" in ev


def test_restarts_rising_while_watched_is_a_loop():
    verdict, ev = judge(state(restarts=7, mono=398_000_000), now_mono_s=400.0,
                        first=state(restarts=6, mono=395_000_000), watched_s=4)
    assert verdict == svc.FAIL and "restarting in a loop: NRestarts 6 -> 7 in the 4 s watched" in ev


def test_entered_active_again_while_watched_is_a_restart():
    verdict, ev = judge(state(restarts=2, mono=399_000_000), now_mono_s=400.0,
                        first=state(restarts=2, mono=395_000_000), watched_s=4)
    assert verdict == svc.FAIL and "entered active again" in ev


def test_a_start_finishing_while_watched_is_no_restart():
    # read once during ExecStartPost (the readiness gate), once after: not a loop
    verdict, ev = judge(state(restarts=1, mono=398_000_000), now_mono_s=400.0,
                        first=state(active="activating", sub="start-post", restarts=1, mono=300_000_000), watched_s=4)
    assert verdict == svc.WARN, ev


def test_restarted_once_long_ago_is_fine():
    verdict, ev = judge(state(restarts=1), now_mono_s=4000.0)
    assert verdict == svc.OK and "restarted 1 times" in ev


def test_between_restarts():
    verdict, ev = judge(state(active="activating", sub="auto-restart", result="exit-code", restarts=3, status=1),
                        400.0)
    assert verdict == svc.FAIL and "activating/auto-restart" in ev and "exit-code" in ev and "exit status 1" in ev


def test_failed_and_not_installed():
    assert judge(state(active="failed", sub="failed", result="exit-code"), 400.0)[0] == svc.FAIL
    missing = parse_show("Id=x.service\nLoadState=not-found\nActiveState=inactive\n", "x.service")
    verdict, ev = judge(missing, 400.0)
    assert verdict == svc.FAIL and "not installed" in ev


def test_needs_second_look():
    assert svc.needs_second_look(state(restarts=1, mono=390_000_000), 400.0)
    assert svc.needs_second_look(state(active="activating", sub="auto-restart"), 400.0)
    assert not svc.needs_second_look(state(restarts=1), 4000.0)
    assert not svc.needs_second_look(state(), 400.0)


# --- the check itself, with synthetic systemctl output --------------------------------
class FakeSystemctl:
    """systemctl show for every unit of the plan; decode-0's unit answers follow `decode` (one per read)."""

    def __init__(self, monkeypatch, decode: list[dict]):
        self.decode = decode
        self.reads = 0
        self.slept = 0.0
        self.t0_us = int(time.monotonic() * 1e6)
        monkeypatch.setattr(svc, "systemctl_available", lambda: True)
        monkeypatch.setattr(svc, "show", self.show)
        monkeypatch.setattr(checks_services.time, "sleep", self.sleep)

    def sleep(self, s: float) -> None:
        self.slept += s

    def show(self, unit: str, timeout_s: float = 5.0) -> str:
        if unit != "x-decode-0.service":
            return SHOW.format(active="active", sub="running", result="success", restarts=0,
                               mono=self.t0_us - 3_600_000_000, status=0).replace("sglang-pd-decode", unit[:-8])
        d = self.decode[min(self.reads, len(self.decode) - 1)]
        self.reads += 1
        # up_s counted from the first read: a unit that did not restart keeps its timestamp
        mono = self.t0_us - int(d["up_s"] * 1e6) if self.reads == 1 or d["restarts"] != self.decode[0]["restarts"] \
            else self.t0_us - int(self.decode[0]["up_s"] * 1e6)
        return SHOW.format(active=d.get("active", "active"), sub=d.get("sub", "running"), result="success",
                           restarts=d["restarts"], mono=mono, status=0).replace("sglang-pd-decode", "x-decode-0")


def _ctx() -> Ctx:
    return Ctx(build_run(minimal_plan(), env={}, on_node=True))


def test_check_recovered_restart_warns_and_does_not_fail(monkeypatch):
    fake = FakeSystemctl(monkeypatch, [{"restarts": 1, "up_s": 26}])
    res = check_services(_ctx())
    assert res.status == WARN, res
    assert fake.reads == 2 and fake.slept == svc.OBSERVE_S  # watched, bounded
    assert "x-decode-0.service: active/running, restarted 1 times, up again since" in res.evidence
    assert "recovered, not a loop" in res.evidence


def test_check_restart_loop_fails(monkeypatch):
    FakeSystemctl(monkeypatch, [{"restarts": 5, "up_s": 3}, {"restarts": 6, "up_s": 1}])
    res = check_services(_ctx())
    assert res.status == FAIL and "NRestarts 5 -> 6" in res.evidence, res


def test_check_not_active_after_watching_fails(monkeypatch):
    FakeSystemctl(monkeypatch, [{"restarts": 2, "active": "activating", "sub": "auto-restart", "up_s": 0},
                                {"restarts": 3, "active": "activating", "sub": "start-post", "up_s": 0}])
    res = check_services(_ctx())
    assert res.status == FAIL and "activating/start-post" in res.evidence, res


@pytest.mark.parametrize("decode", [[{"restarts": 0, "up_s": 5}], [{"restarts": 1, "up_s": 600}]])
def test_check_stable_units_are_read_once(monkeypatch, decode):
    fake = FakeSystemctl(monkeypatch, decode)
    res = check_services(_ctx())
    assert res.status == PASS and fake.reads == 1 and fake.slept == 0, res


def test_every_instance_unit_is_read_and_a_failed_one_named(monkeypatch):
    from nodeplan import contract_plan

    read: list[str] = []

    def show(unit: str, timeout_s: float = 5.0) -> str:
        read.append(unit)
        active, sub = ("failed", "failed") if unit == "x-prefill-1.service" else ("active", "running")
        return SHOW.format(active=active, sub=sub, result="success", restarts=0, mono=1_000_000,
                           status=0).replace("sglang-pd-decode.service", unit)

    monkeypatch.setattr(svc, "systemctl_available", lambda: True)
    monkeypatch.setattr(svc, "show", show)
    res = check_services(Ctx(build_run(contract_plan(prefills=2, decodes=2), env={}, on_node=True)))
    assert read == ["x-prefill-0.service", "x-prefill-1.service", "x-decode-0.service", "x-decode-1.service",
                    "x-router.service"]
    assert res.status == FAIL and "x-prefill-1.service: failed/failed" in res.evidence, res
    assert "journalctl -u x-prefill-1.service" in res.hint


# --- a hardening switch turned off (issue 17, section 5) --------------------------------
def _show_with_policy(policies: dict[str, str]):
    def show(unit: str, timeout_s: float = 5.0) -> str:
        return SHOW.format(active="active", sub="running", result="success", restarts=0, mono=1_000_000,
                           status=0).replace("sglang-pd-decode.service", unit) + (
            f"DevicePolicy={policies[unit]}\n" if unit in policies else "")
    return show


def test_device_policy_is_read_with_the_unit():
    assert parse_show(SHOW.format(active="active", sub="running", result="success", restarts=0, mono=1, status=0)
                      + "DevicePolicy=closed\n", "x").device_policy == "closed"
    assert "DevicePolicy" in svc.PROPERTIES


def test_engines_with_every_device_open_are_a_warning_naming_them(monkeypatch):
    """pd_services_device_policy: false leaves the engines DevicePolicy=auto: the check
    passes with a warning (the node works), naming each unit and the switch."""
    monkeypatch.setattr(svc, "systemctl_available", lambda: True)
    monkeypatch.setattr(svc, "show", _show_with_policy({"x-prefill-0.service": "auto", "x-decode-0.service": "auto",
                                                        "x-router.service": "closed"}))
    res = check_services(_ctx())
    assert res.status == WARN, res
    assert "hardening off: x-prefill-0.service, x-decode-0.service DevicePolicy=auto" in res.evidence
    assert "pd_services_device_policy is false" in res.hint


def test_closed_device_policy_passes(monkeypatch):
    monkeypatch.setattr(svc, "systemctl_available", lambda: True)
    monkeypatch.setattr(svc, "show", _show_with_policy({"x-prefill-0.service": "closed", "x-decode-0.service": "closed",
                                                        "x-router.service": "closed"}))
    res = check_services(_ctx())
    assert res.status == PASS and "hardening off" not in res.evidence, res
