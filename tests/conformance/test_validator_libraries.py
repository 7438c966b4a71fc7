"""Every compiled extension of SGLang's validation environment resolves its shared
libraries on this machine (the same check as tests/test_system_libraries.py for .venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from system_libraries import explain, shared_objects, unresolved  # noqa: E402

pytestmark = pytest.mark.conformance


def test_every_shared_object_in_the_validator_resolves(sglang_env):
    site = Path(subprocess.run([str(sglang_env), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    objects = shared_objects(site)
    assert any("torch" in p.parts for p in objects), f"no torch under {site}"
    problems = explain(unresolved(objects), site)
    assert not problems, "\n".join(problems)
