"""The plan's per-service facts (unit, exec argv, readiness URLs, key paths, release):
the units only read them, so they are tested here once."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pdnode.inventory import load_inventory
from pdnode.plan import build_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_vars():
    return load_inventory(ROOT / "inventories" / "demo").variables


def _plan(base, **changes):
    v = copy.deepcopy(base)
    v.update(changes)
    return build_plan(v).as_dict()


def test_services_of_the_demo_node(demo_vars):
    p = _plan(demo_vars)
    py = p["install"]["venv"] + "/bin/python"
    assert p["install"]["python"] == py
    s = p["services"]
    assert set(s) == {"prefill", "decode", "router"}
    assert s["prefill"] == {
        "unit": "sglang-pd-prefill.service",
        "exec": [py, "-m", "pdnode.launcher", "--engine", "sim", "--watchdog-url", "http://127.0.0.1:30000/health",
                 "/etc/sglang-pd/prefill.json"],
        "ready": ["http://127.0.0.1:30000/health",
                  "http://127.0.0.1:8998/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                  "&target_tp_rank=-1&target_pp_rank=-1"],
    }
    assert s["decode"]["exec"][-1] == "/etc/sglang-pd/decode.json"
    assert s["decode"]["ready"] == ["http://127.0.0.1:30001/health"]
    assert s["router"] == {
        "unit": "sglang-pd-router.service",
        "exec": [py, "-m", "pdnode.router_launch", "/etc/sglang-pd/router.json",
                 "--admin-key-file", "/etc/sglang-pd/router-admin-key"],
        "ready": ["http://127.0.0.1:8000/readiness"],
    }
    assert p["install"]["api_key_path"] == "/etc/sglang-pd/api-key"
    assert p["install"]["admin_key_path"] == "/etc/sglang-pd/router-admin-key"


def test_api_key_file_goes_to_every_service(demo_vars):
    s = _plan(demo_vars, pdnode_api_key_file="files/key", pdnode_config_dir="/etc/pd")["services"]
    for role in ("prefill", "decode", "router"):
        assert s[role]["exec"][-2:] == ["--api-key-file", "/etc/pd/api-key"], role
    # The admin key is always there and separate from the client key.
    assert s["router"]["exec"][4:6] == ["--admin-key-file", "/etc/pd/router-admin-key"]


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://127.0.0.1:8000/readiness"),
    ("::", "http://[::1]:8000/readiness"),
    ("127.0.0.1", "http://127.0.0.1:8000/readiness"),
    # A specific address: the router does not answer on loopback there (the gate used
    # to wait its whole timeout, 1800 s).
    ("10.1.2.3", "http://10.1.2.3:8000/readiness"),
    ("fd00::7", "http://[fd00::7]:8000/readiness"),
])
def test_router_readiness_follows_its_bind_address(demo_vars, host, url):
    assert _plan(demo_vars, pdnode_router_host=host)["services"]["router"]["ready"] == [url]


def test_worker_readiness_on_ipv6_loopback_is_bracketed(demo_vars):
    s = _plan(demo_vars, pdnode_worker_host="::1")["services"]
    assert s["decode"]["ready"] == ["http://[::1]:30001/health"]
    assert s["prefill"]["ready"][1].startswith("http://[::1]:8998/route?")


def test_every_version_in_the_venv_names_the_release(demo_vars):
    base = _plan(demo_vars)["install"]["venv"]
    for name, value in (("pdnode_mooncake_cuda13_version", "9.9.9"), ("pdnode_mooncake_version", "9.9.8"),
                        ("pdnode_sglang_router_version", "9.9.7")):
        venv = _plan(demo_vars, **{name: value})["install"]["venv"]
        assert venv != base and value in venv, name
