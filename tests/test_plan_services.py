"""The plan's per-service facts (unit, exec argv, readiness URLs, key paths, release):
the units only read them, so they are tested here once."""

from __future__ import annotations

import pytest
from planvars import changed, variables

from pdnode.core.plan.build import PlanError, build_plan

READ_BY_UNITS = ("unit", "exec", "ready")


@pytest.fixture(scope="module")
def demo_vars():
    return variables("demo")


def _plan(base, **changes):
    return build_plan(changed(base, changes)).as_dict()


def _units_view(service):
    return {k: service[k] for k in READ_BY_UNITS}


def test_services_of_the_demo_node(demo_vars):
    p = _plan(demo_vars)
    py = p["install"]["venv"] + "/bin/python"
    assert p["install"]["python"] == py
    s = p["services"]
    assert list(s) == ["prefill-0", "decode-0", "router"]
    assert _units_view(s["prefill-0"]) == {
        "unit": "sglang-pd-prefill-0.service",
        "exec": [py, "-m", "pdnode.node.launcher", "--engine", "sim", "--watchdog-url", "http://127.0.0.1:30000/health",
                 "/etc/sglang-pd/prefill-0.json"],
        "ready": ["http://127.0.0.1:30000/health",
                  "http://127.0.0.1:8998/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                  "&target_tp_rank=-1&target_pp_rank=-1"],
    }
    assert s["decode-0"]["exec"][-1] == s["decode-0"]["config"] == "/etc/sglang-pd/decode-0.json"
    assert s["decode-0"]["ready"] == ["http://127.0.0.1:30001/health"]
    # The router runs from its own venv, named by its package and version only: a new
    # release of the engines leaves its unit unchanged (docs/decisions.md).
    router_py = "/opt/sglang-pd/venvs/router-smg-1.13.0/bin/python"
    assert p["install"]["router_python"] == router_py
    assert s["router"]["live_args"] == ["prefill", "decode"]
    assert _units_view(s["router"]) == {
        "unit": "sglang-pd-router.service",
        "exec": [router_py, "-m", "pdnode.node.router_launch", "/etc/sglang-pd/router.json", "--router-package", "smg",
                 "--admin-key-file", "/etc/sglang-pd/router-admin-key"],
        "ready": ["http://127.0.0.1:8000/readiness"],
    }
    assert p["install"]["api_key_path"] == "/etc/sglang-pd/api-key"
    assert p["install"]["admin_key_path"] == "/etc/sglang-pd/router-admin-key"


def test_api_key_file_goes_to_every_service(demo_vars):
    s = _plan(demo_vars, pdnode_api_key_file="files/key", pdnode_config_dir="/etc/pd")["services"]
    for sid in ("prefill-0", "decode-0", "router"):
        assert s[sid]["exec"][-2:] == ["--api-key-file", "/etc/pd/api-key"], sid
    # The admin key is always there and separate from the client key.
    assert s["router"]["exec"][6:8] == ["--admin-key-file", "/etc/pd/router-admin-key"]


def test_smg_is_the_default_release_started_by_package(demo_vars):
    p = _plan(demo_vars)
    assert "-smg-1.13.0-" in p["install"]["venv"] and "-router-" not in p["install"]["venv"]
    assert p["install"]["router_requirement"] == "smg==1.13.0"
    router = p["services"]["router"]
    assert router["exec"][4:6] == ["--router-package", "smg"] and router["args"]["log_json"] is True
    assert router["args"]["policy"] == p["settings"]["pdnode_router_policy"] == "power_of_two"


def test_sglang_router_stays_selectable(demo_vars):
    p = _plan(demo_vars, pdnode_router_package="sglang-router")
    assert "-router-0.3.2-" in p["install"]["venv"] and "-smg-" not in p["install"]["venv"]
    assert p["install"]["router_requirement"] == "sglang-router==0.3.2"
    router = p["services"]["router"]
    assert router["exec"][4:6] == ["--router-package", "sglang-router"] and "log_json" not in router["args"]
    assert router["args"]["policy"] == "cache_aware"


@pytest.mark.parametrize(("package", "policy", "refused"), [
    ("smg", "cache_aware", True), ("smg", "power_of_two", False), ("smg", "round_robin", False),
    ("sglang-router", "cache_aware", False)])
def test_smg_with_cache_aware_is_refused_where_the_router_has_a_choice(demo_vars, package, policy, refused):
    two = [{"gpus": [0, 1]}, {"gpus": [2, 3], "name": "b"}]
    changes = {"pdnode_router_package": package, "pdnode_router_policy": policy}
    for layout in ({"pdnode_prefill_instances": two}, {"pdnode_decode_instances": [{"gpus": [4, 5]},
                                                                                   {"gpus": [6, 7], "name": "b"}]}):
        try:
            _plan(demo_vars, **changes, **layout)
            lines = []
        except PlanError as exc:
            lines = [str(p) for p in exc.problems]
        assert lines == ([
            "pdnode_router_policy='cache_aware': with smg 1.13 and several prefills or decodes, one dead instance "
            "fails requests and can take the node down for minutes (retries stay on the dead prefill and open the "
            "decode's breaker: 180 s measured, docs/smg.md). Fix: use power_of_two (or unset it; round_robin also "
            "lost 0 requests), or pdnode_router_package: sglang-router."] if refused else []), layout
    # one prefill and one decode: the policy has no choice to make
    assert _plan(demo_vars, **changes)["services"]["router"]["args"]["policy"] == policy


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
    assert s["decode-0"]["ready"] == ["http://[::1]:30001/health"]
    assert s["prefill-0"]["ready"][1].startswith("http://[::1]:8998/route?")


def test_every_version_in_the_venv_names_the_release(demo_vars):
    base = _plan(demo_vars)["install"]["venv"]
    for name, value in (("pdnode_mooncake_cuda13_version", "9.9.9"), ("pdnode_mooncake_version", "9.9.8"),
                        ("pdnode_smg_version", "9.9.7")):
        venv = _plan(demo_vars, **{name: value})["install"]["venv"]
        assert venv != base and value in venv, name


def test_every_instance_is_a_service_of_its_own(demo_vars):
    """2P2D: one unit, config, environment file, URL and readiness gate per instance;
    the router registers every prefill with its bootstrap port and every decode."""
    p = _plan(demo_vars, pdnode_prefill_instances=[{"gpus": [0, 1]}, {"gpus": [2, 3], "name": "b"}],
              pdnode_decode_instances=[{"gpus": [4, 5]}, {"gpus": [6, 7]}])
    s = p["services"]
    assert list(s) == ["prefill-0", "prefill-b", "decode-0", "decode-1", "router"]
    engines = [v for v in s.values() if v["role"] in ("prefill", "decode")]
    for key in ("unit", "config", "env_file", "url"):
        assert len({v[key] for v in engines}) == 4, key
    assert s["prefill-b"]["unit"] == "sglang-pd-prefill-b.service"
    assert s["prefill-b"]["env_file"] == "/etc/sglang-pd/prefill-b.env"
    assert [v["ready"][0] for v in engines] == [v["url"] + "/health" for v in engines]
    assert [v["exec"][-1] for v in engines] == [v["config"] for v in engines]
    assert s["router"]["args"]["prefill"] == [["http://127.0.0.1:30000", 8998], ["http://127.0.0.1:30010", 8999]]
    assert s["router"]["args"]["decode"] == ["http://127.0.0.1:30001", "http://127.0.0.1:30011"]
    assert s["prefill-b"]["ready"][1].startswith("http://127.0.0.1:8999/route?")
    assert "bootstrap_port" not in s["decode-1"]


def test_restart_coupling_follows_the_number_of_prefills(demo_vars):
    one = _plan(demo_vars)["services"]
    assert one["decode-0"]["bound_to"] == one["prefill-0"]["unit"]
    assert one["prefill-0"]["upholds"] == [one["decode-0"]["unit"]] and one["prefill-0"]["restart_delay_s"] is None
    two = _plan(demo_vars, pdnode_prefill_instances=[{"gpus": [0, 1]}, {"gpus": [2, 3]}])["services"]
    assert two["decode-0"]["bound_to"] is None and two["prefill-0"]["upholds"] == []
    # a prefill stays down until every decode's heartbeats dropped it: 5 s x 2 failed checks + 1 s
    assert two["prefill-0"]["restart_delay_s"] == two["prefill-1"]["restart_delay_s"] == 11
    slow = _plan(demo_vars, pdnode_prefill_instances=[{"gpus": [0, 1]}, {"gpus": [2, 3]}],
                 pdnode_disagg_heartbeat_interval_s=7, pdnode_disagg_heartbeat_max_failure=3)["services"]
    assert slow["prefill-1"]["restart_delay_s"] == 22  # 7 x 3 + 1
    # the engines get the same heartbeat the coupling waits for
    assert slow["decode-0"]["environment"]["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "7"
    assert slow["prefill-0"]["environment"]["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "3"


@pytest.mark.parametrize("prefills", [[{"gpus": [0, 1, 2, 3]}], [{"gpus": [0, 1]}, {"gpus": [2, 3]}]])
def test_every_service_has_every_key_the_templates_read(demo_vars, prefills):
    """The role's templates loop over all services: a key missing on one (the router) is
    an Ansible error at deploy time, not at plan time."""
    services = _plan(demo_vars, pdnode_prefill_instances=prefills)["services"]
    keys = {"id", "role", "name", "unit", "exec", "ready", "config", "env_file", "args", "environment", "gpus",
            "url", "bound_to", "upholds", "restart_delay_s"}
    for sid, svc in services.items():
        assert keys <= set(svc), (sid, keys - set(svc))
