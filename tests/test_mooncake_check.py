"""roles/mooncake's transfer check: host mode moves bytes intact through the real
Mooncake (the non-CUDA build in .venv); GPU mode's arguments are refused in one line
where they cannot work. (GPU mode itself ran on an H200: docs/hardware-runs.md.)"""

from __future__ import annotations

import json
import os
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


# How SGLang 0.5.23 starts Mooncake (topology auto-discovery; the protocol argument picks
# only a buffer allocator), in a process of its own with the plan's RDMA switch.
_START = ("from mooncake.engine import TransferEngine\n"
          "print('rc', TransferEngine().initialize('127.0.0.1', 'P2PHANDSHAKE', 'rdma', ''))\n")


@pytest.mark.integration
def test_mc_force_hca_turns_the_silent_fall_back_into_a_failed_start():
    """Field failures 7c and 8 with the real Mooncake: on a host without a usable RDMA NIC
    its engine starts on TCP in silence, and with the plan's MC_FORCE_HCA it refuses to
    start, logging the line pdnode names (pdnode.core.plan.kv_path). Where the host has an
    active NIC, both start (the switch changes nothing there)."""
    from pdnode.core.plan.kv_path import MOONCAKE_NO_RNIC, RDMA_ENVIRONMENT

    devices = Path("/sys/class/infiniband")
    active = [p for p in devices.glob("*/ports/*/state") if "ACTIVE" in p.read_text()] if devices.is_dir() else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("MC_")}
    plain = subprocess.run([sys.executable, "-c", _START], capture_output=True, text=True, env=env, timeout=120)
    forced = subprocess.run([sys.executable, "-c", _START], capture_output=True, text=True,
                            env={**env, **RDMA_ENVIRONMENT}, timeout=120)
    assert "rc 0" in plain.stdout, plain.stderr[-2000:]
    if active:
        assert "rc 0" in forced.stdout, forced.stderr[-2000:]
    else:
        assert "rc -1" in forced.stdout and MOONCAKE_NO_RNIC in forced.stderr, forced.stdout + forced.stderr[-2000:]
