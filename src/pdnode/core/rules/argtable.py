"""Argument tables of SGLang's, sglang-router's and smg's own parsers, and the type check of
``pdnode_*_extra_args`` values against them.

A table maps an argument's dest (the underscored name the inventory uses) to what its
parser accepts: ``kind`` (flag | int | float | str | json | other), ``list`` (true when
the flag takes several values: nargs *, + or N, or action append) and ``choices``.
The tables are generated from the real parsers and committed as small JSON files, so
``pdnode check`` judges values on a controller that has neither package installed:

    # SGLang (in the validator environment, scripts/sglang-validator):
    PYTHONPATH=src "$(scripts/sglang-validator)" -m pdnode.core.rules.argtable sglang \
        > src/pdnode/data/serverargs-0.5.23.json
    # sglang-router (installed in .venv):
    .venv/bin/python -m pdnode.core.rules.argtable router > src/pdnode/data/routerargs-0.3.2.json
    # smg, the router's successor (a Python with smg installed):
    PYTHONPATH=src python -m pdnode.core.rules.argtable smg > src/pdnode/data/routerargs-smg-1.13.0.json

tests/conformance/test_argtables.py and tests/test_plan_hostile.py check both are current.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from importlib import resources
from typing import Any

from ...node import releases

SGLANG_TABLE = f"data/serverargs-{releases.SGLANG}.json"
ROUTER_TABLE = f"data/routerargs-{releases.SGLANG_ROUTER}.json"
SMG_TABLE = f"data/routerargs-smg-{releases.SMG}.json"
# Argument table of each router package the launcher can start (pdnode.node.router_launch).
ROUTER_TABLES = {"sglang-router": ROUTER_TABLE, "smg": SMG_TABLE}


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:  # store_true/false/const, BooleanOptionalAction
        return "flag"
    t = action.type
    if t is None or t is str:
        return "str"
    if t is int or getattr(t, "__name__", "") == "_non_negative_int":  # smg's unsigned settings
        return "int"
    if t is float:
        return "float"
    name = getattr(t, "__name__", "")
    if name in ("loads", "json_list_type"):  # json.loads and SGLang's JSON list parser
        return "json"
    return "other"  # a parsing function of its own: only the shape is checked here


def describe_parser(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """{dest: {flag, kind, list, choices}} for every option of a parser (not --help)."""
    table: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        longs = [o for o in action.option_strings if o.startswith("--")] or list(action.option_strings)
        many = isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+") or (
            isinstance(action.nargs, int) and action.nargs > 1)
        entry: dict[str, Any] = {"flag": longs[0], "kind": _kind(action), "list": many}
        if action.choices is not None:
            entry["choices"] = sorted((c for c in action.choices), key=str)
        table[action.dest] = entry
    return dict(sorted(table.items()))


def sglang_table() -> dict[str, dict[str, Any]]:
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return describe_parser(parser)


def router_table() -> dict[str, dict[str, Any]]:
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="sglang_router.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return describe_parser(parser)


def smg_table() -> dict[str, dict[str, Any]]:
    from smg.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="smg launch")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return describe_parser(parser)


def dump(table: dict[str, dict[str, Any]], source: str) -> str:
    return json.dumps({"source": source, "args": table}, indent=1, sort_keys=True) + "\n"


@cache
def load(name: str) -> dict[str, dict[str, Any]]:
    """A committed table (read once per process; ~50 KB of JSON, a few milliseconds)."""
    return json.loads(resources.files("pdnode").joinpath(name).read_text(encoding="utf-8"))["args"]


@cache
def load_source(name: str) -> str:
    """Which parser a committed table was generated from, e.g. "smg 1.13.0"."""
    return json.loads(resources.files("pdnode").joinpath(name).read_text(encoding="utf-8"))["source"]


def _scalar_problem(entry: dict[str, Any], value: Any) -> str | None:
    kind = entry["kind"]
    if isinstance(value, bool):
        return f"{entry['flag']} takes a value, not true/false"
    if kind == "int" and not isinstance(value, int):
        return f"{entry['flag']} takes an integer"
    if kind == "float" and not isinstance(value, (int, float)):
        return f"{entry['flag']} takes a number"
    if kind in ("str", "other") and not isinstance(value, (str, int, float)):
        return f"{entry['flag']} takes a single value, not a list or mapping"
    if isinstance(value, str) and value.startswith("-"):
        return "a value may not start with '-' (it would be read as another flag)"
    choices = entry.get("choices")
    if choices is not None and value not in choices and str(value) not in [str(c) for c in choices]:
        return f"{entry['flag']} accepts only {', '.join(str(c) for c in choices)}"
    return None


def value_problem(entry: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` is not what the parser behind ``entry`` accepts (None: it is)."""
    if value is None:
        return None  # null: the argument is left out
    if entry["kind"] == "flag":
        return None if isinstance(value, bool) else f"{entry['flag']} is an on/off flag: write true or false"
    if entry["kind"] == "json":
        if isinstance(value, (dict, list)):
            return None
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                return f"{entry['flag']} takes JSON (write a mapping or a list)"
            return None
        return f"{entry['flag']} takes JSON (write a mapping or a list)"
    if entry["list"]:
        items = value if isinstance(value, list) else None
        if items is None:
            return f"{entry['flag']} takes a list of values"
        for item in items:
            problem = _scalar_problem(entry, item)
            if problem:
                return f"item {item!r}: {problem}"
        return None
    if isinstance(value, dict) and entry["kind"] in ("str", "other"):
        return None  # the launcher passes a mapping as one JSON argument (JSON-text fields)
    return _scalar_problem(entry, value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.argtable", description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["sglang", "router", "smg"])
    args = ap.parse_args(argv)
    from importlib.metadata import version

    if args.which == "sglang":
        sys.stdout.write(dump(sglang_table(), f"sglang {version('sglang')}"))
    elif args.which == "smg":
        sys.stdout.write(dump(smg_table(), f"smg {version('smg')}"))
    else:
        sys.stdout.write(dump(router_table(), f"sglang-router {version('sglang-router')}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
