"""The layout_read module (plugins/modules/layout_read.py): the node's record of the layout it
runs, and its engines' start times from systemd's own timestamps -- parsed from real
`systemctl show` text, and run as a host runs it (a fake systemctl on PATH answers)."""

from __future__ import annotations

import json
from pathlib import Path

from module_runner import load_module, run_module

ROOT = Path(__file__).resolve().parents[1]
MODULE = load_module(ROOT / "plugins" / "modules" / "layout_read.py")
# `systemctl show -pActiveState -pInactiveExitTimestampMonotonic -pActiveEnterTimestampMonotonic
# -- a b c` as systemd 252 prints it: one block per unit, in the order asked
SHOW = """ActiveState=active
InactiveExitTimestampMonotonic=1000000
ActiveEnterTimestampMonotonic=2650000

ActiveState=inactive
InactiveExitTimestampMonotonic=5000000
ActiveEnterTimestampMonotonic=6000000

ActiveState=active
InactiveExitTimestampMonotonic=0
ActiveEnterTimestampMonotonic=0
"""


def test_a_start_is_from_leaving_inactive_to_active_and_only_for_running_units():
    # the second has stopped (its last start is not what runs); the third never left inactive
    assert MODULE.start_seconds(SHOW) == {0: 1.65}
    assert MODULE.start_seconds("") == {}


def test_the_module_reads_the_record_and_asks_systemd_for_its_units(tmp_path, monkeypatch):
    record = {"schema": "pdnode.layout/1", "engines": {
        "prefill-0": {"unit": "sglang-pd-prefill-0.service"}, "decode-0": {"unit": "sglang-pd-decode-0.service"}}}
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(record))
    fake = tmp_path / "bin"
    fake.mkdir()
    asked = tmp_path / "asked"
    (fake / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" > {asked}\ncat <<'EOF'\n{SHOW}EOF\n")
    (fake / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    got = run_module(MODULE, {"path": str(path)}, check=True)
    assert got["changed"] is False and json.loads(got["content"]) == record
    # units sorted: decode-0 first; the first block is decode-0's
    assert got["started"] == {"sglang-pd-decode-0.service": 1.65}
    assert asked.read_text().split()[-3:] == ["--", "sglang-pd-decode-0.service", "sglang-pd-prefill-0.service"]


def test_no_record_is_none_and_an_unreadable_one_is_handed_on_for_the_plan_to_judge(tmp_path):
    none = run_module(MODULE, {"path": str(tmp_path / "none.json")})
    assert (none["changed"], none["content"], none["started"]) == (False, None, {})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    got = run_module(MODULE, {"path": str(bad)})
    assert got["content"] == "{not json" and got["started"] == {}
    bad.write_bytes(b"\xff{")  # not even text: handed on as well, never a traceback
    assert run_module(MODULE, {"path": str(bad)})["content"] == "\ufffd{"


def test_each_unit_s_state_since_and_what_its_main_process_runs(tmp_path, monkeypatch):
    """pdnode status's read: the unit's state, since when, its last start, and from its main
    process (a real one here) the interpreter (its release) and its model commit."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            env={"PDNODE_MODEL_COMMIT": "c" * 40, "PATH": "/usr/bin:/bin"})
    try:
        show = (f"ActiveState=active\nLoadState=loaded\nInactiveExitTimestampMonotonic=1000000\n"
                f"ActiveEnterTimestampMonotonic=3000000\nActiveEnterTimestamp=Sun 2026-12-06 11:00:00 UTC\n"
                f"MainPID={proc.pid}\n\nActiveState=inactive\nLoadState=not-found\nMainPID=0\n")
        path = tmp_path / "layout.json"
        path.write_text(json.dumps({"schema": "pdnode.layout/1", "engines": {
            "a": {"unit": "sglang-pd-decode-0.service"}, "b": {"unit": "sglang-pd-prefill-9.service"}}}))
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "systemctl").write_text(f"#!/bin/sh\ncat <<'EOF'\n{show}EOF\n")
        (fake / "systemctl").chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
        got = run_module(MODULE, {"path": str(path)})
    finally:
        proc.kill()
        proc.wait()
    # the unit systemd does not know here (another host's) is not listed
    assert got["units"] == {"sglang-pd-decode-0.service": {
        "active": "active", "since": "Sun 2026-12-06 11:00:00 UTC", "started_s": 2.0, "python": sys.executable,
        "model_commit": "c" * 40}}


# `systemctl list-units --all --plain --no-legend --no-pager --type=service -- 'sglang-pd-*.service'`
# as systemd 252 prints it: UNIT LOAD ACTIVE SUB DESCRIPTION
LIST = """sglang-pd-decode-0.service  loaded active   running SGLang PD decode-0
sglang-pd-decode-7.service  loaded active   running SGLang PD decode-7 (started by hand)
sglang-pd-prefill-3.service loaded inactive dead    SGLang PD prefill-3
sglang-pd-prefill-4.service loaded activating start SGLang PD prefill-4
sglang-pd-router.service    loaded active   running SGLang PD router
"""


def _fake_systemctl(tmp_path, show: str, listing: str) -> Path:
    fake = tmp_path / "bin"
    fake.mkdir()
    asked = tmp_path / "asked"
    (fake / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {asked}\ncase \"$1\" in\n"
                                    f"  show) cat <<'EOF'\n{show}EOF\n  ;;\n"
                                    f"  list-units) cat <<'EOF'\n{listing}EOF\n  ;;\nesac\n")
    (fake / "systemctl").chmod(0o755)
    return asked


def test_the_units_of_the_prefix_that_run_and_the_record_does_not_name_are_strangers(tmp_path, monkeypatch):
    """Both layouts of an unfinished change are the record's (``from``); what else of the
    prefix runs (or starts) is named, a stopped unit is not."""
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"schema": "pdnode.layout/1",
                                "engines": {"decode-0": {"unit": "sglang-pd-decode-0.service"}},
                                "from": {"decode-1": {"unit": "sglang-pd-router.service"}}}))
    asked = _fake_systemctl(tmp_path, SHOW, LIST)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    got = run_module(MODULE, {"path": str(path), "prefix": "sglang-pd"}, check=True)
    assert got["strangers"] == ["sglang-pd-decode-7.service", "sglang-pd-prefill-4.service"]
    lines = asked.read_text().splitlines()
    assert lines[0].split()[-3:] == ["--", "sglang-pd-decode-0.service", "sglang-pd-router.service"]
    assert lines[1].split()[-2:] == ["--", "sglang-pd-*.service"]
    # without a record nothing is listed: a new node, or one deployed before records
    none = run_module(MODULE, {"path": str(tmp_path / "none.json"), "prefix": "sglang-pd"})
    assert none["strangers"] == []
