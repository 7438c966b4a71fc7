"""scripts/lib/test-host-weight.sh: for one run of scripts/test, Docker's cgroup (cgroupfs
driver, cgroup v1) weighs as much as the test hosts it holds, and gets its weight back at
the end; with another driver or cgroup v2, or already heavier, nothing is touched. Run by
bash against a file standing for cpu.shares and a `docker` that answers `docker info`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(tmp_path: Path, driver: str, before: str) -> tuple[list[str], str]:
    """The shares after weigh_test_hosts and after restore_test_hosts_weight, and stderr."""
    shares = tmp_path / "cpu.shares"
    shares.write_text(before + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\necho '{driver}'\n")
    docker.chmod(0o755)
    script = ("source scripts/lib/common.sh; source scripts/lib/test-host-weight.sh; "
              f"weigh_test_hosts; cat {shares}; restore_test_hosts_weight; cat {shares}")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PDNODE_DOCKER_CPU_SHARES_FILE": str(shares)}
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return proc.stdout.split(), proc.stderr


def test_cgroupfs_on_v1_weighs_the_test_hosts_for_the_run_then_gives_the_weight_back(tmp_path):
    during_and_after, said = run(tmp_path, "cgroupfs 1", "1024")
    assert during_and_after == ["8192", "1024"]
    assert "weigh 8192 CPU shares for this run (were 1024)" in said


@pytest.mark.parametrize(("driver", "before"), [("systemd 2", "1024"), ("cgroupfs 2", "1024"), ("", "1024"),
                                                ("cgroupfs 1", "9000")])
def test_other_drivers_or_a_heavier_weight_are_left_alone(tmp_path, driver, before):
    assert run(tmp_path, driver, before)[0] == [before, before]
