"""mooncake: the non-CUDA engine in the release virtualenv, importable, and moving real
bytes between two engines on loopback (tcp, P2PHANDSHAKE) at a measured bandwidth."""

import json

VENV = "/opt/sglang-pd/venvs/test-release"
TOOL = f"{VENV}/bin/pdnode-mooncake-loopback-check.py"


def test_system_libraries(host):
    assert host.package("libibverbs1").is_installed
    assert host.package("libnuma1").is_installed


def test_installed_build_and_version(host):
    out = host.run(f"{VENV}/bin/python -m pip list --format=json")
    pkgs = {p["name"]: p["version"] for p in json.loads(out.stdout)}
    assert pkgs.get("mooncake-transfer-engine-non-cuda") == "0.3.13.post1"
    assert "mooncake-transfer-engine" not in pkgs and "mooncake-transfer-engine-cuda13" not in pkgs


def test_engine_imports(host):
    out = host.run(f"{VENV}/bin/python -c 'from mooncake.engine import TransferEngine; TransferEngine()'")
    assert out.rc == 0, out.stderr


def test_loopback_transfer_measures_bandwidth(host):
    out = host.run(f"{VENV}/bin/python {TOOL} --bytes 33554432 --iterations 3")
    assert out.rc == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] is True and result["intact"] is True
    assert result["package"] == "mooncake-transfer-engine-non-cuda" and result["protocol"] == "tcp"
    assert result["write_gb_s_best"] > 0 and result["read_gb_s"] > 0
    print(f"mooncake loopback (tcp, 32 MiB x 3): write {result['write_gb_s_best']} GB/s best, "
          f"{result['write_gb_s_mean']} GB/s mean, read {result['read_gb_s']} GB/s")
