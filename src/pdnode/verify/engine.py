"""Run the checks in order and build the report (one engine for every entry point).

Exit codes: 0 no check failed (PASS, WARN, N/A, or SKIP for --skip-burst), 1 a check failed,
2 the verification could not run (node unreachable, bad arguments, unreadable key file).
Every evidence and hint passes through text.printable() here: they quote the node's
answers, which must not reach a terminal raw.
"""

from __future__ import annotations

import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..node.secrets import SecretError
from .checks import FAIL, NA, PASS, SKIP, WARN, CheckResult, Ctx, Result, all_checks, gate
from .config import Run
from .http import port_open
from .text import printable

from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from . import SCHEMA


@dataclass
class Report:
    host: str
    targets: dict[str, Any]
    timeouts: dict[str, float]
    checks: list[CheckResult] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the verification could not run
    started_at: str = ""
    duration_s: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return EXIT_CANNOT_RUN
        # SKIPs follow from a failure (or from --skip-burst): only FAIL decides.
        return EXIT_FAILED if any(c.status == FAIL for c in self.checks) else EXIT_OK

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == FAIL]

    def warned(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == WARN]

    def warning_lines(self) -> list[str]:
        """One line per check that passed with a warning ("id: evidence -- hint: hint")."""
        return [f"{c.id}: {c.evidence}" + (f" -- hint: {c.hint}" if c.hint else "") for c in self.warned()]

    def failure_lines(self) -> list[str]:
        """One line per failed check ("id: evidence -- hint: hint"), and why it could not run."""
        lines = [f"could not run: {self.error}"] if self.error else []
        for c in self.failed():
            lines.append(f"{c.id}: {c.evidence}" + (f" -- hint: {c.hint}" if c.hint else ""))
        return lines

    def as_dict(self) -> dict[str, Any]:
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP, NA)}
        return {
            "schema": SCHEMA, "ok": self.ok, "exit_code": self.exit_code, "error": self.error,
            "host": self.host, "started_at": self.started_at, "duration_s": round(self.duration_s, 3),
            "timeouts": self.timeouts, "targets": self.targets, "summary": counts,
            "checks": [c.as_dict() for c in self.checks],
            "failures": self.failure_lines(),
            "warnings": self.warning_lines(),
            "measurements": self.measurements,
        }


def _reachability(run: Run) -> dict[str, str | None]:
    """TCP reachability of each target URL (None: reachable), probed in parallel, bounded."""
    t = run.targets
    urls = {"router_url": t.router_url, "base_url": t.base_url}
    for i in t.instances:
        urls.update({f"{i.id} url": i.url, f"{i.id} bootstrap_url": i.bootstrap_url})
    urls = {k: v for k, v in urls.items() if v}

    def probe(url: str) -> str | None:
        p = urlsplit(url)
        port = p.port or (443 if p.scheme == "https" else 80)
        return port_open(p.hostname or "", port, timeout_s=min(5.0, run.settings.timeout_s))

    with ThreadPoolExecutor(max_workers=min(len(urls), 16) or 1) as pool:
        found = dict(zip(urls.values(), pool.map(probe, urls.values())))
    return found


def verify(run: Run) -> Report:
    t0 = time.monotonic()
    report = Report(host=run.host, targets=run.targets.as_dict(),
                    timeouts={"request_s": run.settings.timeout_s, "overall_s": run.settings.overall_s},
                    started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        ctx = Ctx(run)
    except SecretError as exc:  # the admin key file (read like the router's launcher reads it)
        report.error = f"cannot use the admin key file: {exc}"
        return report
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8 text
        report.error = f"cannot read the API key file {run.api_key_file}: {getattr(exc, 'strerror', None) or exc}"
        return report
    checks = all_checks(run)
    reach = _reachability(run)
    if reach and all(why is not None for why in reach.values()):
        detail = "; ".join(f"{url}: {why}" for url, why in reach.items())
        report.error = f"node unreachable: {detail}"
        for c in checks:
            report.checks.append(CheckResult(c.id, c.title, SKIP, "skipped: because the node is unreachable",
                                             "check the address and that the services run", 0.0,
                                             "the node is unreachable"))
        report.duration_s = time.monotonic() - t0
        return report
    results = ctx.results
    burst_s = 0.0
    for check in checks:
        c0 = time.monotonic()
        res = gate(check, results)
        if res is None and ctx.deadline.expired():
            res = Result(SKIP, f"skipped: because the overall time bound ({run.settings.overall_s:.0f} s) was reached",
                         "raise --overall-timeout, or find what is slow in the checks above")
        if res is None:
            try:
                res = check.fn(ctx)
            except Exception as exc:  # a bug in a check must not hide the others
                ctx.internal_error = f"{check.id}: {type(exc).__name__}: {exc}"
                res = Result(FAIL, f"verifier error: {type(exc).__name__}: {exc}",
                             "this is a bug in pdnode.verify: " + traceback.format_exc(limit=3).splitlines()[-1])
        dur = time.monotonic() - c0
        if check.id == "burst" or check.id.startswith("threshold."):
            burst_s += dur
        results[check.id] = CheckResult(check.id, check.title, res.status, printable(res.evidence),
                                        printable(res.hint), dur, res.cause)
        report.checks.append(results[check.id])
    report.measurements = ctx.measurements
    report.duration_s = time.monotonic() - t0
    report.measurements["timing"] = {"total_s": round(report.duration_s, 3), "burst_s": round(burst_s, 3),
                                     "without_burst_s": round(report.duration_s - burst_s, 3)}
    if ctx.internal_error:
        report.error = f"verifier error in {ctx.internal_error}"
    return report
