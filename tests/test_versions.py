"""Every release the bundle installs has one source: the defaults in scripts/pdnode/core/fields.py.

Every other place that names a version (role defaults and argument_specs, pyproject's
test pins, mooncake_select, the launcher, the argument tables, the conformance
environment, the stand-in, the example inventories) must say the same; this test names
the place that drifted.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from pdnode.core import argtable, mooncake_select
from pdnode.node import launcher
from pdnode.core.fields import BY_NAME
from pdnode.standin import VERSION as STANDIN_VERSION

ROOT = Path(__file__).resolve().parents[1]
SGLANG = BY_NAME["pdnode_sglang_version"].default
ROUTER = BY_NAME["pdnode_sglang_router_version"].default
MOONCAKE = BY_NAME["pdnode_mooncake_version"].default
SMG = BY_NAME["pdnode_smg_version"].default
MOONCAKE_CU13 = BY_NAME["pdnode_mooncake_cuda13_version"].default
PACKAGE = BY_NAME["pdnode_router_package"].default
ROUTER_REQUIREMENT = f"{PACKAGE}=={SMG if PACKAGE == 'smg' else ROUTER}"


def _yaml(rel: str):
    return yaml.safe_load((ROOT / rel).read_text())


def _spec_default(role: str, option: str):
    return _yaml(f"roles/{role}/meta/argument_specs.yml")["argument_specs"]["main"]["options"][option].get("default")


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return dict(d.split("==", 1) for d in deps if "==" in d)


def _conformance_pin(name: str) -> str:
    text = (ROOT / "tests/conformance/requirements.txt").read_text()
    m = re.search(rf"^{re.escape(name)}==(\S+)", text, re.M)
    assert m, f"tests/conformance/requirements.txt does not pin {name}"
    return m.group(1)


PLACES = [
    pytest.param(lambda: _yaml("roles/sglang/defaults/main.yml")["sglang_version"], SGLANG, id="sglang role default"),
    pytest.param(lambda: _spec_default("sglang", "sglang_version"), SGLANG, id="sglang argument_specs"),
    pytest.param(lambda: _yaml("roles/sglang/defaults/main.yml")["sglang_router_requirement"], ROUTER_REQUIREMENT,
                 id="router role default"),
    pytest.param(lambda: _spec_default("sglang", "sglang_router_requirement"), ROUTER_REQUIREMENT,
                 id="router argument_specs"),
    pytest.param(lambda: _pins()["smg"], SMG, id="pyproject smg pin"),
    pytest.param(lambda: argtable.SMG_TABLE, f"data/routerargs-smg-{SMG}.json", id="smg argument table"),
    pytest.param(lambda: _yaml("roles/sglang/defaults/main.yml")["sglang_mooncake_version"], MOONCAKE,
                 id="mooncake in the sglang role"),
    pytest.param(lambda: _spec_default("sglang", "sglang_mooncake_version"), MOONCAKE,
                 id="mooncake in sglang argument_specs"),
    pytest.param(lambda: _yaml("roles/mooncake/defaults/main.yml")["mooncake_versions"],
                 {"non-cuda": MOONCAKE, "cuda12": MOONCAKE, "cuda13": MOONCAKE_CU13}, id="mooncake role default"),
    pytest.param(lambda: mooncake_select.DEFAULT_VERSIONS,
                 {"non-cuda": MOONCAKE, "cuda12": MOONCAKE, "cuda13": MOONCAKE_CU13}, id="mooncake_select"),
    pytest.param(lambda: _pins()["sglang-router"], ROUTER, id="pyproject router pin"),
    pytest.param(lambda: _pins()["mooncake-transfer-engine-non-cuda"], MOONCAKE, id="pyproject mooncake pin"),
    pytest.param(lambda: _conformance_pin("sglang"), SGLANG, id="conformance env"),
    pytest.param(lambda: launcher.SGLANG_VERSION, SGLANG, id="launcher"),
    pytest.param(lambda: argtable.SGLANG_TABLE, f"data/serverargs-{SGLANG}.json", id="ServerArgs table"),
    pytest.param(lambda: argtable.ROUTER_TABLE, f"data/routerargs-{ROUTER}.json", id="router argument table"),
    pytest.param(lambda: STANDIN_VERSION, f"{SGLANG}-standin", id="stand-in"),
]


@pytest.mark.parametrize(("read", "want"), PLACES)
def test_every_place_names_the_fields_default(read, want):
    assert read() == want


@pytest.mark.parametrize("inventory", sorted(p.parent.parent.parent.name for p in
                                             (ROOT / "inventories").glob("*/group_vars/all/versions.yml")))
def test_example_inventories_pin_the_defaults(inventory):
    pinned = _yaml(f"inventories/{inventory}/group_vars/all/versions.yml")
    for name, value in pinned.items():
        assert str(value) == BY_NAME[name].default, f"inventories/{inventory}: {name}={value}"
