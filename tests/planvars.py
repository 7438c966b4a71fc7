"""Node descriptions for the plan's tests: a shipped inventory with a few changes.

    changed(base, {"pdnode_model_kind": "dense", "decode[0]": {"tp_size": 1}})

A key ``<role>[i]`` patches entry i of ``pdnode_<role>_instances`` (a key valued None is
removed from the entry); any other key sets a variable (None removes it). The base is
never modified.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from pdnode.core.inventory.read import load_inventory

ROOT = Path(__file__).resolve().parents[1]
INVENTORIES = ROOT / "inventories"
_ENTRY = re.compile(r"^(prefill|decode)\[(\d+)\]$")
# gpu01's decode (changed(v, {"decode[0]": DECODE_REPLICAS})) as two plain DP replicas of
# TP 2: DP replicas and DP attention exclude each other, and a prefill of replicas is
# refused (disagg-prefill-dp-replicas), so the tests of replicas put them on the decode.
DECODE_REPLICAS = {"tp_size": 2, "dp_size": 2, "attn_dp_size": None, "ep_size": None, "enable_dp_lm_head": None}


def variables(inventory: str) -> dict[str, Any]:
    return load_inventory(INVENTORIES / inventory).variables


def changed(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    v = copy.deepcopy(base)
    for key, value in changes.items():
        m = _ENTRY.match(key)
        if m is None:
            if value is None:
                v.pop(key, None)
            else:
                v[key] = copy.deepcopy(value)
            continue
        entry = v[f"pdnode_{m.group(1)}_instances"][int(m.group(2))]
        for k, val in value.items():
            if val is None:
                entry.pop(k, None)
            else:
                entry[k] = copy.deepcopy(val)
    return v


def layout(base: dict[str, Any], prefill: list[dict[str, Any]], decode: list[dict[str, Any]],
           **more: Any) -> dict[str, Any]:
    """base with these instances (and more variables), e.g. 4P4D on one GPU each."""
    return changed(base, {"pdnode_prefill_instances": prefill, "pdnode_decode_instances": decode, **more})


def engine_args(plan: Any) -> dict[str, dict[str, Any]]:
    """service id -> ServerArgs for every engine service of a plan (a Plan or its dict)."""
    services = plan["services"] if isinstance(plan, dict) else plan.services
    return {sid: s["args"] for sid, s in services.items() if s["role"] in ("prefill", "decode")}
