"""pdnode as its users install it: the collection pdnode.sglang_pd (galaxy.yml) and the
wheel (pyproject.toml), and the one lookup that finds pdnode's files either way
(pdnode.core.resources). scripts/artifacts installs both into a clean place and deploys the
demo node from them; these tests check what can be checked without a node."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from pdnode.core import resources

ROOT = Path(__file__).resolve().parents[1]
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FILTERS = ROOT / "plugins" / "filter"


def _filter_names() -> set[str]:
    """Every filter the collection's plugins define (their FilterModule.filters keys)."""
    names: set[str] = set()
    for path in FILTERS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "filters":
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Dict):
                        names |= {k.value for k in ret.keys if isinstance(k, ast.Constant)}
    return names


def _ansible_files() -> list[Path]:
    return [p for d in ("roles", "playbooks") for p in (ROOT / d).rglob("*") if p.suffix in (".yml", ".j2")]


def test_the_collection_is_the_package_version_and_name():
    assert GALAXY["version"] == PYPROJECT["project"]["version"]
    assert f"{GALAXY['namespace']}.{GALAXY['name']}" == resources.COLLECTION


def test_roles_and_playbooks_name_the_collections_filters_and_modules_by_fqcn():
    """A collection's roles find no filter by its short name (Ansible looks those up only
    in ansible.builtin and the configured paths), and no role-embedded plugin at all."""
    names = _filter_names() | {p.stem for p in (ROOT / "plugins" / "modules").glob("*.py")}
    assert {"pdnode_plan", "pd_services_files", "pdnode_controller_root"} <= names
    alt = "|".join(sorted(names, key=len, reverse=True))
    # a filter after a pipe, or a module as a task's key, not preceded by the collection
    short = re.compile(rf"\|\s*({alt})\b|^\s*-?\s*({alt}):\s*$")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in _ansible_files()
             for n, line in enumerate(p.read_text().splitlines(), 1) if short.search(line.split("#", 1)[0])]
    assert not found, "\n".join(found)
    embedded = [p for sub in ("library", "filter_plugins", "module_utils") for p in ROOT.glob(f"roles/*/{sub}")]
    assert not embedded, f"a collection's roles load no plugins of their own: {embedded}"


def test_playbooks_and_roles_name_no_checkout_path():
    """What the roles copy to hosts comes from the imported package (pdnode_module_file,
    pdnode.commands.bundle), what the controller writes goes under pdnode_controller_root."""
    bad = re.compile(r"playbook_dir\s*\}*\s*~?\s*['\"]?/\.\.|role_path\s*~?\s*['\"]/\.\./\.\.|/scripts/")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in _ansible_files() if p.name != "demo-host.yml"
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if bad.search(line) and not line.lstrip().startswith("#")]
    assert not found, "\n".join(found)


def test_the_built_collection_holds_the_roles_plugins_and_playbooks_only(tmp_path):
    subprocess.run([str(Path(sys.executable).parent / "ansible-galaxy"), "collection", "build", "--output-path",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, text=True)
    (artifact,) = tmp_path.glob("pdnode-sglang_pd-*.tar.gz")
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
    assert {"MANIFEST.json", "README.md", "meta/runtime.yml", "playbooks/site.yml", "playbooks/tasks/plan.yml",
            "plugins/modules/pd_services_files.py", "plugins/filter/pdnode.py",
            "roles/pd_services/tasks/main.yml"} <= names
    assert {f"roles/{r.name}/meta/argument_specs.yml" for r in (ROOT / "roles").iterdir()} <= names
    tops = {n.split("/")[0] for n in names}
    assert tops == {"MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.md", "meta", "playbooks", "plugins", "roles"}, tops
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.startswith("playbooks/demo-host")]


def _resource_calls() -> set[tuple[str, ...]]:
    """The parts of every resources.resource("...", ...) call in the package."""
    calls = set()
    for path in (ROOT / "src" / "pdnode").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "resource"
                    and node.args and all(isinstance(a, ast.Constant) for a in node.args)):
                calls.add(tuple(a.value for a in node.args))
    return calls


def test_every_resource_the_code_asks_for_is_in_the_checkout():
    calls = _resource_calls()
    assert ("templates", "runbooks") in calls and ("roles", "pd_services", "defaults", "main.yml") in calls
    for parts in calls:
        assert resources.resource(*parts) == ROOT.joinpath(*parts)


@pytest.mark.integration
def test_the_wheel_ships_every_resource_the_code_asks_for(tmp_path):
    """Built as pip builds it (pyproject.toml's backend), outside any checkout path."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (wheel,) = tmp_path.glob("pdnode-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for parts in _resource_calls():
        want = "pdnode/" + "/".join(parts)
        assert want in names or any(n.startswith(want + "/") for n in names), want
    assert {"pdnode/data/gpu-memory.json", "pdnode/node/drain.py", "pdnode/commands/bundle.py"} <= names
    assert all(n.startswith(("pdnode/", "pdnode-")) for n in names), sorted(n for n in names if "pdnode" not in n)


def test_the_controller_directory_of_a_checkout_and_of_an_installed_collection(tmp_path, monkeypatch):
    assert resources.controller_root(str(ROOT / "playbooks")) == ROOT
    assert resources.from_checkout() and resources.controller_dir() == ROOT
    installed = tmp_path / "ansible_collections" / "pdnode" / "sglang_pd"
    (installed / "playbooks").mkdir(parents=True)
    (installed / "MANIFEST.json").write_text("{}")
    own = tmp_path / "site" / "playbooks"  # an operator's own playbooks naming the collection's roles
    own.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resources.controller_root(str(installed / "playbooks")) == tmp_path
    assert resources.controller_root(str(own)) == tmp_path


def test_inventory_paths_resolve_against_the_controller_directory(tmp_path, monkeypatch):
    """The one rule the playbooks apply to pdnode_wheelhouse and pdnode_api_key_file, through
    the filter they call: unset stays empty, absolute stays, relative goes under the root."""
    from plugins.filter.resources import FilterModule

    resolve = FilterModule().filters()["pdnode_controller_path"]
    checkout = str(ROOT / "playbooks")
    assert resolve(None, checkout) == "" and resolve("", checkout) == ""
    assert resolve("/srv/wheels", checkout) == "/srv/wheels"
    assert resolve(".cache/wheelhouse/cp311-sim", checkout) == str(ROOT / ".cache/wheelhouse/cp311-sim")
    own = tmp_path / "site" / "playbooks"  # the installed collection's case: the current directory
    own.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve(".secrets/key", str(own)) == str(tmp_path / ".secrets/key")


def test_the_node_programs_come_from_the_imported_package():
    drain = resources.module_file("pdnode.node.drain")
    assert drain.parents[1] == Path(resources.__file__).parents[1] and drain.read_text().startswith('"""')
    with pytest.raises(ModuleNotFoundError, match="pdnode.nothing"):
        resources.module_file("pdnode.nothing")


def test_playbooks_run_by_pdnode_are_the_checkouts_here():
    target, env = resources.playbook("collect")
    assert target == str(ROOT / "playbooks" / "collect.yml") and env == {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}


@pytest.mark.parametrize("module", sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py")))
def test_each_of_the_collections_modules_documents_itself(module):
    """A collection module's DOCUMENTATION and RETURN are what ansible-doc and the argument
    checks read (a ": " in a plain YAML line breaks them, and ansible-lint says so only in
    passing): ansible-doc parses both."""
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "-M", str(ROOT / "plugins" / "modules"),
                        "--json", module], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "Unable to parse" not in r.stderr and "ERROR" not in r.stderr, r.stderr
    entry = json.loads(r.stdout)[module]
    assert entry["doc"]["options"] and entry["return"], f"{module}: DOCUMENTATION or RETURN did not parse"
