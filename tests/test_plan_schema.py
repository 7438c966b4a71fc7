"""The plan is a versioned contract, pdnode.plan/1 (pdnode.core.plan.schema).

- The JSON Schema shipped in the package is the one exported from the records now.
- The plan of every example inventory and host, and of variants that reach the other
  branches (stand-in, sglang-router, TCP, a layout spanning hosts), is valid under it,
  judged by the jsonschema package, not by a check of our own.
- The schema is not vacuous: an unknown key, a wrong type or a missing key anywhere in a
  typed record is refused.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import json
from pathlib import Path

import jsonschema
import pytest

from pdnode.core.inventory.read import inventory_variables
from pdnode.core.plan.build import build_plan
from pdnode.core.plan.schema import SCHEMA_FILE, SCHEMA_ID, render

from planvars import INVENTORIES, changed, variables

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))


def _doc(plan) -> dict:
    # The plan travels as JSON (the filter's result, the verifier's plan file): judge that form.
    return json.loads(json.dumps(plan.as_dict()))


def _errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def test_the_shipped_schema_is_the_one_the_records_export():
    assert SCHEMA_FILE.read_text() == render(), \
        "the plan's records changed: run python -m pdnode.core.plan.schema --write"


def test_the_schema_names_its_version():
    assert json.loads(SCHEMA_FILE.read_text())["$id"] == SCHEMA_ID == "pdnode.plan/1"


HOSTS = [(inv.name, host) for inv in sorted(INVENTORIES.iterdir())
         for host in inventory_variables(inv) if inv.name != "h200-single"]


@pytest.mark.parametrize(("inventory", "host"), HOSTS, ids=[f"{i}:{h}" for i, h in HOSTS])
def test_every_example_plan_is_valid(inventory, host):
    peers = inventory_variables(INVENTORIES / inventory)
    doc = _doc(build_plan(peers[host], host, peers))
    assert doc["schema"] == SCHEMA_ID
    assert _errors(doc) == []


VARIANTS = {
    "stand-in engine": {"pdnode_engine": "sim"},
    "sglang-router": {"pdnode_router_package": "sglang-router"},
    "tcp": {"pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None},
    "no nvlink": {"pdnode_kv_intranode_nvlink": False},
    "thresholds": {"pdnode_verify_thresholds": {"kv_transfer_speed_min_gb_s": 1.0}},
}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_plans_are_valid(name):
    doc = _doc(build_plan(changed(variables("gpu01"), VARIANTS[name]), "gpu01"))
    assert _errors(doc) == []


@pytest.fixture(scope="module")
def gpu01_doc() -> dict:
    return _doc(build_plan(variables("gpu01"), "gpu01"))


# (where, how the plan is broken): each must be refused
BREAKS = {
    "unknown top-level key": lambda d: d.update(extra=1),
    "unknown install key": lambda d: d["install"].update(venv_copy="/x"),
    "unknown service key": lambda d: d["services"]["prefill-0"].update(port_guess=1),
    "unknown kv key": lambda d: d["cluster"]["kv"].update(speed=1),
    "unknown setting": lambda d: d["settings"].update(pdnode_typo=1),
    "wrong role": lambda d: d["services"]["prefill-0"].update(role="encoder"),
    "wrong kv path": lambda d: d["cluster"]["kv"].update(path="pcie"),
    "port as text": lambda d: d["ports"].update({"router.port": "8000"}),
    "setting of the wrong type": lambda d: d["settings"].update(pdnode_router_port="8000"),
    "missing unit": lambda d: d["services"]["decode-0"].pop("unit"),
    "missing firewall key": lambda d: d["firewall"].pop("peers"),
    "another version": lambda d: d.update(schema="pdnode.plan/2"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_a_broken_plan_is_refused(gpu01_doc, name):
    doc = copy.deepcopy(gpu01_doc)
    BREAKS[name](doc)
    assert _errors(doc), f"{name}: the schema accepted it"


def test_the_schema_file_is_package_data():
    assert SCHEMA_FILE.parent.name == "data" and SCHEMA_FILE.parent.parent.name == "pdnode"
    assert Path(SCHEMA_FILE).is_file()


def _read_plan_on_host(tmp_path: Path, doc: dict, program: str) -> subprocess.CompletedProcess:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    return subprocess.run([sys.executable, "-m", program, "--plan", str(plan)], check=False, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(INVENTORIES.parent / "src"), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("program", ["pdnode.verify", "pdnode.node.bench_counters"])
@pytest.mark.parametrize(("schema", "said"), [(None, "unversioned"), ("pdnode.plan/2", "pdnode.plan/2")])
def test_the_host_readers_refuse_a_plan_of_another_version(tmp_path, gpu01_doc, program, schema, said):
    doc = copy.deepcopy(gpu01_doc)
    doc.pop("schema") if schema is None else doc.update(schema=schema)
    proc = _read_plan_on_host(tmp_path, doc, program)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "reads pdnode.plan/1" in proc.stderr and "pdnode render" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.count("\n") <= 1
