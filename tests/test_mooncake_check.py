"""roles/mooncake's transfer check: host mode moves bytes intact through the real
Mooncake (the non-CUDA build in .venv); GPU mode's arguments are refused in one line
where they cannot work. (GPU mode itself ran on an H200: docs/hardware-runs.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parents[1] / "roles" / "mooncake" / "files" / "mooncake_loopback_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, check=False,
                          timeout=300)


@pytest.mark.integration
def test_host_memory_over_tcp_arrives_intact():
    r = _run("--bytes", str(1 << 20), "--iterations", "2")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and out["ok"] and out["intact"], r.stdout + r.stderr[-2000:]
    assert out["memory"] == "host" and out["transport"] == "tcp" and out["write_gb_s_best"] > 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--intranode-nvlink"], "give --src-gpu and --dst-gpu"),
    (["--src-gpu", "0"], "--src-gpu and --dst-gpu go together"),
])
def test_gpu_mode_arguments_that_cannot_work_are_one_line_exit_2(args, needle):
    r = _run(*args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
