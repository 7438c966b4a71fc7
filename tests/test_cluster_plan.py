"""A layout over several hosts (pdnode.core.plan.cluster): each host's plan holds what runs on it,
workers bind the host's address and the router registers them there, an instance
spanning hosts is rendered per node rank, the firewall admits exactly the peers, and
`pdnode check` / `explain` describe the whole layout."""

from __future__ import annotations

import copy
import json

import pytest
from planvars import ROOT

from pdnode.commands import cli
from pdnode.core.plan.cluster import layout_view
from pdnode.core.inventory.read import inventory_variables
from pdnode.core.plan.build import PlanError, build_plan
from pdnode.verify.config import build_run

PAIR = ROOT / "inventories" / "gpu-pair"


@pytest.fixture(scope="module")
def pair():
    return inventory_variables(PAIR)


def plans(peers):
    return {h: build_plan(peers[h], h, peers).as_dict() for h in peers}


def test_each_host_plans_only_what_runs_on_it(pair):
    p = plans(pair)
    assert list(p["gpu01"]["services"]) == ["prefill-0", "prefill-1"]
    assert list(p["gpu02"]["services"]) == ["decode-0", "router"]
    assert p["gpu01"]["cluster"] == p["gpu02"]["cluster"]  # one layout, seen alike from every host
    assert p["gpu01"]["cluster"]["hosts"] == {"gpu01": {"address": "10.20.0.11", "services": ["prefill-0", "prefill-1"]},
                                              "gpu02": {"address": "10.20.0.12", "services": ["decode-0", "router"]}}


def test_workers_bind_their_hosts_address_and_the_router_registers_them_there(pair):
    p = plans(pair)
    assert p["gpu01"]["services"]["prefill-1"]["args"]["host"] == "10.20.0.11"
    assert p["gpu01"]["services"]["prefill-1"]["environment"]["SGLANG_HOST_IP"] == "10.20.0.11"
    assert p["gpu02"]["services"]["decode-0"]["args"]["host"] == "10.20.0.12"
    router = p["gpu02"]["services"]["router"]["args"]
    assert router["prefill"] == [["http://10.20.0.11:30000", 8998], ["http://10.20.0.11:30010", 8999]]
    assert router["decode"] == ["http://10.20.0.12:30001"]
    assert p["gpu02"]["cluster"]["router"]["url"] == "http://10.20.0.12:8000"
    # across hosts systemd cannot couple units: the prefills wait out the decode's heartbeat instead
    assert all(s["bound_to"] is None for s in p["gpu02"]["services"].values())
    assert all(s["restart_delay_s"] for s in p["gpu01"]["services"].values())


def test_the_firewall_admits_exactly_the_peers_to_the_hosts_listeners(pair):
    p = plans(pair)
    fw1, fw2 = p["gpu01"]["firewall"], p["gpu02"]["firewall"]
    assert fw1["enabled"] and fw1["peers"] == ["10.20.0.12"] and fw1["public_tcp_ports"] == []
    assert {30000, 30010, 8998, 8999, 31000, 31010} == set(fw1["tcp_ports"])
    assert fw2["peers"] == ["10.20.0.11"] and fw2["public_tcp_ports"] == [8000]
    assert 30001 in fw2["tcp_ports"] and 30234 in fw2["tcp_ports"] and 8000 not in fw2["tcp_ports"]
    assert [15000, 17000] in fw1["tcp_port_ranges"]  # Mooncake's RPC and transfer ports
    # the role's view (pdnode.core.plan.roles.firewall): what the rules file writes
    view1, view2 = p["gpu01"]["roles"]["firewall"], p["gpu02"]["roles"]["firewall"]
    assert view1["enabled"] and view1["peers_v4"] == ["10.20.0.12"] and view1["peers_v6"] == []
    drops = "tcp dport { " + ", ".join(map(str, sorted(fw1["tcp_ports"]))) + " } counter drop"
    assert view1["port_rules"][:2] == [drops, "tcp dport 15000-17000 counter drop"]  # nothing public on gpu01
    assert view2["port_rules"][0] == "tcp dport { 8000 } accept"


def test_the_firewall_follows_mooncakes_port_range_when_the_inventory_moves_it(pair):
    peers = copy.deepcopy(pair)
    for h in peers:
        peers[h]["pdnode_engine_environment"] = {**peers[h].get("pdnode_engine_environment", {}),
                                                 "MC_MIN_RPC_PORT": 20000, "MC_MAX_RPC_PORT": 20100}
    fw = build_plan(peers["gpu01"], "gpu01", peers).as_dict()["firewall"]
    assert fw["tcp_port_ranges"][0] == [20000, 20100]


def test_one_host_keeps_loopback_and_no_firewall():
    peers = inventory_variables(ROOT / "inventories" / "gpu01")
    plan = build_plan(peers["gpu01"], "gpu01", peers).as_dict()
    assert plan["services"]["prefill-0"]["args"]["host"] == "127.0.0.1"
    assert not plan["cluster"]["multi_host"] and not plan["firewall"]["enabled"]
    assert "SGLANG_HOST_IP" not in plan["services"]["prefill-0"]["environment"]
    assert "hosts" not in plan["settings"]["pdnode_prefill_instances"][0]


def _spanning(pair):
    """gpu-pair with a decode of TP 16 over both hosts' eight GPUs, the prefills on gpu01."""
    peers = copy.deepcopy(pair)
    decode = {"hosts": ["gpu02", "gpu03"], "gpus": list(range(8)), "tp_size": 16, "attn_dp_size": 16,
              "ep_size": 16, "moe_dense_tp_size": 1, "enable_dp_lm_head": True}
    peers["gpu03"] = copy.deepcopy(peers["gpu02"])
    peers["gpu03"]["pdnode_node_address"] = "10.20.0.13"
    for h in peers:
        peers[h]["pdnode_decode_instances"] = [decode]
    return peers


def test_an_instance_spanning_hosts_is_rendered_per_node_rank(pair):
    p = plans(_spanning(pair))
    rank0, rank1 = p["gpu02"]["services"]["decode-0"], p["gpu03"]["services"]["decode-0"]
    assert rank0["args"]["nnodes"] == rank1["args"]["nnodes"] == 2
    assert (rank0["args"]["node_rank"], rank1["args"]["node_rank"]) == (0, 1)
    assert rank0["args"]["dist_init_addr"] == rank1["args"]["dist_init_addr"] == "10.20.0.12:32100"
    assert rank1["args"]["host"] == "10.20.0.13" and rank1["args"]["base_gpu_id"] == 0
    # the API is node rank 0's; rank 1 answers only SGLang's dummy /health (its readiness)
    assert rank0["url"] == "http://10.20.0.12:30001"
    assert rank1["url"] is None and rank1["ready"] == ["http://10.20.0.13:30001/health"]
    assert p["gpu02"]["services"]["router"]["args"]["decode"] == ["http://10.20.0.12:30001"]
    assert "router" not in p["gpu03"]["services"]
    # the rank-0 host guards the rendezvous and the ports SGLang derives from it
    assert {32100, 32101, 32106, 32113} <= set(p["gpu02"]["firewall"]["tcp_ports"])
    assert p["gpu03"]["firewall"]["peers"] == ["10.20.0.11", "10.20.0.12"]


def test_a_spanning_instance_needs_gpus_for_its_tp_size_on_every_host(pair):
    peers = _spanning(pair)
    for h in peers:
        peers[h]["pdnode_decode_instances"][0]["gpus"] = [0, 1, 2, 3]
    with pytest.raises(PlanError) as info:
        build_plan(peers["gpu02"], "gpu02", peers)
    (line,) = [str(p) for p in info.value.problems]
    assert line.startswith("pdnode_decode_instances[0].gpus=[0, 1, 2, 3]: has 4 GPUs on each of 2 hosts (8)")
    assert "list 8 GPUs per host for decode-0, or set tp_size: 8" in line


def test_the_verifier_on_any_host_sees_every_engine_and_the_router(pair):
    p = plans(pair)
    view = layout_view(p, "gpu02")
    assert list(view["services"]) == ["prefill-0", "prefill-1", "decode-0", "router"]
    assert view["services"]["prefill-0"]["host"] == "gpu01"
    elsewhere = layout_view(p, "gpu01")
    assert list(elsewhere["services"]) == ["prefill-0", "prefill-1", "decode-0", "router"]
    # from gpu01 the router is reached at its public URL; its unit and loopback metrics are gpu02's
    run = build_run(elsewhere, on_node=True)
    assert run.targets.router_url == "http://10.20.0.12:8000" and run.targets.router_metrics_url is None
    assert run.expect.units == ["sglang-pd-prefill-0.service", "sglang-pd-prefill-1.service"]
    assert [i.host for i in run.targets.instances] == [None, None, "gpu02"]
    here = build_run(view, on_node=True)
    assert here.targets.router_metrics_url == "http://127.0.0.1:29000/metrics"
    assert here.expect.units == ["sglang-pd-decode-0.service", "sglang-pd-router.service"]


def test_check_explains_the_two_host_layout(capsys):
    assert cli.main(["check", str(PAIR)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{PAIR}: host gpu01 OK (prefill-0 GPUs 0-3, prefill-1 GPUs 4-7; 17 ports)",
                   f"{PAIR}: host gpu02 OK (decode-0 GPUs 0-7; the router at http://10.20.0.12:8000; 17 ports)"]
    assert cli.main(["explain", str(PAIR)]) == 0
    text = capsys.readouterr().out
    assert "host gpu01 (10.20.0.11):" in text and "host gpu02 (10.20.0.12):" in text
    assert ("router on gpu02 at http://10.20.0.12:8000 registers prefill-0 http://10.20.0.11:30000, prefill-1 "
            "http://10.20.0.11:30010, decode-0 http://10.20.0.12:30001") in text


def test_check_json_reports_every_host(capsys):
    assert cli.main(["check", str(PAIR), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and [h["host"] for h in report["hosts"]] == ["gpu01", "gpu02"]


def test_an_unknown_host_is_one_line_exit_2(capsys):
    assert cli.main(["check", str(PAIR), "--host", "gpu09"]) == 2
    assert capsys.readouterr().err.strip() == f"pdnode check: {PAIR}: no host 'gpu09' (hosts: gpu01, gpu02)"
