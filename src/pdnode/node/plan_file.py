"""Read the plan a host program was given: pdnode.plan/1 (pdnode.core.plan.schema) as JSON.

The on-host readers (the verifier's `--plan`, the bench counters) take the plan the
controller rendered. A plan of another shape would be misread field by field, so its
version is checked first and a mismatch is one message saying how to get a readable one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

SCHEMA_ID = "pdnode.plan/1"


class PlanFileError(Exception):
    pass


def read_plan(path: str) -> dict[str, Any]:
    """The plan in file PATH (`-`: standard input). Raises PlanFileError with one line."""
    try:
        if path == "-":
            plan = json.load(sys.stdin)
        else:
            with open(path, encoding="utf-8") as fh:
                plan = json.load(fh)
    except OSError as exc:
        raise PlanFileError(f"cannot read the plan {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PlanFileError(f"the plan {path} is not JSON: {exc}") from None
    if not isinstance(plan, dict):
        raise PlanFileError(f"the plan {path} is not a JSON object")
    found = plan.get("schema")
    if found != SCHEMA_ID:
        raise PlanFileError(
            f"the plan {path} is {found or 'unversioned (older than ' + SCHEMA_ID + ')'}; this program reads "
            f"{SCHEMA_ID}: render it with the same pdnode release (`pdnode render INVENTORY --role plan`)")
    return plan
