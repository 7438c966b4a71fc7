"""plugins/action/report_file.py (pdnode.sglang_pd.report_file): the controller's report
writes of the preflight and the verification. Run by ansible-playbook as the roles run it:
the file gets its content and mode, its directory is made when missing, the task never
reports a change and writes in check mode too; the write is atomic (a rename over the old
file, nothing left beside it, the old file intact when the write fails); bad arguments fail
with one message naming the field."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugins" / "action" / "report_file.py"


def run_play(tmp_path: Path, tasks: list[dict], *check: str) -> dict:
    """ansible-playbook on localhost (this process's Python), the ansible.posix.json record."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    r = subprocess.run([str(ansible_playbook), "-i", "localhost,", "-c", "local",
                        "-e", json.dumps({"ansible_python_interpreter": sys.executable}), str(play), *check],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return {"rc": r.returncode, **json.loads(r.stdout[r.stdout.index("{"):])}


def results(record: dict) -> list[dict]:
    return [t["hosts"]["localhost"] for play in record["plays"] for t in play["tasks"]]


def write(dest: Path, content: str, **more: str) -> dict:
    return {"name": f"write {dest.name}", "pdnode.sglang_pd.report_file": {"dest": str(dest), "content": content,
                                                                          **more}}


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("check", [(), ("--check", "--diff")], ids=["run", "check-mode"])
def test_writes_content_and_mode_in_a_new_directory_and_reports_no_change(tmp_path, check):
    reports = tmp_path / "cache" / "preflight"
    first, second = reports / "a.json", reports / "b.json"
    old = tmp_path / "old.json"
    old.write_text("an older report, longer than the new one\n")
    old.chmod(0o600)
    old_inode = old.stat().st_ino
    record = run_play(tmp_path, [write(first, '{"ok": true}\n', mode="0640"), write(second, "x"),
                                 write(old, "new\n", mode="0644")], *check)
    assert record["rc"] == 0, record
    assert [r.get("changed") for r in results(record)] == [False, False, False]
    assert record["stats"]["localhost"]["changed"] == 0
    assert first.read_text() == '{"ok": true}\n' and mode_of(first) == 0o640
    assert second.read_text() == "x" and mode_of(second) == 0o644  # the default mode
    assert mode_of(reports) == 0o755 and mode_of(reports.parent) == 0o755
    # replaced by a rename: a new inode with the new mode, nothing left beside it
    assert old.read_text() == "new\n" and mode_of(old) == 0o644 and old.stat().st_ino != old_inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "old.json", "play.yml"]
    assert sorted(p.name for p in reports.iterdir()) == ["a.json", "b.json"]


@pytest.mark.parametrize(("args", "message"), [
    ({"mode": "644x"}, "mode='644x' is not an octal file mode"),
    ({"mode": "17777"}, "mode='17777' is not an octal file mode"),
    ({"directory_mode": "rwx"}, "directory_mode='rwx' is not an octal file mode"),
    ({"dest": "relative/report.json"}, "dest='relative/report.json' is not an absolute path"),
])
def test_bad_arguments_fail_naming_the_field_and_write_nothing(tmp_path, args, message):
    dest = tmp_path / "reports" / "r.json"
    task = write(dest, "x")
    task["pdnode.sglang_pd.report_file"].update(args)
    record = run_play(tmp_path, [task])
    assert record["rc"] == 2
    (result,) = results(record)
    assert result["failed"] and result["msg"].startswith(message), result["msg"]
    assert "Traceback" not in json.dumps(result)
    assert not (tmp_path / "reports").exists() and not (tmp_path / "relative").exists()


def load_plugin():
    spec = importlib.util.spec_from_file_location("pdnode_report_file_action", PLUGIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_failed_write_leaves_the_old_report_and_no_temporary_file(tmp_path, monkeypatch):
    mod = load_plugin()
    dest = tmp_path / "r.json"
    dest.write_text("the old report")

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mod.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left"):
        mod.write_atomically(str(dest), b"the new report, half written", 0o644, 0o755)
    assert dest.read_text() == "the old report"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
