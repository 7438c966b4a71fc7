"""What the preflight role asks the host about the model directory, how it assembles the
probes' answers for pdnode.core.host.facts, and the failure it reports: from the role's
expectations and the host's answers, through filters (plugins/filter/roles.py)."""

from __future__ import annotations

import os
import shlex
from typing import Any


def model_probes(model_path: str | None) -> dict[str, str]:
    """The shell tests of the model directory, in the probes' round trip (none without a
    model path). As a stat that does not follow the last link: a link counts as there,
    and as a directory only when it is none."""
    if model_path is None:
        return {}
    path, config = shlex.quote(str(model_path)), shlex.quote(f"{model_path}/config.json")
    return {"model_exists": f"[ -e {path} ] || [ -L {path} ]",
            "model_isdir": f"[ -d {path} ] && [ ! -L {path} ]",
            "model_config_json": f"[ -e {config} ] || [ -L {config} ]"}


def raw(probes: dict[str, Any], cuda: Any, model_path: str | None) -> dict[str, Any]:
    """The probes' results with the CUDA probe's and the model directory's answers (a
    model probe that did not run, or failed, says no), as pdnode.core.host.facts reads them."""
    def ok(key: str) -> bool:
        return probes.get(key, {}).get("rc", 1) == 0

    return {**probes, "cuda": cuda, "model": {"path": model_path, "exists": ok("model_exists"),
                                              "isdir": ok("model_isdir"), "config_json": ok("model_config_json")}}


def failure(verdict: dict[str, Any], *, fail_on_error: bool, fail_on_warning: bool, host: str,
            facts_file: str) -> dict[str, Any]:
    """The problems that fail the play (the errors, the warnings when asked) and the
    message naming them, one per line after a line naming the host and its facts file."""
    blocking = (list(verdict["errors"]) if fail_on_error else []) + (
        list(verdict["warnings"]) if fail_on_warning else [])
    head = (f"preflight found {len(blocking)} problem(s) on {host} "
            f"(facts: {os.path.realpath(facts_file)}):")
    return {"blocking": blocking, "message": "\n".join([head, *blocking])}
