"""Every release the bundle installs has one definition: pdnode.node.releases.

The Python that needs a version imports it (the fields' defaults, the launcher, the
stand-in, the Mooncake build choice, the argument tables' names); the sglang role has no
version default (the playbooks pass the plan's). What cannot import it must say the
same, and this test names the place that drifted: pyproject's toolchain pins, the
conformance environment, the mooncake role's documented default, the example
inventories' pins. No other file of the roles or playbooks may name a release.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import yaml

from pdnode.core.rules import argtable
from pdnode.core.inventory.fields import BY_NAME
from pdnode.node import releases

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE_BUILDS = {"non-cuda": releases.MOONCAKE, "cuda12": releases.MOONCAKE, "cuda13": releases.MOONCAKE_CUDA13}


def _yaml(rel: str):
    return yaml.safe_load((ROOT / rel).read_text())


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return dict(d.split("==", 1) for d in deps if "==" in d)


def _runtime_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(d.split("==", 1) for d in deps if "==" in d)


def _conformance_pin(name: str) -> str:
    text = (ROOT / "tests/conformance/requirements.txt").read_text()
    m = re.search(rf"^{re.escape(name)}==(\S+)", text, re.M)
    assert m, f"tests/conformance/requirements.txt does not pin {name}"
    return m.group(1)


COPIES = [
    pytest.param(lambda: _pins()["smg"], releases.SMG, id="pyproject smg pin"),
    pytest.param(lambda: _pins()["sglang-router"], releases.SGLANG_ROUTER, id="pyproject router pin"),
    pytest.param(lambda: _pins()["mooncake-transfer-engine-non-cuda"], releases.MOONCAKE, id="pyproject mooncake pin"),
    pytest.param(lambda: _conformance_pin("sglang"), releases.SGLANG, id="conformance env"),
    pytest.param(lambda: _runtime_pins()["huggingface_hub"], releases.HUGGINGFACE_HUB, id="pyproject hub client pin"),
    pytest.param(lambda: _yaml("roles/mooncake/defaults/main.yml")["mooncake_versions"], MOONCAKE_BUILDS,
                 id="mooncake role default"),
    pytest.param(lambda: _yaml("roles/mooncake/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
                 ["mooncake_versions"]["default"], MOONCAKE_BUILDS, id="mooncake argument_specs"),
]


@pytest.mark.parametrize(("read", "want"), COPIES)
def test_every_copy_that_cannot_import_says_the_same(read, want):
    assert read() == want


def test_the_fields_defaults_are_the_releases():
    assert {name: BY_NAME[name].default for name in (
        "pdnode_sglang_version", "pdnode_sglang_router_version", "pdnode_smg_version", "pdnode_mooncake_version",
        "pdnode_mooncake_cuda13_version", "pdnode_router_package")} == {
        "pdnode_sglang_version": releases.SGLANG, "pdnode_sglang_router_version": releases.SGLANG_ROUTER,
        "pdnode_smg_version": releases.SMG, "pdnode_mooncake_version": releases.MOONCAKE,
        "pdnode_mooncake_cuda13_version": releases.MOONCAKE_CUDA13, "pdnode_router_package": releases.ROUTER_PACKAGE}


@pytest.mark.parametrize("table", [argtable.SGLANG_TABLE, argtable.ROUTER_TABLE, argtable.SMG_TABLE,
                                   f"data/serverargs-{releases.SGLANG}.txt"])
def test_the_releases_argument_tables_exist(table):
    assert resources.files("pdnode").joinpath(table).is_file(), f"{table}: generate it (pdnode.core.rules.argtable)"


# Where a release may still be written down: the copies above, and the mooncake scenario,
# which checks the build the role chose for a driverless host.
ALLOWED = {"roles/mooncake/defaults/main.yml", "roles/mooncake/meta/argument_specs.yml",
           "molecule/mooncake/converge.yml"}


def test_no_role_or_playbook_writes_a_release_down():
    release = re.compile("|".join(re.escape(v) for v in sorted(
        {releases.SGLANG, releases.SGLANG_ROUTER, releases.SMG, releases.MOONCAKE, releases.MOONCAKE_CUDA13})))
    found = []
    for top in ("roles", "playbooks", "site.yml", "templates"):
        for path in sorted((ROOT / top).rglob("*") if (ROOT / top).is_dir() else [ROOT / top]):
            rel = str(path.relative_to(ROOT))
            if path.suffix not in (".yml", ".yaml", ".j2") or rel in ALLOWED:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if release.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "a release written down outside pdnode.node.releases:\n" + "\n".join(found)


@pytest.mark.parametrize("inventory", sorted(p.parent.parent.parent.name for p in
                                             (ROOT / "inventories").glob("*/group_vars/all/versions.yml")))
def test_example_inventories_pin_the_defaults(inventory):
    pinned = _yaml(f"inventories/{inventory}/group_vars/all/versions.yml")
    for name, value in pinned.items():
        assert str(value) == BY_NAME[name].default, f"inventories/{inventory}: {name}={value}"
