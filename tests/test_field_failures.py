"""docs/field-failures.md (issue 28) names only what exists: every test a row names is a
function in a file of the repository, every rule id is in the rules table, every action is
one of the catalogue's verbs, and a row that claims an action names the test proving it.
A test renamed or a rule dropped fails here, naming the row."""

from __future__ import annotations

import ast
import re
import tomllib
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


# Each row's actions broken on purpose (issue 46, item 1): docs/field-failures-mutants.toml,
# run by scripts/mutate --rows, recorded in docs/measurements.md.
MUTANTS = ROOT / "docs" / "field-failures-mutants.toml"
BROKEN = {r["id"]: r for r in tomllib.loads(MUTANTS.read_text(encoding="utf-8"))["row"]}
RECORD = ROOT / "docs" / "measurements.md"
RECORDED = re.compile(r"^\| (\S+) \| (\w+) \| `([\w/]+)` \| `(.*)` \| (.*) \|$", re.MULTILINE)


def _recorded() -> dict[tuple[str, str, str], list[str]]:
    """(row, operator, line) -> the test functions the recorded run saw the mutant fail."""
    page = RECORD.read_text(encoding="utf-8")
    block = page[page.index("<!-- mutate:rows:begin -->"):page.index("<!-- mutate:rows:end -->")]
    return {(row, f"core/{op}", line.replace("\\|", "|")): re.findall(r"`(\w+)`", killers)
            for row, _, op, line, killers in RECORDED.findall(block)}


def _claimed(row: dict[str, str]) -> set[str]:
    return {a.strip().split(":")[0].split(" ")[0] for a in row["pdnode"].split("; ")} & set(VERBS)


def test_every_row_is_in_the_mutant_list_and_every_listed_row_in_the_catalogue():
    assert sorted(BROKEN) == sorted(r["#"] for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r["#"] for r in ROWS])
def test_every_claimed_action_is_broken_on_purpose_or_says_why_not(row):
    entry = BROKEN[row["#"]]
    covered = {m["action"] for m in entry.get("mutant", []) + entry.get("variant", []) + entry.get("pending", [])}
    assert _claimed(row) <= covered, f"row {row['#']}: {sorted(_claimed(row) - covered)} neither broken nor pending"
    for m in entry.get("mutant", []) + entry.get("variant", []) + entry.get("pending", []):
        assert m["action"] in VERBS and m["action"].rstrip("s") in row["pdnode"], \
            f"row {row['#']}: {m['action']} is not an action the row claims"
    for p in entry.get("pending", []):
        assert p["why"].strip(), f"row {row['#']}: a pending action without its reason"


@pytest.mark.parametrize("row", ROWS, ids=[r["#"] for r in ROWS])
def test_each_mutant_is_one_line_of_its_module_and_its_tests_are_the_rows(row):
    named = {f"{f}::{t}" for f, t in TEST_REF.findall(row["proven by"])}
    for m in BROKEN[row["#"]].get("mutant", []):
        lines = (ROOT / m["module"]).read_text(encoding="utf-8").splitlines()
        start = [i for i, line in enumerate(lines) if line.strip() == m["after"]] if m.get("after") else [-1]
        hits = [i for i, line in enumerate(lines) if line.strip() == m["line"] and i > start[0]]
        assert len(start) == 1 and hits and (len(hits) == 1 or m.get("after")), \
            f"row {row['#']}: {m['module']} has not exactly one line {m['line']!r}"
        assert m["tests"] and set(m["tests"]) <= named, \
            f"row {row['#']}: {sorted(set(m['tests']) - named)} are not tests the row names"
    for v in BROKEN[row["#"]].get("variant", []):
        assert v["test"] in named, f"row {row['#']}: the variant {v['test']} is not a test the row names"
    for p in BROKEN[row["#"]].get("pending", []):
        assert set(p["tests"]) <= named, f"row {row['#']}: pending {sorted(set(p['tests']) - named)} not named"


@pytest.mark.parametrize("row", ROWS, ids=[r["#"] for r in ROWS])
def test_every_named_test_kills_a_mutant_of_the_row_holds_a_variant_or_is_pending(row):
    """Naming an unrelated test for a row fails here: a test of tests/ the row names must be
    one the recorded run saw fail under one of the row's mutants (scripts/mutate --rows),
    hold the row's broken variant, or be listed, with its reason, under a pending action."""
    entry, recorded = BROKEN[row["#"]], _recorded()
    killers = set()
    for m in entry.get("mutant", []):
        seen = recorded.get((row["#"], m["operator"], m["line"]))
        assert seen, f"row {row['#']}: {m['operator']} on {m['line']!r} was not killed in the recorded run " \
                     "(scripts/mutate --rows)"
        functions = {t.split("::")[1] for t in m["tests"]}
        assert set(seen) <= functions, f"row {row['#']}: recorded killers {seen} are not the mutant's tests"
        killers |= {t for t in m["tests"] if t.split("::")[1] in seen}
    killers |= {v["test"] for v in entry.get("variant", [])}
    pending = {t for p in entry.get("pending", []) for t in p["tests"]}
    for file, function in TEST_REF.findall(row["proven by"]):
        if file.startswith("molecule/"):
            continue  # the scenarios run in containers: their rows' actions are broken in tests/
        test = f"{file}::{function}"
        assert test in killers | pending, f"row {row['#']}: {test} kills none of the row's mutants, holds no " \
                                          "variant and is under no pending action"
