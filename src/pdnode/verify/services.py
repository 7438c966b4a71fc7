"""systemd state of the plan's units (only when the verifier runs on the node itself).

``systemctl show -p ... UNIT`` gives KEY=VALUE lines; judge() says whether a unit is
active and stable (OK), recovered from a restart a short while ago (WARN, with the time
it came back), or dead, failed, or restarting in a loop (FAIL).

A loop is restarts RISING while the verifier watches, not a restart count: Restart=always
hides a crash loop from a plain is-active (the unit is 'active' again two seconds later),
but one kill -9 followed by a clean recovery leaves NRestarts=1 for good. So a unit that
restarted within STABLE_AFTER_S (or is between states) is read a second time OBSERVE_S
later: NRestarts grew, or the unit entered 'active' again, or it is not active at the
end -> FAIL; unchanged and active -> WARN.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "NRestarts",
              "ActiveEnterTimestamp", "ActiveEnterTimestampMonotonic", "ExecMainStatus", "DevicePolicy")
# A unit that restarted and has been up for less than this is watched for OBSERVE_S.
STABLE_AFTER_S = 30.0
# Longer than the units' RestartSec (2 s): a unit in a fast loop restarts while watched.
OBSERVE_S = 4.0
OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class UnitState:
    unit: str
    load: str
    active: str
    sub: str
    result: str
    restarts: int
    entered: str  # ActiveEnterTimestamp, human-readable
    entered_mono_us: int  # CLOCK_MONOTONIC microseconds (0: never active)
    exit_status: str
    # closed/strict: only the devices the unit allows (the engines' DevicePolicy=closed, the
    # router's PrivateDevices=yes); auto: every device node of the host ("": not read)
    device_policy: str = ""


def parse_show(text: str, unit: str) -> UnitState:
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()

    def _int(key: str) -> int:
        try:
            return int(props.get(key, "0") or 0)
        except ValueError:
            return 0

    return UnitState(unit=props.get("Id", unit) or unit, load=props.get("LoadState", ""),
                     active=props.get("ActiveState", ""), sub=props.get("SubState", ""),
                     result=props.get("Result", ""), restarts=_int("NRestarts"),
                     entered=props.get("ActiveEnterTimestamp", ""),
                     entered_mono_us=_int("ActiveEnterTimestampMonotonic"),
                     exit_status=props.get("ExecMainStatus", ""), device_policy=props.get("DevicePolicy", ""))


def needs_second_look(state: UnitState, now_mono_s: float) -> bool:
    """Restarted recently, or between states: judge it only after watching it a while."""
    if state.load != "loaded":
        return False
    if state.active in ("activating", "deactivating", "reloading") or state.sub == "auto-restart":
        return True
    up_s = now_mono_s - state.entered_mono_us / 1e6 if state.entered_mono_us else None
    return bool(state.restarts) and up_s is not None and up_s < STABLE_AFTER_S


def judge(state: UnitState, now_mono_s: float, *, first: UnitState | None = None,
          watched_s: float = 0.0) -> tuple[str, str]:
    """(OK | WARN | FAIL, one-line evidence) of ``state``, read at ``now_mono_s``;
    ``first``: the same unit read ``watched_s`` seconds earlier (the loop detector)."""
    up_s = now_mono_s - state.entered_mono_us / 1e6 if state.entered_mono_us else None
    where = f"{state.unit}: {state.active}/{state.sub}"
    if state.load != "loaded":
        return FAIL, f"{state.unit}: not installed (LoadState={state.load or '?'})"
    rose = first is not None and state.restarts > first.restarts
    # entered 'active' again: a restart, unless the first look caught the start itself
    # finishing (activating -> active, NRestarts unchanged)
    again = (first is not None and first.active == "active" and first.entered_mono_us
             and state.entered_mono_us and state.entered_mono_us != first.entered_mono_us)
    watched = f" in the {watched_s:.0f} s watched" if first is not None else ""
    loop = ""
    if rose:
        loop = f"; restarting in a loop: NRestarts {first.restarts} -> {state.restarts}{watched}"
    elif again:
        loop = f"; restarted{watched} (entered active again)"
    if state.active != "active":
        extra = f", result {state.result}" if state.result and state.result != "success" else ""
        extra += f", last exit status {state.exit_status}" if state.exit_status not in ("", "0") else ""
        count = f", restarted {state.restarts} times" if state.restarts else ""
        return FAIL, f"{where}{extra}{count}{loop}"
    if loop:
        return FAIL, f"{where}, up {up_s or 0:.0f} s{loop}"
    up = f", up {up_s:.0f} s" if up_s is not None else ""
    if state.restarts and up_s is not None and up_s < STABLE_AFTER_S:
        since = f" since {state.entered}" if state.entered else ""
        steady = (f"; NRestarts steady at {state.restarts}{watched}: recovered, not a loop" if first is not None
                  else "; watch NRestarts: a loop makes it rise")
        return WARN, f"{where}, restarted {state.restarts} times, up again{since} ({up_s:.0f} s ago){steady}"
    restarted = f", restarted {state.restarts} times since start" if state.restarts else ""
    return OK, f"{where}{up}{restarted}"


def systemctl_available() -> bool:
    return shutil.which("systemctl") is not None


def show(unit: str, timeout_s: float = 5.0) -> str | None:
    """systemctl show output, or None when systemctl cannot answer (no systemd as PID 1)."""
    try:
        proc = subprocess.run(["systemctl", "show", "--no-pager", "-p", ",".join(PROPERTIES), unit],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout
