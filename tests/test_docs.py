"""The docs name only things that exist: links, repository paths, commands, modules.

Docs rot silently: a link to a file outside the repository, a command that was never
installed (`pdnode-launch`), a module nobody listed. Each test here
reads README.md and docs/**/*.md and fails naming the file, the line and what is wrong.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from pdnode.commands.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")   # [text](target "title")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)   # [name]: target
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
PY_M = re.compile(r"\bpython3?(?:\.\d+)?\s+-m\s+(pdnode(?:\.\w+)*)")
# `pdnode verify`, `.venv/bin/pdnode check`, `pdnode check|render|explain` (each must exist)
PDNODE_SUB = re.compile(r"(?:^|[\s;&(]|\.venv/bin/)pdnode\s+([a-z][\w-]*(?:\|[a-z][\w-]*)*)")
# Top-level entries of the repository: a code span starting with one of these is a path.
TOP = sorted(p.name for p in ROOT.iterdir() if not p.name.startswith(".") and p.is_dir()
             and p.name not in ("__pycache__",))
REPO_PATH = re.compile(r"(?<![\w./$-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./-]*)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def code_text(text: str) -> list[tuple[int, str]]:
    """(line, code) for every fenced block line and every inline code span."""
    out = []
    for m in FENCE.finditer(text):
        start = line_of(text, m.start(1))
        out += [(start + i, line) for i, line in enumerate(m.group(1).splitlines())]
    outside = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keep line numbers
    out += [(line_of(outside, m.start()), m.group(1)) for m in SPAN.finditer(outside)]
    return out


def link_targets(text: str) -> list[tuple[int, str]]:
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    prose = SPAN.sub(lambda m: " " * len(m.group(0)), prose)
    found = [(line_of(prose, m.start()), m.group(1)) for m in LINK.finditer(prose)]
    return found + [(line_of(prose, m.start()), m.group(1)) for m in REF_LINK.finditer(prose)]


def inside_repo(path: Path) -> bool:
    try:
        path.resolve().relative_to(ROOT)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_links_resolve_inside_the_repository(doc):
    text = doc.read_text()
    bad = []
    for line, target in link_targets(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("file:"):
            continue  # http(s), mailto: not a file of ours
        if target.startswith("#"):
            continue  # an anchor on the same page
        path = target.split("#", 1)[0]
        if target.startswith(("file:", "/")):
            bad.append(f"{rel(doc)}:{line}: {target} is an absolute link (outside the repository)")
        elif not inside_repo(doc.parent / path):
            bad.append(f"{rel(doc)}:{line}: {target} points outside the repository")
        elif not (doc.parent / path).exists():
            bad.append(f"{rel(doc)}:{line}: {target} does not exist")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_paths_in_code_exist(doc):
    """`../x` anywhere, and `docs/...`, `scripts/...` (any top-level directory) in code."""
    bad = []
    for line, code in code_text(doc.read_text()):
        for m in re.finditer(r"(?<![\w./-])(\.\./[\w./-]+)", code):
            if not inside_repo(doc.parent / m.group(1)):
                bad.append(f"{rel(doc)}:{line}: {m.group(1)} points outside the repository")
            elif not (doc.parent / m.group(1)).exists():
                bad.append(f"{rel(doc)}:{line}: {m.group(1)} does not exist")
        for m in REPO_PATH.finditer(code):
            path = m.group(1).rstrip(".")
            if not (ROOT / path).exists():
                bad.append(f"{rel(doc)}:{line}: {path} does not exist in the repository")
    assert not bad, "\n".join(bad)


def test_no_path_outside_the_repository_even_in_prose():
    """A relative path that climbs out of the repository is never right in these docs."""
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"(?<![\w./-])((?:\.\./)+[\w-][\w./-]*)", text):
            if not inside_repo(doc.parent / m.group(1)) or not (doc.parent / m.group(1)).exists():
                bad.append(f"{rel(doc)}:{line_of(text, m.start())}: {m.group(1)}")
    assert not bad, "\n".join(bad)


def runnable(module: str) -> bool:
    """`python -m MODULE` works: a module with a main guard, or a package with __main__."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:  # a package
        return importlib.util.find_spec(module + ".__main__") is not None
    return '__name__ == "__main__"' in Path(spec.origin).read_text()


def commands() -> list[tuple[str, int, str]]:
    return [(rel(doc), line, code) for doc in DOCS for line, code in code_text(doc.read_text())]


def test_python_m_modules_exist_and_run():
    bad = [f"{doc}:{line}: python -m {m} is not a runnable module"
           for doc, line, code in commands() for m in PY_M.findall(code) if not runnable(m)]
    assert not bad, "\n".join(bad)


def test_pdnode_subcommands_exist():
    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices  # argparse's subparsers
    bad = []
    for doc, line, code in commands():
        for group in PDNODE_SUB.findall(code.replace("\\|", "|")):  # `\|` in a table cell is `|`
            bad += [f"{doc}:{line}: `pdnode {name}` is not a subcommand (have: {', '.join(subs)})"
                    for name in group.split("|") if name not in subs]
    assert not bad, "\n".join(bad)


def test_commands_named_pdnode_are_installed():
    """A code line or span that starts with a pdnode* program names a console script of
    pyproject.toml (`pdnode`), not one that was never installed (`pdnode-launch`)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    bad = []
    for doc, line, code in commands():
        first = code.strip().lstrip("$ ").split(" ", 1)[0]
        program = first.rsplit("/", 1)[-1] if first.startswith(".venv/bin/") else first
        if re.fullmatch(r"pdnode(?:-[a-z0-9]+)*", program) and program not in scripts:
            bad.append(f"{doc}:{line}: {program} is not an installed command (have: {', '.join(scripts)})")
    assert not bad, "\n".join(bad)


def test_venv_bin_programs_exist():
    venv_bin = ROOT / ".venv" / "bin"
    # not a skip: the suite runs from .venv (scripts/setup makes it), so it must be there
    assert venv_bin.is_dir(), f"{venv_bin} is missing: run scripts/setup (it makes .venv)"
    bad = [f"{doc}:{line}: .venv/bin/{name} is not installed by scripts/setup"
           for doc, line, code in commands() for name in re.findall(r"\.venv/bin/([\w.-]+)", code)
           if not (venv_bin / name).exists()]
    assert not bad, "\n".join(bad)


def test_architecture_lists_every_module():
    """docs/architecture.md gives every module of src/pdnode its job."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    pkg = ROOT / "src" / "pdnode"
    def named(p: Path, suffix: str = "") -> bool:
        return f"`{p.name}{suffix}`" in text or f"`{rel(p)}{suffix}`" in text

    missing = [rel(p) for p in sorted(pkg.rglob("*.py")) if "__pycache__" not in p.parts and not named(p)]
    missing += [rel(p) for p in sorted(pkg.iterdir()) if p.is_dir() and p.name != "__pycache__"
                and not named(p, "/")]
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)


def test_version_changes_are_applied_with_provision():
    """A new version is a new release virtualenv, and the real engine's Mooncake build goes
    into it in the provision phase: a list item or paragraph about versions that applies
    `--tags deploy` without `provision` leaves the new release without Mooncake."""
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        for item in re.split(r"\n(?=[ \t]*(?:[-*]|\d+\.)[ \t])|\n[ \t]*\n", text):
            if not re.search(r"\bversion", item, re.IGNORECASE):
                continue
            for span in SPAN.findall(item):
                tags = re.search(r"--tags[ =](\S+)", span)
                if "ansible-playbook" not in span or "--check" in span or not tags:
                    continue
                names = tags.group(1).split(",")
                if "deploy" in names and "provision" not in names:
                    bad.append(f"{rel(doc)}: {span}")
    assert not bad, "\n".join(bad)


def test_threshold_math_names_the_module_that_computes_it():
    """docs/verification.md's "Threshold math" heading names where threshold_value lives."""
    text = (ROOT / "docs" / "verification.md").read_text()
    heading = next(l for l in text.splitlines() if l.startswith("### Threshold math"))
    module = re.search(r"`threshold_value` in `(verify/\w+\.py)`", heading)
    assert module, heading
    assert "def threshold_value(" in (ROOT / "src" / "pdnode" / module.group(1)).read_text()
