"""The upgrade's command line, on the controller: playbooks/upgrade.yml runs
`python -m pdnode.commands.upgrade decide|finish|report` with one JSON object on standard
input and reads one JSON object on standard output. The decisions are
pdnode.core.change.upgrade's (its docstring gives each sub-command's input and output)."""

from __future__ import annotations

import json
import sys

from ..core.change.upgrade import UpgradeError, build_report, decide, finish


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in ("decide", "finish", "report"):
        print("usage: python -m pdnode.commands.upgrade decide|finish|report < JSON", file=sys.stderr)
        return 1
    try:
        doc = json.load(sys.stdin)
        if argv[0] == "decide":
            out = decide(doc.get("record"), doc.get("unit_venv") or "", doc["target"], doc.get("host_model"))
        elif argv[0] == "finish":
            out = finish(doc.get("record") or {}, doc["from"], doc["to"], doc["outcome"])
        else:
            out = build_report(doc)
    except (UpgradeError, KeyError, TypeError, ValueError) as exc:
        print(f"pdnode.upgrade {argv[0]}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
