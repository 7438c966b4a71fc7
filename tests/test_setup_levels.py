"""scripts/setup's two levels, in a copy of the checkout with no .venv (issue 30).

`scripts/setup --runtime` (what scripts/demo runs) installs what the demo's plays need and
not the test toolchain; a plain `scripts/setup` (scripts/test's) then adds the toolchain to
the same .venv instead of making another; a runtime request after that is a no-op.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _setup(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(tree / "scripts" / "setup"), *args], cwd=tree, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def _has(tree: Path, module: str) -> bool:
    return subprocess.run([str(tree / ".venv" / "bin" / "python"), "-c", f"import {module}"],
                          capture_output=True).returncode == 0


def test_runtime_then_full_share_one_venv(tmp_path):
    tree = tmp_path / "checkout"
    tree.mkdir()
    for name in ("scripts", "src", "templates", "playbooks", "roles"):
        shutil.copytree(REPO / name, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)

    _setup(tree, "--runtime")
    venv = tree / ".venv"
    assert (venv / ".pdnode-setup").read_text().split()[1] == "runtime"
    for tool in ("pdnode", "ansible-playbook"):
        assert (venv / "bin" / tool).exists(), tool
    # the demo's connection plugin, and pdnode itself from this copy
    assert _has(tree, "ansible_collections.community.docker.plugins.connection.docker")
    assert _has(tree, "pdnode.core.plan.build")
    # not the test toolchain
    for tool in ("molecule", "ansible-lint", "pytest", "ruff"):
        assert not (venv / "bin" / tool).exists(), f"{tool} came with the runtime"
    made = (venv / "pyvenv.cfg").stat()

    full = _setup(tree)
    assert (venv / ".pdnode-setup").read_text().split()[1] == "full"
    assert "creating .venv" not in full.stdout + full.stderr
    after = (venv / "pyvenv.cfg").stat()
    assert (after.st_ino, after.st_mtime_ns) == (made.st_ino, made.st_mtime_ns), "the full setup made another .venv"
    for tool in ("molecule", "ansible-lint", "pytest", "ruff"):
        assert (venv / "bin" / tool).exists(), tool

    again = _setup(tree, "--runtime")
    assert again.stdout + again.stderr == "", "a runtime request after a full setup installed something"
    assert (venv / ".pdnode-setup").read_text().split()[1] == "full"
