"""The preflight on a GPU-less systemd container: what it reported, and that it changed
nothing. The JSON reports are written on the controller (molecule's ephemeral dir)."""

import json
import os
from pathlib import Path

import pytest

REPORTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])


def report(name: str) -> dict:
    return json.loads((REPORTS / name / "pdnode-mol-preflight.json").read_text())


@pytest.fixture(scope="module")
def failing() -> dict:
    return report("preflight")


def test_verdict_fails_with_errors_first(failing):
    v = failing["verdict"]
    assert v["ok"] is False
    assert [p["check"] for p in v["problems"] if p["severity"] == "error"] == \
        ["gpu.count"] + [f"nic.mlx5_{i}" for i in range(8)] + ["port.8000", "model.path"]
    # no driver to check yet; the container's 8 MiB memlock limit with an RDMA backend
    assert [p["check"] for p in v["problems"] if p["severity"] == "warning"] == ["driver", "memlock"]


def test_expectations_came_from_the_gpu01_plan(failing):
    e = failing["expect"]
    assert (e["gpu_count"], e["gpu_model"], e["driver_branch"]) == (8, "NVIDIA H200", 580)
    assert e["gpu_ids"] == list(range(8))
    assert e["ports"]["router.port"] == 8000 and e["ports"]["prefill-0.port"] == 30000
    assert e["nics"]["7"] == "mlx5_7"


def test_facts_read_from_the_container(failing):
    f = failing["facts"]
    assert f["init"] == {"pid1": "systemd", "systemd_booted": True}
    assert (f["os"]["id"], f["os"]["major"]) == ("debian", "12")
    assert f["driver"]["present"] is False and f["pci"]["nvidia_gpus"] == 0
    owners = {s["port"]: s["unit"] for s in f["listeners"]}
    assert owners[8000] == "foreign-web.service"
    assert owners[30000] == "sglang-pd-prefill-0.service"


def test_passing_case(host):
    v = report("preflight-pass")["verdict"]
    assert v["ok"] is True and v["errors"] == []
    assert [p["check"] for p in v["problems"]] == ["driver"]  # a warning: no driver to check yet


def test_host_unchanged(host):
    # The preflight only reads: no package, no file of the node, the listeners still up.
    assert not host.file("/opt/sglang-pd").exists
    assert not host.package("nvidia-open").is_installed
    assert host.service("foreign-web").is_running
    assert host.service("sglang-pd-prefill-0").is_running
