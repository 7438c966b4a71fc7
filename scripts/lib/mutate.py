"""scripts/mutate: cosmic-ray over the modules whose tests guard users' traffic and trust
(issue 46, item 2), and over each field-failure row's own mutants (item 1).

A benchmark, not a CI gate: it mutates the files in place, one mutant at a time (cosmic-ray
restores each), runs the module's own tests against each, and writes what it found to
docs/measurements.md between markers, one block per module: the command, the tool's
version, the counts, and every surviving mutant with the test that now kills it or the
one-line reason it is not a fault (scripts/lib/mutate.toml, [explained]). A survivor with
neither is written as UNEXPLAINED and the run exits 1.

    scripts/mutate                  every module of scripts/lib/mutate.toml (but default = false ones)
    scripts/mutate --module drain   one (or several: --module a --module b)
    scripts/mutate --rows [ROW...]  each catalogue row's mutants (docs/field-failures-mutants.toml)
                                    against the row's named tests: every one must be killed
    scripts/mutate --list           the modules and how many mutants each would run
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import time
import tomllib
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "scripts" / "lib" / "mutate.toml"
ROWS = ROOT / "docs" / "field-failures-mutants.toml"
REPORT = ROOT / "docs" / "measurements.md"
WORK = ROOT / ".cache" / "mutate"
FAILED = re.compile(r"^(?:FAILED|ERROR) ((?:tests|molecule)/[\w./-]+\.py::\w+(?:::\w+)?)", re.MULTILINE)


def tool(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """cosmic-ray and its filters, from the Python running this script."""
    entry = {"cosmic-ray": "cosmic_ray.cli:main", "cr-filter-operators": "cosmic_ray.tools.filters.operators_filter:main",
             "cr-filter-lines": "cosmic_ray.tools.filters.line_filter:main",
             "cr-filter-pragma": "cosmic_ray.tools.filters.pragma_no_mutate:main"}[args[0]]
    module, func = entry.split(":")
    code = f"import sys; from {module} import {func}; sys.argv[0] = {args[0]!r}; sys.exit({func}())"
    done = subprocess.run([sys.executable, "-c", code, *args[1:]], cwd=ROOT, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done


def definitions(path: Path, names: list[str]) -> list[str]:
    """The line ranges ("a-b") of the named functions (Class.method for a method)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
        elif isinstance(node, ast.FunctionDef):
            found.setdefault(node.name, node)
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"{path}: no function {missing}")
    return [f"{found[n].lineno}-{found[n].end_lineno}" for n in names]


def line_of(path: Path, text: str, after: str | None = None) -> int:
    """The one line of PATH whose stripped text is TEXT (the first after the one line that is
    AFTER, where TEXT alone is not unique)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = line_of(path, after) if after else 0
    found = [i for i, line in enumerate(lines, 1) if line.strip() == text and i > start]
    if not found or (len(found) > 1 and not after):
        raise SystemExit(f"{path}: {len(found)} lines are {text!r} (one expected)")
    return found[0]


def write_config(name: str, module: str, tests: list[str], operators: list[str], lines: list[str] | None,
                 timeout: float) -> Path:
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    keep = "|".join(operators)
    command = f"{sys.executable} -m pytest -q -p no:cacheprovider -x {' '.join(tests)}"
    text = (f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = {timeout}\nexcluded-modules = []\n'
            f'test-command = {json.dumps(command)}\n\n[cosmic-ray.distributor]\nname = "local"\n\n'
            f'[cosmic-ray.filters.operators-filter]\nexclude-operators = [{json.dumps(f"^(?!(?:{keep})$)")}]\n')
    if lines is not None:
        text += f"\n[cosmic-ray.filters.line-filter.lines]\n{json.dumps(module)} = {json.dumps(lines)}\n"
    (work / "config.toml").write_text(text)
    return work


def run_session(work: Path, lines: bool, execute: bool = True) -> list[dict]:
    """init, filter, exec; the session's mutants with their outcomes."""
    config, session = str(work / "config.toml"), str(work / "session.sqlite")
    Path(session).unlink(missing_ok=True)
    tool("cosmic-ray", "init", config, session)
    tool("cr-filter-operators", session, config)
    tool("cr-filter-pragma", session)
    if lines:
        tool("cr-filter-lines", "--config", config, session)
    if execute:
        tool("cosmic-ray", "exec", config, session)
    dump = tool("cosmic-ray", "dump", session).stdout
    out = []
    for line in dump.splitlines():
        item, result = json.loads(line)
        if result and result.get("worker_outcome") == "skipped":
            continue
        (mutation,) = item["mutations"]
        out.append({"operator": mutation["operator_name"], "line": mutation["start_pos"][0],
                    "module": mutation["module_path"], "occurrence": mutation["occurrence"],
                    "outcome": (result or {}).get("test_outcome"), "worker": (result or {}).get("worker_outcome"),
                    "output": (result or {}).get("output") or "", "diff": (result or {}).get("diff") or ""})
    return out


def cell(text: str) -> str:
    """TEXT in a Markdown table's cell."""
    return text.replace("|", "\\|")


def source_line(module: str, number: int) -> str:
    return (ROOT / module).read_text(encoding="utf-8").splitlines()[number - 1].strip()


def explanation_key(name: str, operator: str, text: str) -> str:
    return f"{name} | {operator.removeprefix('core/')} | {text}"


def write_block(key: str, body: str) -> None:
    """Replace (or append) the block between this key's markers in docs/measurements.md."""
    begin, end = f"<!-- mutate:{key}:begin -->", f"<!-- mutate:{key}:end -->"
    page = REPORT.read_text(encoding="utf-8")
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in page:
        page = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, page, flags=re.DOTALL)
    else:
        anchor = "<!-- mutate:modules:end-of-section -->" if key != "rows" else "<!-- mutate:rows:end-of-section -->"
        if anchor not in page:
            raise SystemExit(f"docs/measurements.md has no {anchor}")
        page = page.replace(anchor, f"{block}\n\n{anchor}")
    REPORT.write_text(page, encoding="utf-8")


def run_modules(config: dict, names: list[str], execute: bool) -> int:
    explained = config.get("explained", {})
    unexplained = 0
    for name in names:
        spec = config["module"][name]
        lines = definitions(ROOT / spec["path"], spec["functions"]) if spec.get("functions") else None
        work = write_config(name, spec["path"], spec["tests"], config["operators"], lines, spec.get("timeout", 120.0))
        started = time.monotonic()
        mutants = run_session(work, lines is not None, execute)
        took = time.monotonic() - started
        if not execute:
            print(f"{name}: {len(mutants)} mutants ({spec['path']})")
            continue
        killed = [m for m in mutants if m["outcome"] == "killed"]
        survived = [m for m in mutants if m["outcome"] == "survived"]
        other = [m for m in mutants if m["outcome"] not in ("killed", "survived")]
        rows = []
        for m in sorted(survived, key=lambda m: (m["line"], m["operator"])):
            text = source_line(spec["path"], m["line"])
            why = explained.get(explanation_key(name, m["operator"], text))
            if why is None:
                unexplained += 1
                why = "UNEXPLAINED"
            rows.append(f"| {m['line']} | `{m['operator'].removeprefix('core/')}` | `{cell(text)}` | {why} |")
        what = f" ({', '.join(spec['functions'])})" if spec.get("functions") else ""
        body = [f"#### `{spec['path']}`{what}", "",
                f"`scripts/mutate --module {name}`, cosmic-ray {version('cosmic-ray')}, tests: "
                + ", ".join(f"`{t}`" for t in spec["tests"]) + f"; {time.strftime('%Y-%m-%d')}, "
                f"{took / 60:.1f} min on this 2-core machine.", "",
                f"{len(mutants)} mutants: {len(killed)} killed, {len(survived)} survived"
                + (f", {len(other)} incompetent or not run" if other else "") + ".", ""]
        if rows:
            body += ["| line | operator | the line | why it survives |", "| --- | --- | --- | --- |", *rows]
        write_block(name, "\n".join(body))
        print(f"{name}: {len(mutants)} mutants, {len(killed)} killed, {len(survived)} survived "
              f"({took / 60:.1f} min)")
    return 1 if unexplained else 0


def run_rows(wanted: list[str]) -> int:
    """Each row's mutants against the row's named tests: all must be killed."""
    catalogue = tomllib.loads(ROWS.read_text(encoding="utf-8"))
    failed = 0
    lines_out = ["| row | action | mutant | the line | killed by |", "| --- | --- | --- | --- | --- |"]
    for row in catalogue["row"]:
        if wanted and row["id"] not in wanted:
            continue
        for i, m in enumerate(row.get("mutant", [])):
            number = line_of(ROOT / m["module"], m["line"], m.get("after"))
            tests = sorted(m["tests"])
            work = write_config(f"row-{row['id']}-{i}", m["module"], tests, [re.escape(m["operator"])],
                                [f"{number}-{number}"], 300.0)
            # every named test runs (no -x): the report names each one the mutant fails
            cfg = work / "config.toml"
            cfg.write_text(cfg.read_text().replace(" -x ", " "))
            # the named tests pass unmutated first: a test that always fails would kill anything
            baseline = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                                      cwd=ROOT, capture_output=True, text=True)
            if baseline.returncode != 0:
                raise SystemExit(f"row {row['id']}: its tests fail unmutated:\n{baseline.stdout[-3000:]}")
            mutants = run_session(work, True)
            if not mutants:
                raise SystemExit(f"row {row['id']}: {m['operator']} makes no mutant of {m['line']!r}")
            for mutant in mutants:
                failing = sorted(set(FAILED.findall(mutant["output"])) & set(m["tests"]))
                ok = mutant["outcome"] == "killed" and failing
                failed += not ok
                killers = ", ".join(f"`{t.split('::')[1]}`" for t in failing) if ok else "**SURVIVED**"
                lines_out.append(f"| {row['id']} | {m['action']} | `{m['operator'].removeprefix('core/')}` | "
                                 f"`{cell(m['line'])}` | {killers} |")
                print(lines_out[-1])
    if not wanted:
        write_block("rows", "\n".join([f"`scripts/mutate --rows`, cosmic-ray {version('cosmic-ray')}, "
                                       f"{time.strftime('%Y-%m-%d')}: each row's mutants against the tests the "
                                       "row names (each of them runs, and the column names those the mutant fails).", "", *lines_out]))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", default=[], help="a module of scripts/lib/mutate.toml")
    parser.add_argument("--rows", nargs="*", help="the catalogue rows' mutants (all, or these rows)")
    parser.add_argument("--list", action="store_true", help="count the mutants only")
    args = parser.parse_args()
    if args.rows is not None:
        return run_rows(args.rows)
    config = tomllib.loads(CONFIG.read_text(encoding="utf-8"))
    # a module with `default = false` runs only when named (its tests are too slow for every mutant)
    names = args.module or [n for n, m in config["module"].items() if m.get("default", True) or args.list]
    unknown = [n for n in names if n not in config["module"]]
    if unknown:
        raise SystemExit(f"no module {unknown} in {CONFIG.relative_to(ROOT)}: {', '.join(config['module'])}")
    return run_modules(config, names, not args.list)


if __name__ == "__main__":
    sys.exit(main())
