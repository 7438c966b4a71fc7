"""systemd state of the three units (only when the verifier runs on the node itself).

``systemctl show -p ... UNIT`` gives KEY=VALUE lines; judge() says whether a unit is
active and stable, or dead, failed, or restarting in a loop (Restart=always hides a
crash loop from a plain is-active: the unit is 'active' again two seconds later).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "NRestarts",
              "ActiveEnterTimestamp", "ActiveEnterTimestampMonotonic", "ExecMainStatus")
# A unit that restarted and has been up for less than this is still flapping.
STABLE_AFTER_S = 30.0


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
                     exit_status=props.get("ExecMainStatus", ""))


def judge(state: UnitState, now_mono_s: float) -> tuple[bool, str]:
    """(ok, one-line evidence)."""
    up_s = now_mono_s - state.entered_mono_us / 1e6 if state.entered_mono_us else None
    where = f"{state.unit}: {state.active}/{state.sub}"
    if state.load != "loaded":
        return False, f"{state.unit}: not installed (LoadState={state.load or '?'})"
    if state.active != "active":
        extra = f", result {state.result}" if state.result and state.result != "success" else ""
        extra += f", last exit status {state.exit_status}" if state.exit_status not in ("", "0") else ""
        loop = f", restarted {state.restarts} times" if state.restarts else ""
        return False, f"{where}{extra}{loop}"
    if state.restarts and up_s is not None and up_s < STABLE_AFTER_S:
        return False, (f"{where} but restarted {state.restarts} times, up only {up_s:.0f} s "
                       "(restarting in a loop?)")
    up = f", up {up_s:.0f} s" if up_s is not None else ""
    restarted = f", restarted {state.restarts} times since start" if state.restarts else ""
    return True, f"{where}{up}{restarted}"


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
