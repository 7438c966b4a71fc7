"""docs/field-failures.md (issue 28) names only what exists: every test a row names is a
function in a file of the repository, every rule id is in the rules table, every action is
one of the catalogue's verbs, and a row that claims an action names the test proving it.
A test renamed or a rule dropped fails here, naming the row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pdnode.core.rules.catalogue import BY_ID

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "field-failures.md"
COLUMNS = ["#", "failure", "issue", "the pin", "pdnode", "rule", "proven by"]
VERBS = ("refuses", "prevents", "detects", "alerts", "recovers", "warns")
TEST_REF = re.compile(r"`((?:tests|molecule)/[\w./-]+\.py)::([\w:]+)`")
RULE_REF = re.compile(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`")
LINK = re.compile(r"\[[^\]]+\]\((https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+)\)")


def rows() -> list[dict[str, str]]:
    """The catalogue's rows, by column name."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| # |"))
    assert [c.strip() for c in lines[start].strip("|").split("|")] == COLUMNS, lines[start]
    found = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == len(COLUMNS), f"row with {len(cells)} cells (a '|' inside a cell?): {line[:80]}"
        found.append(dict(zip(COLUMNS, cells, strict=True)))
    return found


ROWS = rows()


def _functions(path: Path) -> set[str]:
    """test functions of a file, and Class::method for those in classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return names


def test_the_catalogue_has_the_issues_failures():
    ids = [r["#"] for r in ROWS]
    assert len(ids) == len(set(ids)), ids
    assert {str(n) for n in range(1, 13)} <= set(ids), "issue 28 lists 12 failures"


@pytest.mark.parametrize("row", ROWS, ids=[r["#"] for r in ROWS])
def test_every_named_test_exists(row):
    refs = TEST_REF.findall(row["proven by"])
    for file, function in refs:
        path = ROOT / file
        assert path.is_file(), f"row {row['#']}: {file} does not exist"
        assert function in _functions(path), f"row {row['#']}: {file} has no test {function}"
    rest = TEST_REF.sub("", row["proven by"]).replace(",", "").strip()
    assert rest in ("", "not yet"), f"row {row['#']}: not a test reference: {rest!r}"


@pytest.mark.parametrize("row", ROWS, ids=[r["#"] for r in ROWS])
def test_every_named_rule_is_in_the_rules_table(row):
    named = RULE_REF.findall(row["rule"])
    assert all(r in BY_ID for r in named), f"row {row['#']}: {[r for r in named if r not in BY_ID]} not in rules.py"
    assert named or row["rule"] == "—", f"row {row['#']}: the rule column holds ids or —"
    if named:
        assert "refuses" in row["pdnode"], f"row {row['#']}: a rule without 'refuses'"


@pytest.mark.parametrize("row", ROWS, ids=[r["#"] for r in ROWS])
def test_an_action_is_claimed_only_with_its_test(row):
    actions = [part.strip() for part in row["pdnode"].split("; ")]
    verbs = [a.split(":")[0].split(" ")[0] for a in actions]
    assert all(v in VERBS or a.startswith("not yet") for v, a in zip(verbs, actions, strict=True)), \
        f"row {row['#']}: each action starts with one of {VERBS} or 'not yet': {row['pdnode']}"
    claims = any(v in VERBS for v in verbs)
    assert bool(TEST_REF.findall(row["proven by"])) == claims, \
        f"row {row['#']}: an action needs a named test, and a test an action ('not yet' otherwise)"


@pytest.mark.parametrize("row", ROWS, ids=[r["#"] for r in ROWS])
def test_every_row_links_or_names_its_issue(row):
    assert LINK.search(row["issue"]) or "not found" in row["issue"], f"row {row['#']}: no issue link"
