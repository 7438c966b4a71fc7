"""kv.transport (issue 28, field failure 8): the transport each engine's Mooncake logged at
start against the plan's KV path. The lines are Mooncake 0.3.14's own (read in its cuda13
wheel); the stand-in logs the one its simulated host would, and falls back as Mooncake does
when the host has no usable RDMA device (PDNODE_SIM_NO_HCA=1)."""

from __future__ import annotations

import pytest

from pdnode.core.plan.kv_path import MOONCAKE_TRANSPORT_LINES, logged_transport
from pdnode.standin.config import load_sim_settings as sim_from_env

GLOG = "I1203 17:25:49.429721  3726 transfer_engine_impl.cpp:387] "


@pytest.mark.parametrize(("message", "path"), list(MOONCAKE_TRANSPORT_LINES.items()))
def test_each_mooncake_line_gives_its_transport(message, path):
    text = (f"{GLOG}Auto-discovering topology...\n{GLOG}Topology discovery complete. Found 2 HCAs.\n"
            f"{GLOG}{message}\nINFO other line\n")
    assert logged_transport(text) == (path, message)


def test_no_line_is_none_and_the_last_line_wins():
    assert logged_transport(f"{GLOG}Topology discovery complete. Found 0 HCAs.\n") is None
    rdma, tcp = "Using RDMA transport (RoCE/iWARP)", "Using TCP transport (no HCA detected)"
    assert logged_transport(f"{GLOG}{rdma}\n{GLOG}{tcp}\n") == ("tcp", tcp)  # a restart's, in one invocation


@pytest.mark.parametrize(("env", "backend", "path"), [
    ({"MC_INTRANODE_NVLINK": "1"}, "mooncake", "nvlink"),
    ({}, "mooncake", "rdma"),
    ({"PDNODE_SIM_NO_HCA": "1"}, "mooncake", "tcp"),           # the silent fall-back
    ({"MC_FORCE_TCP": "1"}, "mooncake", "tcp"),
    ({}, "mooncake_tcp", "tcp"),
    ({"MC_INTRANODE_NVLINK": "1", "PDNODE_SIM_NO_HCA": "1"}, "mooncake", "nvlink"),  # NVLink needs no HCA
])
def test_the_standin_logs_what_mooncake_would_and_moves_at_that_paths_speed(env, backend, path):
    sim = sim_from_env(env)
    assert sim.kv_path(backend) == path
    assert logged_transport(sim.mooncake_line(backend)) == (path, sim.mooncake_line(backend))
    if env.get("PDNODE_SIM_NO_HCA") and path == "tcp":  # the plan rendered RDMA's speed; the fall-back has TCP's
        assert sim_from_env({**env, "PDNODE_SIM_KV_GB_S": "40"}).kv_speed_gb_s(backend) == \
            sim_from_env({"MC_FORCE_TCP": "1"}).kv_speed_gb_s(backend)


@pytest.mark.parametrize(("env", "backend", "fails"), [
    ({"MC_FORCE_HCA": "1", "PDNODE_SIM_NO_HCA": "1"}, "mooncake", True),    # the plan's RDMA switch, no NIC
    ({"MC_FORCE_HCA": "1"}, "mooncake", False),                             # NICs there: RDMA as before
    ({"MC_FORCE_HCA": "1", "PDNODE_SIM_NO_HCA": "1"}, "mooncake_tcp", False),  # MC_FORCE_TCP comes first
    ({"MC_FORCE_HCA": "1", "MC_INTRANODE_NVLINK": "1", "PDNODE_SIM_NO_HCA": "1"}, "mooncake", False),
    ({"PDNODE_SIM_NO_HCA": "1"}, "mooncake", False),                        # the silent fall-back of row 8
])
def test_the_standin_fails_its_start_where_mooncake_would(env, backend, fails):
    error = sim_from_env(env).mooncake_start_error(backend)
    assert (error is not None) == fails
    if fails:
        assert "RdmaTransport: No available RNIC" in error and "Failed to install RDMA transport" in error


def _transport_ctx(path: str):
    import copy

    from conftest import minimal_plan
    from pdnode.verify.base import Ctx
    from pdnode.verify.config import build_run

    plan = copy.deepcopy(minimal_plan())
    plan.setdefault("cluster", {})["kv"] = {"path": path, "checks": []}
    return Ctx(build_run(plan, env={}, skip_burst=True, on_node=True))


def test_the_check_fails_naming_the_engine_whose_mooncake_logged_another_transport(monkeypatch):
    """kv.transport on the node: each engine's journal since its start against the plan's
    path; the engine that fell back to TCP is the one named (row 8's silent fall-back)."""
    from pdnode.verify import checks_transport as ct
    from pdnode.verify.base import FAIL, PASS

    rdma, tcp = "Using RDMA transport (RoCE/iWARP)", "Using TCP transport (no HCA detected)"
    ctx = _transport_ctx("rdma")
    units = {i.id: i.unit for i in ctx.t.instances if i.unit}
    assert sorted(units) == ["decode-0", "prefill-0"], units
    logged = {units["prefill-0"]: f"{GLOG}{rdma}\n", units["decode-0"]: f"{GLOG}{tcp}\n"}
    monkeypatch.setattr(ct.svc, "systemctl_available", lambda: True)
    monkeypatch.setattr(ct, "_journal", lambda unit: logged[unit])
    r = ct.check_kv_transport(ctx)
    assert r.status == FAIL, r.evidence
    assert f"decode-0 logged {tcp!r}: tcp, not the plan's rdma" in r.evidence and "prefill-0: rdma" in r.evidence
    assert r.hint.startswith("decode-0 moves the KV cache over another transport than the plan's rdma")
    logged[units["decode-0"]] = f"{GLOG}{rdma}\n"
    assert ct.check_kv_transport(ctx).status == PASS
