"""The interruption tests kill a run before a task named "role : task" (or "handler:
role : task"). A renamed task makes such a boundary unreachable, and the molecule test
fails only after a 15-minute scenario; this checks every boundary names a task that
exists, in seconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# The playbooks name the roles by FQCN, and Ansible names a role's tasks the same way.
COLLECTION = "pdnode.sglang_pd"


def _boundaries(test_file: str, constant: str) -> list[str]:
    tree = ast.parse((ROOT / test_file).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == constant for t in node.targets):
            value = ast.literal_eval(node.value)
            return [value] if isinstance(value, str) else value
    raise AssertionError(f"{test_file} has no {constant}")


def _names(items: list, role: str, prefix: str) -> set[str]:
    out: set[str] = set()
    for item in items or []:
        if isinstance(item, dict) and "name" in item:
            out.add(f"{prefix}{COLLECTION}.{role} : {item['name']}")
            for key in ("block", "rescue", "always"):
                out |= _names(item.get(key), role, prefix)
    return out


def task_names() -> set[str]:
    names: set[str] = set()
    for role in (ROOT / "roles").iterdir():
        for path in sorted((role / "tasks").glob("*.yml")):
            names |= _names(yaml.safe_load(path.read_text()), role.name, "")
        for path in sorted((role / "handlers").glob("*.yml")):
            names |= _names(yaml.safe_load(path.read_text()), role.name, "handler: ")
    return names


CASES = [(f, c, b) for f, c in [("molecule/node/tests/test_deploy_safety.py", "KILL_BEFORE"),
                                ("molecule/node/tests/test_deploy_safety.py", "FIRST_WRITE"),
                                ("molecule/node/tests/test_layouts.py", "DRAIN_KILL_BEFORE")]
         for b in _boundaries(f, c)]


@pytest.mark.parametrize(("test_file", "constant", "boundary"), CASES, ids=[c[2] for c in CASES])
def test_every_kill_boundary_names_a_task_that_exists(test_file, constant, boundary):
    assert boundary in task_names(), f"{test_file} {constant}: no task {boundary!r} (renamed?)"


def test_a_renamed_task_is_caught():
    assert "pdnode.sglang_pd.sglang : Tell the services whether the release changed" not in task_names()
    assert "sglang : Tell the services whether the release or the router's venv changed" not in task_names()
