"""The drift matrix's generator (molecule/node/tests/drift_cases.py, issue 27 item 6) proven
without a container: every managed path is a case of each aspect it restores and of no
other, each drift command really changes that aspect of a real file here, and the judge
sees a drift only where one is (a judge that always says "drifted" would pass a matrix
that planted nothing)."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from planvars import variables

from pdnode.core.plan.build import build_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "molecule" / "node" / "tests"))
from drift_cases import ASPECTS, cases, drift_command, drifted, expected_restores  # noqa: E402

PLAN = build_plan(variables("demo"), "node").as_dict()


def test_each_aspect_lists_exactly_the_paths_that_restore_it():
    generated = cases(PLAN)
    assert list(generated) == list(ASPECTS)
    for aspect in ASPECTS:
        assert [e["path"] for e in generated[aspect]] == \
            [e["path"] for e in PLAN["managed"] if aspect in e["restores"]], aspect
    # the admin key: its owner, group, mode and presence are restored, its content is the host's
    key = PLAN["install"]["admin_key_path"]
    assert [a for a in ASPECTS if key in [e["path"] for e in generated[a]]] == ["mode", "owner", "group", "presence"]
    assert all(e["kind"] != "directory" for e in generated["content"])
    assert len(generated["presence"]) < len(PLAN["managed"])  # the install root is never removed


def test_every_path_restores_what_its_kind_asks_for():
    """The plan's `restores` against the kinds' rule written apart from it: a kind whose
    cases shrink (presence dropped from the managed directories) fails here."""
    plans = [PLAN, build_plan(variables("gpu01-2p1d"), "node").as_dict()]
    for plan in plans:
        for e in plan["managed"]:
            assert set(e["restores"]) == expected_restores(plan, e), e
    # the rule has teeth: directories are removed and restored, the admin key's content is not
    directory = next(e for e in PLAN["managed"] if e["kind"] == "directory" and e["path"] != PLAN["install"]["root"])
    assert "presence" in expected_restores(PLAN, directory)
    key = next(e for e in PLAN["managed"] if e["path"] == PLAN["install"]["admin_key_path"])
    assert "content" not in expected_restores(PLAN, key)


def _stat(path: Path) -> dict | None:
    if not path.exists():
        return None
    st = path.stat()
    return {"mode": f"{st.st_mode & 0o7777:04o}", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


@pytest.mark.parametrize("aspect", ["content", "mode", "presence"])
@pytest.mark.parametrize("mode", ["0640", "0400", "0644"])
def test_a_drift_command_changes_its_aspect_of_a_real_file_and_the_judge_sees_it(tmp_path, aspect, mode):
    path = tmp_path / "it's a file"  # a name the shell must be given quoted
    path.write_text("planned\n")
    os.chmod(path, int(mode, 8))
    entry = {"path": str(path), "mode": mode, "owner": "root", "group": "root"}
    before = _stat(path)
    assert not drifted(aspect, entry, before, before), "the judge saw a drift in an untouched file"
    subprocess.run(["sh", "-c", drift_command(aspect, entry)], check=True)
    now = _stat(path)
    assert drifted(aspect, entry, before, now), (aspect, before, now)
    if aspect == "mode":  # the other-read bit flipped, nothing else
        assert int(now["mode"], 8) ^ int(mode, 8) == 0o004
        assert now["sha256"] == before["sha256"]
    if aspect == "content":
        assert now["mode"] == mode


@pytest.mark.parametrize(("aspect", "planned", "other"),
                         [("owner", "root", "nobody"), ("owner", "sglang", "root"),
                          ("group", "root", "nogroup"), ("group", "sglang", "root")])
def test_owner_and_group_drift_to_another_account_and_only_that_is_judged(aspect, planned, other):
    entry = {"path": "/etc/sglang-pd/a key", "mode": "0400", "owner": planned, "group": planned}
    command = shlex.split(drift_command(aspect, entry))
    assert command == [{"owner": "chown", "group": "chgrp"}[aspect], other, "/etc/sglang-pd/a key"]
    before = {"mode": "0400", "owner": planned, "group": planned, "sha256": "a"}
    assert not drifted(aspect, entry, before, before)
    assert drifted(aspect, entry, before, {**before, aspect: other})
    assert not drifted(aspect, entry, before, None), "a path that is gone did not drift its owner"
    assert not drifted("content", entry, before, {**before, aspect: other})


def test_presence_is_judged_by_absence_and_content_by_digest():
    entry = {"path": "/x", "mode": "0644", "owner": "root", "group": "root"}
    before = {"mode": "0644", "owner": "root", "group": "root", "sha256": "a"}
    assert drifted("presence", entry, before, None) and not drifted("presence", entry, before, before)
    assert drifted("content", entry, before, {**before, "sha256": "b"})
    assert not drifted("content", entry, before, None)
    assert not drifted("mode", entry, before, {**before, "sha256": "b"})
