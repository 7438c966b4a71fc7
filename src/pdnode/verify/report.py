"""The report for people (a table) and for machines (JSON, schema pdnode.verify/1).

Check statuses: PASS, WARN (passed, with something to look at: never changes the exit
code), FAIL, SKIP, N/A. WARN and the top-level "warnings" list were added to
pdnode.verify/1 without changing any existing field (docs/verification.md).
"""

from __future__ import annotations

import json
import shutil
import textwrap

from .engine import Report
from .text import printable


def to_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2, sort_keys=False, default=str)


def summary_lines(report: Report) -> list[str]:
    """One line per failed check (what the playbook prints when it fails)."""
    return report.failure_lines()


def to_table(report: Report, width: int | None = None) -> str:
    width = width or max(min(shutil.get_terminal_size((120, 24)).columns, 160), 80)
    t = report.targets
    where = "on the node" if t.get("on_node") else "remote"
    out = [
        f"pdnode verify: host {report.host}, {where}; router {t.get('router_url')}"
        + (f", base URL {t['base_url']}" if t.get("base_url") != t.get("router_url") else ""),
        f"timeouts: {report.timeouts['request_s']:g} s per request, {report.timeouts['overall_s']:g} s overall",
        "",
    ]
    id_w = max([len(c.id) for c in report.checks] + [5])
    head = f"{'CHECK'.ljust(id_w)}  RESULT  EVIDENCE / HINT"
    out += [head, "-" * min(width, max(len(head), 60))]
    indent = " " * (id_w + 10)
    body_w = max(width - len(indent), 40)
    for c in report.checks:
        ev = textwrap.wrap(c.evidence, body_w) or [""]
        out.append(f"{c.id.ljust(id_w)}  {c.status.ljust(6)}  {ev[0]}")
        out += [indent + line for line in ev[1:]]
        if c.hint and c.status in ("FAIL", "WARN"):
            for line in textwrap.wrap("hint: " + c.hint, body_w):
                out.append(indent + line)
    s = report.as_dict()["summary"]
    out.append("")
    if report.error:
        out.append(f"COULD NOT RUN: {printable(report.error)}")
    verdict = "OK" if report.ok else ("COULD NOT RUN" if report.exit_code == 2 else "FAILED")
    timing = report.measurements.get("timing", {})
    extra = (f" ({timing['without_burst_s']:.2f} s without the burst)" if timing.get("burst_s") else "")
    warned = f" ({s['WARN']} with a warning)" if s["WARN"] else ""
    if report.ok and s["WARN"]:
        verdict = "OK, WITH WARNINGS"
    out.append(f"{verdict}: {s['PASS'] + s['WARN']} passed{warned}, {s['FAIL']} failed, {s['SKIP']} skipped, "
               f"{s['N/A']} not applicable in {report.duration_s:.2f} s{extra}; exit code {report.exit_code}")
    return "\n".join(out)
