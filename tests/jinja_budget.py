"""How much program logic the roles hold: Jinja expressions and statements per role.

The plan computes, the roles read (docs/decisions.md): a role's tasks, vars and templates
read values the plan computed. What is counted is every ``{{`` and ``{%`` in a role's
YAML files and templates (comments ``{#`` are not), per role and in all; the budget is
what tests/test_jinja_budget.py holds the roles to. ``python tests/jinja_budget.py``
prints the counts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLES = ROOT / "roles"
EXPRESSION = re.compile(r"\{\{|\{%")
# Issue 43's goal (before it: pd_services 323, all 718), and what the roles hold at most
# today: a ratchet that only goes down (lower it when a change moves more logic out). A new
# role brings its own few: the model role (issue 44) added 9 to "all" (385 -> 394; 3 of
# them start and stop the share of a layout spanning hosts). A layout change's steps (issue
# 45) added 5 to pd_services (a stop at its step: its worker's drain, its unit's stop; the
# handlers' loop over the steps) and took 1 (a loop's label); its measured windows added 3
# (a step's beginning, the report, its end) and the start module's one spec option took 4.
GOAL = {"pd_services": 120, "all": 400}
CEILING = {"pd_services": 119, "all": 397}
VARS_LINES = {"pd_services": 40}


def files(role: Path) -> list[Path]:
    return sorted(p for p in role.rglob("*") if p.is_file() and p.suffix in (".yml", ".yaml", ".j2"))


def counts() -> dict[str, int]:
    out = {role.name: sum(len(EXPRESSION.findall(p.read_text())) for p in files(role))
           for role in sorted(ROLES.iterdir()) if role.is_dir()}
    out["all"] = sum(out.values())
    return out


def from_yaml_of_template() -> list[str]:
    """Places that parse a rendered template back (`lookup('template', ...) | from_yaml`)."""
    return [f"{p.relative_to(ROOT)}:{n}" for role in ROLES.iterdir() if role.is_dir() for p in files(role)
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if "from_yaml" in line and "template" in line]


def main() -> int:
    for name, n in counts().items():
        limits = f"  (at most {CEILING[name]} today; goal {GOAL[name]})" if name in CEILING else ""
        print(f"{name:14} {n:4}{limits}")
    for name, most in VARS_LINES.items():
        lines = len((ROLES / name / "vars" / "main.yml").read_text().splitlines())
        print(f"{name} vars/main.yml: {lines} lines (at most {most})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
