"""Inventory -> one host's plan for every command, or one error with its exit code (pdnode.core.exits):
`pdnode`'s main prints it; a command with a JSON answer reports it its own way."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from ..exits import EXIT_CANNOT_RUN, EXIT_FAILED
from ..inventory.read import InventoryError, inventory_variables, load_inventory
from .build import Plan, PlanError, Problem, build_plan


class Loaded(NamedTuple):
    plan: Plan
    variables: dict[str, Any]  # the host's, as Ansible resolves them
    sources: dict[str, str]  # variable -> the file that set it
    peers: dict[str, dict[str, Any]]  # every host of the inventory -> its variables
    inventory_dir: str | None = None  # Ansible's inventory_dir of the host (the model's lock file)


class Unplannable(Exception):
    """No plan: the inventory cannot be read (exit_code 2), or its description of the host
    has problems (exit_code 1; ``problems``, and ``lines``: them as `pdnode check` prints them)."""

    def __init__(self, message: str, exit_code: int, problems: list[Problem] = (), lines: list[str] = ()):
        super().__init__(message)
        self.exit_code, self.problems, self.lines = exit_code, list(problems), list(lines)


def source_of(problem: Problem, sources: dict[str, str]) -> str | None:
    """The file that set the problem's variable."""
    return sources.get(re.split(r"[.\[]", problem.field, maxsplit=1)[0])


def problem_lines(inventory: str, host: str, problems: list[Problem], sources: dict[str, str]) -> list[str]:
    n = len(problems)
    return [f"{inventory}: {n} problem{'s' * (n != 1)} in host {host}:"] + [
        f"  {p}" + (f"  [{source_of(p, sources)}]" if source_of(p, sources) else "") for p in problems]


def load_plan(inventory: str, host: str | None = None, record: str | None = None) -> Loaded:
    """HOST's plan (None: the inventory's only host), or Unplannable. RECORD: the text of the
    node's record of the layout it runs (its instances are then named as the node names
    them: pdnode.core.change.identity), read on the node by the caller."""
    try:
        hv = load_inventory(inventory, host)
        peers = inventory_variables(inventory)
    except InventoryError as exc:
        raise Unplannable(str(exc), EXIT_CANNOT_RUN) from None
    try:
        plan = build_plan(hv.variables, hv.host, peers, hv.inventory_dir,
                          running={hv.host: record} if record else None)
    except PlanError as exc:
        n = len(exc.problems)
        raise Unplannable(f"the inventory {inventory} is invalid ({n} problem{'s' * (n != 1)}; `pdnode check "
                          f"{inventory}` lists them)", EXIT_FAILED, exc.problems,
                          problem_lines(inventory, hv.host, exc.problems, hv.sources)) from None
    return Loaded(plan, dict(hv.variables), dict(hv.sources), peers, hv.inventory_dir)
