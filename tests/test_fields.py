"""The variable table, its generated reference and the shipped inventories agree; the
one-instance variables of earlier releases are refused with a replacement that works."""

import re
from pathlib import Path

import pytest
import yaml
from planvars import changed, variables

from pdnode.commands.docs import inventory_markdown
from pdnode.core.inventory.fields import INSTANCE_KEYS, INSTANCE_KEYS_BY_NAME, RETIRED_ROLE_VARIABLES
from pdnode.core.inventory.read import inventory_variables
from pdnode.core.plan.build import PlanError, build_plan

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "inventory.md"

# inventories/gpu01's topology in the last one-instance release (git 316f49f^): what an
# operator upgrading has in group_vars.
OLD_GPU01 = {
    "pdnode_prefill_gpus": [0, 1, 2, 3], "pdnode_prefill_tp_size": 4, "pdnode_prefill_mem_fraction_static": 0.85,
    "pdnode_prefill_extra_args": {"trust_remote_code": True, "chunked_prefill_size": 16384},
    "pdnode_decode_gpus": [4, 5, 6, 7], "pdnode_decode_tp_size": 4, "pdnode_decode_attn_dp_size": 4,
    "pdnode_decode_ep_size": 4, "pdnode_decode_moe_dense_tp_size": 1, "pdnode_decode_enable_dp_lm_head": True,
    "pdnode_decode_mem_fraction_static": 0.85,
    "pdnode_decode_extra_args": {"trust_remote_code": True, "cuda_graph_max_bs_decode": 64},
}
# Every one-instance variable that release knew (its src/pdnode/core/inventory/fields.py), with a value.
OLD_VARIABLES = {
    "pdnode_prefill_gpus": [0, 1, 2, 3], "pdnode_prefill_tp_size": 4, "pdnode_prefill_attn_dp_size": 1,
    "pdnode_prefill_port": 30000, "pdnode_prefill_bootstrap_port": 8998, "pdnode_prefill_nccl_port": 31000,
    "pdnode_prefill_mem_fraction_static": 0.85, "pdnode_prefill_extra_args": {"chunked_prefill_size": 8192},
    "pdnode_decode_gpus": [4, 5, 6, 7], "pdnode_decode_tp_size": 4, "pdnode_decode_attn_dp_size": 4,
    "pdnode_decode_ep_size": 4, "pdnode_decode_moe_dense_tp_size": 1, "pdnode_decode_enable_dp_lm_head": True,
    "pdnode_decode_port": 30001, "pdnode_decode_nccl_port": 31001, "pdnode_decode_mem_fraction_static": 0.85,
    "pdnode_decode_extra_args": {"cuda_graph_max_bs_decode": 64},
}


def test_inventory_reference_is_current():
    assert REFERENCE.read_text() == inventory_markdown(), (
        "regenerate: .venv/bin/python -m pdnode.commands.docs > docs/inventory.md")


def test_reference_lists_the_instance_keys_and_the_retired_variables():
    text = inventory_markdown()
    section = text.split("## Instance keys", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
    assert rows == [k.name for k in INSTANCE_KEYS]
    assert re.search(r"^\| `bootstrap_port` \| int \| `None` \| prefill \|", section, re.MULTILINE)
    retired = text.split("## Retired variables", 1)[1]
    assert sorted(re.findall(r"`(pdnode_\w+)`", retired.split("\n- ", 1)[1])) == sorted(RETIRED_ROLE_VARIABLES)


def test_every_shipped_node_inventory_is_valid():
    checked = []
    for inv in sorted((ROOT / "inventories").iterdir()):
        peers = inventory_variables(inv)
        for host, variables_ in peers.items():
            if "pdnode_gpu_count" not in variables_:
                continue  # not a node description (e.g. the one-GPU preflight host)
            build_plan(variables_, host, peers)  # raises PlanError with every problem
            checked.append(inv.name)
    assert {"gpu01", "gpu01-2p1d", "gpu01-1p2d", "demo"} <= set(checked)
    assert checked.count("gpu-pair") == 2  # the two-host example, as each host plans it


def _problems(v):
    with pytest.raises(PlanError) as info:
        build_plan(v)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("name", sorted(OLD_VARIABLES))
def test_a_retired_variable_is_one_line_spelling_its_replacement(name):
    role, key = name.split("_")[1], RETIRED_ROLE_VARIABLES[name]
    value = OLD_VARIABLES[name]
    (line,) = _problems(changed(variables("gpu01"), {name: value}))
    assert line.startswith(f"{name}=")
    assert f"the one-instance variables ({name}) were replaced by a list of instances per role" in line
    assert _hint(line) == {f"pdnode_{role}_instances": [{key: value}]}


def _hint(line):
    """The `pdnode_<role>_instances: [...]` settings of a migration line, parsed as YAML."""
    fix = line.split("Fix: write ", 1)[1].rsplit(" and remove the old variables.", 1)[0]
    return {k: v for part in fix.split(" and pdnode_") for k, v in
            yaml.safe_load(part if part.startswith("pdnode_") else "pdnode_" + part).items()}


def _old_gpu01():
    return changed(variables("gpu01"), {"pdnode_prefill_instances": None, "pdnode_decode_instances": None,
                                        **OLD_GPU01})


def test_the_migration_hint_of_an_old_inventory_gives_the_same_node():
    (first, *_) = _problems(_old_gpu01())
    hint = _hint(first)
    migrated = changed(variables("gpu01"), {name: None for name in OLD_GPU01} | hint)
    assert hint == {k: variables("gpu01")[k] for k in ("pdnode_prefill_instances", "pdnode_decode_instances")}
    assert build_plan(migrated).as_dict() == build_plan(variables("gpu01")).as_dict()


def test_an_old_inventory_is_one_line():
    assert len(_problems(_old_gpu01())) == 1


def test_every_retired_variable_maps_to_a_key_of_its_role():
    wrong = [n for n, key in RETIRED_ROLE_VARIABLES.items()
             if n.split("_")[1] not in INSTANCE_KEYS_BY_NAME[key].roles]
    assert wrong == []
