"""plugins/modules/pd_services_start.py: the deploy's start of what does not run, against a
systemctl and journalctl on PATH that keep unit states in a file (the real systemd runs it
in the molecule scenarios: molecule/node/tests/test_start_failures.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from module_runner import load_module, run_module

MODULE = load_module(Path(__file__).resolve().parents[1] / "plugins" / "modules" / "pd_services_start.py")

FAKE = """#!{python}
import json, sys
state_file, log = {state!r}, {log!r}
states = json.load(open(state_file))
cmd, units = sys.argv[1], sys.argv[2:]
open(log, "a").write(json.dumps([sys.argv[0].rsplit("/", 1)[-1], *sys.argv[1:]]) + "\\n")
if sys.argv[0].endswith("journalctl"):
    print("\\x1b[31mboom: cannot open the model\\x1b[0m")
    sys.exit(0)
if cmd == "is-active":
    print("\\n".join(states.get(u, {{}}).get("now", "inactive") for u in units))
    sys.exit(0 if all(states.get(u, {{}}).get("now") == "active" for u in units) else 3)
if cmd == "start":
    ok = True
    for u in units:
        if states.get(u, {{}}).get("fails"):
            states[u]["now"] = "failed"
            ok = False
        else:
            states.setdefault(u, {{}})["now"] = "active"
    json.dump(states, open(state_file, "w"))
    sys.exit(0 if ok else 1)
"""

WORKERS = ["u-prefill-0.service", "u-prefill-1.service", "u-decode-0.service"]
ROUTER = "u-router.service"
AFTER = [ROUTER, "u-pair-probe.timer", "u.target"]


@pytest.fixture
def systemd(tmp_path, monkeypatch):
    bin_dir, state, log = tmp_path / "bin", tmp_path / "state.json", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("systemctl", "journalctl"):
        script = bin_dir / name
        script.write_text(FAKE.format(python=sys.executable, state=str(state), log=str(log)))
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def setup(**units):
        state.write_text(json.dumps({u.replace("_", "-") + ("" if "." in u else ".service"): v
                                     for u, v in units.items()}))
        return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return setup


def _args(hold=None):
    return {"start": {"workers": WORKERS, "others": [ROUTER], "after": AFTER, "hold": hold or []}}


def _all_active():
    return {u.removesuffix(".service").replace("-", "_") if u.endswith(".service") else u: {"now": "active"}
            for u in WORKERS + AFTER}


def test_nothing_runs_when_everything_is_active(systemd):
    calls = systemd(**_all_active())
    result = run_module(MODULE, _args())
    assert not result["changed"] and result["not_active"] == []
    assert [c[1] for c in calls()] == ["is-active"]


def test_workers_first_then_the_router_timer_and_target(systemd):
    units = _all_active()
    units["u_decode_0"] = {"now": "inactive"}
    units["u.target"] = {"now": "inactive"}
    calls = systemd(**units)
    result = run_module(MODULE, _args())
    assert result["changed"] and not result.get("failed") and result["not_active"] == ["u-decode-0.service",
                                                                                       "u.target"]
    starts = [c[2:] for c in calls() if c[1] == "start"]
    assert starts == [WORKERS, AFTER]
    assert [c[1] for c in calls()][:2] == ["is-active", "reset-failed"]


def test_a_worker_that_does_not_start_is_named_and_the_router_is_not_started(systemd):
    units = {u: {"now": "inactive"} for u in ("u_prefill_0", "u_prefill_1", "u_router", "u-pair-probe.timer",
                                               "u.target")}
    units["u_decode_0"] = {"now": "inactive", "fails": True}
    calls = systemd(**units)
    result = run_module(MODULE, _args())
    assert result["failed"]
    assert "u-decode-0.service did not start (now failed); its journal ends:\n  boom: cannot open the model\n" \
        in result["msg"]
    assert result["msg"].endswith("the router was not started: its workers did not start")
    assert "\x1b" not in result["msg"]
    assert [c[2:] for c in calls() if c[1] == "start"] == [WORKERS]
    journal = next(c for c in calls() if c[0] == "journalctl")
    assert journal[1:5] == ["--unit", "u-decode-0.service", "--identifier", "u-decode-0"]


def test_a_prefill_that_does_not_run_waits_for_its_hold_first(systemd, tmp_path):
    units = _all_active()
    units["u_prefill_1"] = {"now": "inactive"}
    calls = systemd(**units)
    mark = tmp_path / "held"
    hold = [{"unit": "u-prefill-1.service", "argv": [sys.executable, "-c", f"open({str(mark)!r}, 'w')"]},
            {"unit": "u-prefill-0.service", "argv": [sys.executable, "-c", "raise SystemExit(1)"]}]
    result = run_module(MODULE, _args(hold))
    assert result["changed"] and not result.get("failed") and mark.exists()  # the running one is not held
    assert [c[2:] for c in calls() if c[1] == "start"] == [WORKERS, AFTER]


def test_a_hold_that_fails_fails_before_any_start(systemd):
    units = _all_active()
    units["u_prefill_1"] = {"now": "inactive"}
    calls = systemd(**units)
    hold = [{"unit": "u-prefill-1.service", "argv": [sys.executable, "-c", "import sys; sys.exit('no decode')"]}]
    result = run_module(MODULE, _args(hold))
    assert result["failed"] and "waiting to start u-prefill-1.service failed: no decode" in result["msg"]
    assert not [c for c in calls() if c[1] == "start"]


def test_check_mode_starts_nothing(systemd):
    units = _all_active()
    units["u_router"] = {"now": "failed"}
    calls = systemd(**units)
    result = run_module(MODULE, _args(), check=True)
    assert result["changed"] and result["not_active"] == [ROUTER]
    assert [c[1] for c in calls()] == ["is-active"]
