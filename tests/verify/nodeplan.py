"""Plans for the verifier's tests, in the plan's shape (plan["services"]: N prefill + M
decode instances and the router).

plan_for(node): the REAL plan (pdnode.core.plan.build.build_plan) of a running stand-in node -- the
one-pair node of tests/standin/node.py or a cluster of tests/verify/cluster.py -- from the
demo inventory's variables with the node's instances, GPUs and free ports.

contract_plan(...): a hand-built plan dict with only what the verifier reads, on ports
that refuse connections, for unit tests with fake servers; test_plan_shape.py keeps it
in step with build_plan's output.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from pdnode.core.inventory.fields import FIELDS
from pdnode.core.plan.build import build_plan
from pdnode.core.plan.schema import SCHEMA_ID

REPO = Path(__file__).resolve().parents[2]


def demo_variables() -> dict[str, Any]:
    return copy.deepcopy(_demo_variables())  # a copy: callers change it


@functools.cache
def _demo_variables() -> dict[str, Any]:
    """Read once: tests/standin/test_port_draws.py builds hundreds of plans with them."""
    out: dict[str, Any] = {}
    for f in sorted((REPO / "inventories/demo/group_vars/all").glob("*.yml")):
        out.update({k: v for k, v in (yaml.safe_load(f.read_text()) or {}).items() if k.startswith("pdnode_")})
    return out


def _members(node: Any) -> list[dict[str, Any]]:
    """(role, gpus, layout, ports) of each instance of a StandinNode or a Cluster."""
    if hasattr(node, "instances"):  # cluster.Cluster
        return [{"role": m.role, "gpus": m.gpus, "port": m.port, "bootstrap_port": m.bootstrap_port,
                 "args": m.args} for m in node.instances.values()]
    p = node.ports  # node.StandinNode: demo's layout (P TP 4 on 0-3; D TP 4, attn-DP 4, EP 4 on 4-7)
    return [{"role": "prefill", "gpus": [0, 1, 2, 3], "port": p["prefill"], "bootstrap_port": p["bootstrap"],
             "args": {"tp_size": 4}},
            {"role": "decode", "gpus": [4, 5, 6, 7], "port": p["decode"],
             "args": {"tp_size": 4, "attn_dp_size": 4, "ep_size": 4}}]


def plan_for(node: Any, served_model_name: str = "fake-model", **overrides: Any) -> dict[str, Any]:
    """Plan.as_dict() for a running stand-in node (its instances, GPUs and ports)."""
    v = demo_variables()
    instances: dict[str, list[dict[str, Any]]] = {"prefill": [], "decode": []}
    for n, m in enumerate(_members(node)):
        a = m["args"]
        inst: dict[str, Any] = {"gpus": m["gpus"], "tp_size": a["tp_size"], "port": m["port"],
                                "nccl_port": 1025 + n}
        if m["role"] == "prefill":
            inst["bootstrap_port"] = m["bootstrap_port"]
        if a.get("attn_dp_size", 1) > 1:
            inst.update(attn_dp_size=a["attn_dp_size"], ep_size=a.get("ep_size", 1), moe_dense_tp_size=1,
                        enable_dp_lm_head=True)
        instances[m["role"]].append(inst)
    ports = node.ports if hasattr(node, "ports") else {"router": node.router_port,
                                                      "router_metrics": node.router_metrics_port}
    v.update({
        "pdnode_model_served_name": served_model_name,
        "pdnode_prefill_instances": instances["prefill"],
        "pdnode_decode_instances": instances["decode"],
        "pdnode_router_port": ports["router"],
        "pdnode_router_metrics_port": ports["router_metrics"],
        "pdnode_router_host": "127.0.0.1",
        "pdnode_wheelhouse": None,
    })
    v.update(overrides)
    return build_plan(v, "standin").as_dict()


def _engine(role: str, name: str, port: int, *, bootstrap_port: int | None = None, tp_size: int = 4,
            attn_dp_size: int = 1, served: str = "m") -> dict[str, Any]:
    sid = f"{role}-{name}"
    args: dict[str, Any] = {"host": "127.0.0.1", "port": port, "served_model_name": served,
                            "disaggregation_mode": role, "tp_size": tp_size, "enable_metrics": True}
    if attn_dp_size > 1:
        args["attn_dp_size"] = attn_dp_size
    svc: dict[str, Any] = {"id": sid, "role": role, "name": name, "unit": f"x-{sid}.service", "args": args,
                           "url": f"http://127.0.0.1:{port}", "config": f"/etc/x/{sid}.json",
                           "env_file": f"/etc/x/{sid}.env"}
    if bootstrap_port is not None:
        args["disaggregation_bootstrap_port"] = bootstrap_port
        svc["bootstrap_port"] = bootstrap_port
    return svc


def contract_plan(router_port: int = 1, *, prefills: int = 1, decodes: int = 1, **settings: Any) -> dict[str, Any]:
    """A plan of PREFILLS prefill (TP 4) and DECODES decode (TP 4, attn-DP 4) instances on
    low ports (2, 3, ...: nothing listens there), the router on ROUTER_PORT."""
    ports = iter(range(2, 100))
    services: dict[str, Any] = {}
    for i in range(prefills):
        port, boot = next(ports), next(ports)
        services[f"prefill-{i}"] = _engine("prefill", str(i), port, bootstrap_port=boot)
    for i in range(decodes):
        services[f"decode-{i}"] = _engine("decode", str(i), next(ports), attn_dp_size=4)
    m_port = next(ports)
    services["router"] = {
        "id": "router", "role": "router", "name": "router", "unit": "x-router.service",
        "url": f"http://127.0.0.1:{router_port}", "metrics_url": f"http://127.0.0.1:{m_port}/metrics",
        "exec": ["python", "-m", "pdnode.node.router_launch", "/etc/x/router.json"],
        "args": {"host": "127.0.0.1", "port": router_port, "prometheus_host": "127.0.0.1", "prometheus_port": m_port,
                 "pd_disaggregation": True,
                 "prefill": [[s["url"], s["bootstrap_port"]] for s in services.values() if s["role"] == "prefill"],
                 "decode": [s["url"] for s in services.values() if s["role"] == "decode"]}}
    return {
        "schema": SCHEMA_ID,
        "host": "test",
        "install": {"config_dir": "/etc/x", "prefix": "x", "target": "x.target", "api_key_path": "/etc/x/api-key",
                    "admin_key_path": "/etc/x/router-admin-key"},
        "services": services,
        # the plan carries every setting (build_plan fills in fields.py's defaults)
        "settings": {**{f.name: f.default for f in FIELDS if f.name.startswith("pdnode_verify_")},
                     "pdnode_verify_timeout_s": 5, "pdnode_verify_max_tokens": 4, **settings},
    }
