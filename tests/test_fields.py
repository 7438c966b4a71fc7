"""The variable table, its generated reference and the shipped inventories agree."""

from pathlib import Path

from pdnode.docs import inventory_markdown
from pdnode.inventory import load_inventory
from pdnode.plan import build_plan

ROOT = Path(__file__).resolve().parents[1]


def test_inventory_reference_is_current():
    assert (ROOT / "docs" / "inventory.md").read_text() == inventory_markdown(), (
        "regenerate: .venv/bin/python -m pdnode.docs > docs/inventory.md")


def test_every_shipped_node_inventory_is_valid():
    checked = []
    for inv in sorted((ROOT / "inventories").iterdir()):
        hv = load_inventory(inv)
        if "pdnode_gpu_count" not in hv.variables:
            continue  # not a node description (e.g. the one-GPU preflight host)
        build_plan(hv.variables, hv.host)  # raises PlanError with every problem
        checked.append(inv.name)
    assert {"gpu01", "demo"} <= set(checked)
