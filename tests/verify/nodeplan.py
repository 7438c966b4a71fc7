"""A real plan (pdnode.plan.build_plan) describing a stand-in node started by
tests/standin/node.py: the demo inventory's topology with the node's free ports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdnode.plan import build_plan

REPO = Path(__file__).resolve().parents[2]


def demo_variables() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted((REPO / "inventories/demo/group_vars/all").glob("*.yml")):
        out.update({k: v for k, v in (yaml.safe_load(f.read_text()) or {}).items() if k.startswith("pdnode_")})
    return out


def plan_for(node: Any, served_model_name: str = "fake-model", **overrides: Any) -> dict[str, Any]:
    """Plan.as_dict() for a StandinNode (its ports, TP 4 prefill, TP 4/attn-DP 4/EP 4 decode)."""
    v = demo_variables()
    v.update({
        "pdnode_model_served_name": served_model_name,
        "pdnode_prefill_port": node.ports["prefill"],
        "pdnode_prefill_bootstrap_port": node.ports["bootstrap"],
        "pdnode_decode_port": node.ports["decode"],
        "pdnode_router_port": node.ports["router"],
        "pdnode_router_metrics_port": node.ports["router_metrics"],
        "pdnode_router_host": "127.0.0.1",
        "pdnode_prefill_nccl_port": 1025,
        "pdnode_decode_nccl_port": 1026,
        "pdnode_wheelhouse": None,
    })
    v.update(overrides)
    return build_plan(v, "standin").as_dict()
