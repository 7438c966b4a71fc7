"""The project's pytest policy (conftest.py): a skip, an xfail and an xpass fail the run;
only passing tests pass it. Each case runs pytest in a directory of its own with a copy
of the policy, so what is asserted is pytest's real exit code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "pass": ("def test_x():\n    pass\n", 0),  # the only outcome that passes
    "skip": ("import pytest\n\ndef test_x():\n    pytest.skip('a component is missing')\n", 1),
    "skip at collection": ("import pytest\npytest.skip('no module', allow_module_level=True)\n", 1),
    "xfail": ("import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_x():\n    assert False\n", 1),
    "xpass": ("import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_x():\n    pass\n", 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_policy_fails_every_outcome_but_a_pass(tmp_path, case):
    source, want = CASES[case]
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_case.py").write_text(source)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    # 1: tests failed; 5 (a module skipped whole collects nothing): no tests ran
    assert proc.returncode == want or (want and proc.returncode == 5), proc.stdout + proc.stderr
    if want:
        assert "skipped tests fail this run" in proc.stdout
