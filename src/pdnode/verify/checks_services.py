"""services: every systemd unit of the plan (each engine instance, the router) active and
not restarting in a loop; one recovered restart is a WARN (the judgement: services.py), and
so is a unit whose device restriction is off (DevicePolicy=auto: the role's hardening
switch pd_services_device_policy turned off, which `pdnode check` warns about too)."""

from __future__ import annotations

import time

from . import services as svc
from .base import FAIL, NA, PASS, RUNBOOK, WARN, Ctx, Result


def check_services(ctx: Ctx) -> Result:
    units = ctx.run.expect.units
    if not ctx.t.on_node:
        return Result(NA, "not applicable (remote): systemd state is read on the node itself",
                      "run on the node (ansible-playbook playbooks/verify.yml does)")
    if not units or not svc.systemctl_available():
        return Result(NA, "not applicable: no systemctl on this machine")
    first = _read_units(ctx, units)
    if first is None:
        return Result(NA, "not applicable: systemctl cannot answer here (systemd is not PID 1)")
    states, now = first
    if all(s.load == "not-found" for s in states):
        return Result(NA, f"not applicable: {', '.join(units)} are not installed on this machine")
    earlier: list[svc.UnitState | None] = [None] * len(states)
    watched = 0.0
    # A recent restart or a unit between states: watch a few seconds; a loop shows as
    # NRestarts rising (or the unit not active at the end), one recovered restart does not.
    wait = min(svc.OBSERVE_S, ctx.deadline.left() - ctx.s.timeout_s)
    if wait > 0 and any(svc.needs_second_look(s, now) for s in states):
        time.sleep(wait)
        second = _read_units(ctx, units)
        if second is not None:
            earlier, watched = list(states), second[1] - now
            states, now = second
    judged = [svc.judge(s, now, first=e, watched_s=watched) for s, e in zip(states, earlier)]
    evidence = "; ".join(ev for _, ev in judged)
    failing = [s.unit for s, (v, _) in zip(states, judged) if v == svc.FAIL]
    if failing:
        return Result(FAIL, evidence, f"journalctl -u {failing[0]} -n 100 --no-pager; systemctl status {failing[0]}; "
                                      f"{RUNBOOK}#services")
    warned = [s.unit for s, (v, _) in zip(states, judged) if v == svc.WARN]
    open_devices = [s.unit for s in states if s.load == "loaded" and s.device_policy == "auto"]
    if open_devices:
        evidence += (f"; hardening off: {', '.join(open_devices)} DevicePolicy=auto (every device node of the host "
                     "is open to it)")
    hints = []
    if warned:
        hints.append(f"a restart recovered; why it went down: journalctl -u {warned[0]} -n 100 --no-pager; if "
                     f"NRestarts keeps rising it is a loop; {RUNBOOK}#services")
    if open_devices:
        hints.append("pd_services_device_policy is false: set it true (the default) and deploy again, unless this "
                     "host does not delegate the cgroup device controller (test containers); docs/security.md")
    if hints:
        return Result(WARN, evidence, "; ".join(hints))
    return Result(PASS, evidence)


def _read_units(ctx: Ctx, units: list[str]) -> tuple[list[svc.UnitState], float] | None:
    now = time.monotonic()
    states = []
    for unit in units:
        out = svc.show(unit, timeout_s=min(5.0, ctx.limit()))
        if out is None:
            return None
        states.append(svc.parse_show(out, unit))
    return states, now
