"""The layers of src/pdnode (docs/architecture.md): the import contracts of
pyproject.toml hold (`lint-imports`), and pdnode.node imports nothing but the standard
library and itself (its programs run with any host's Python)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# What a program on the host imports besides the standard library: the engine it starts,
# from the release venv, at run time (router_launch imports its router package by a
# computed name, importlib.import_module, which no static reading sees).
NODE_MAY_IMPORT = {"pdnode.node.launcher": {"sglang"},
                   # the weights' download: the client the release venv pins (pdnode.node.releases)
                   "pdnode.node.model_fetch": {"huggingface_hub"}}


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def foreign_imports(graph: grimp.ImportGraph) -> list[str]:
    """'importer -> imported' for every import of a pdnode.node module that is not the
    standard library, pdnode.node itself, or what NODE_MAY_IMPORT allows it."""
    bad = []
    for module in sorted(m for m in graph.modules if m == "pdnode.node" or m.startswith("pdnode.node.")):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            top = imported.split(".")[0]
            if imported == "pdnode.node" or imported.startswith("pdnode.node."):
                continue
            if top != "pdnode" and (top in sys.stdlib_module_names or top in NODE_MAY_IMPORT.get(module, ())):
                continue
            bad.append(f"{module} -> {imported}")
    return bad


def test_the_import_contracts_hold():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in r.stdout, r.stdout[-2000:]


def test_the_contracts_catch_an_import_against_the_layers_and_a_circle(tmp_path):
    """The same contracts over a package that breaks all three: a node module importing
    core, a core room importing a room above it, two modules of a room importing each other."""
    pkg = tmp_path / "pdnode"
    rooms = ["core/" + room for room in ("change", "planner", "host", "plan", "rules", "inventory")]
    for sub in ("", "commands", "verify", "standin", "core", "node", *rooms):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("")  # the top layer: `python -m pdnode`
    (pkg / "core" / "exits.py").write_text("")  # core's base, below its rooms
    (pkg / "core" / "resources.py").write_text("")
    (pkg / "core" / "plan" / "a.py").write_text("from . import b\n")
    (pkg / "core" / "plan" / "b.py").write_text("from . import a\n")
    (pkg / "core" / "rules" / "values.py").write_text("from ..plan import a\n")
    (pkg / "node" / "launcher.py").write_text("from ..core.plan import a\n")
    r = lint_imports(tmp_path, pythonpath=tmp_path)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "Contracts: 0 kept, 3 broken." in r.stdout, r.stdout[-3000:]
    assert "pdnode.node.launcher -> pdnode.core.plan.a" in r.stdout
    assert "pdnode.core.rules.values -> pdnode.core.plan.a" in r.stdout


def test_node_imports_only_the_standard_library():
    graph = grimp.build_graph("pdnode", include_external_packages=True, cache_dir=None)
    assert "pdnode.node.launcher" in graph.modules and "pdnode.node.bench_counters" in graph.modules
    assert foreign_imports(graph) == []


def test_the_node_check_finds_a_foreign_import():
    graph = grimp.ImportGraph()
    for module in ("pdnode.node.ready", "pdnode.node.secrets", "pdnode.node.launcher", "pdnode.core.plan.build"):
        graph.add_module(module)
    for module in ("json", "yaml", "sglang"):
        graph.add_module(module, is_squashed=True)
    graph.add_import(importer="pdnode.node.ready", imported="json")
    graph.add_import(importer="pdnode.node.ready", imported="pdnode.node.secrets")
    graph.add_import(importer="pdnode.node.launcher", imported="sglang")
    graph.add_import(importer="pdnode.node.ready", imported="yaml")
    graph.add_import(importer="pdnode.node.secrets", imported="pdnode.core.plan.build")
    graph.add_import(importer="pdnode.node.ready", imported="sglang")  # allowed to the launcher only
    assert foreign_imports(graph) == ["pdnode.node.ready -> sglang", "pdnode.node.ready -> yaml",
                                      "pdnode.node.secrets -> pdnode.core.plan.build"]
