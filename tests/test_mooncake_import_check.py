"""roles/mooncake/files/mooncake_import_check.py: Mooncake loaded beside the release's torch
before any engine starts; a build for another CUDA fails in one line (issue 28, field
failure 10: Mooncake#1298, vllm#42511, dynamo#14461)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "roles" / "mooncake" / "files" / "mooncake_import_check.py"


def run(python: str, planted: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The check as the role runs it; with PLANTED, in a venv of only what is planted there
    (-S: not this venv's site-packages)."""
    env = {"PATH": "/usr/bin:/bin"} | ({"PYTHONPATH": str(planted)} if planted else {})
    return subprocess.run([python, *(["-S"] if planted else []), "-"], input=CHECK.read_text(), capture_output=True,
                          text=True, timeout=120, env=env, check=False)


def test_the_real_build_loads_and_says_which():
    r = run(sys.executable)  # the project venv holds the stand-in's Mooncake (no torch)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ok"] is True and got["mooncake"].startswith("mooncake-transfer-engine") and got["torch"] is None


def plant(tmp_path: Path, error: str | None) -> Path:
    """A venv's view: torch for CUDA 13, and Mooncake's CUDA 12 build whose engine raises
    what the loader says when libcudart.so.12 is missing."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "__version__ = '2.9.1+cu130'\nclass version:\n    cuda = '13.0'\n")
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "__init__.py").write_text("")
    body = f"raise ImportError({error!r})\n" if error else "class TransferEngine:\n    pass\n"
    (tmp_path / "mooncake" / "engine.py").write_text(body)
    dist = tmp_path / "mooncake_transfer_engine-0.3.14.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mooncake-transfer-engine\nVersion: 0.3.14\n")
    return tmp_path


def test_a_build_for_another_cuda_fails_in_one_line_naming_both_sides(tmp_path):
    r = run(sys.executable, plant(tmp_path, "libcudart.so.12: cannot open shared object file: No such file or directory"))
    assert r.returncode == 1
    (line,) = r.stdout.splitlines()
    assert line.startswith("mooncake-transfer-engine 0.3.14 does not load beside torch 2.9.1+cu130 (CUDA 13.0) in "), line
    assert ", it needs CUDA 12's libcudart.so.12: libcudart.so.12: cannot open shared object file" in line, line
    assert "Fix: install the Mooncake build for the stack's CUDA" in line and "mooncake-transfer-engine-cuda13" in line
    assert "Traceback" not in r.stdout + r.stderr


def test_the_planted_build_that_loads_passes(tmp_path):
    r = run(sys.executable, plant(tmp_path, None))
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout)
    assert got["torch"] == "2.9.1+cu130" and got["torch_cuda"] == "13.0"
    assert "mooncake-transfer-engine 0.3.14" in got["mooncake"]


def test_the_builds_it_names_are_the_ones_pdnode_installs():
    import ast

    from pdnode.core.rules.mooncake_select import PACKAGES

    tree = ast.parse(CHECK.read_text())
    (builds,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", None) == "BUILDS"]
    assert sorted(builds) == sorted(PACKAGES.values())
