"""The project's pytest policy, for every suite run from this tree (tests/, and the
molecule scenarios' tests: pytest loads this file for every test below it).

A skip is not a pass. A test that skips because something it needs is missing hides the
very failure it exists to find (a component scripts/setup should have installed, a
fixture that silently found nothing), and a green run then claims what was never
checked. So a run in which any test was skipped FAILS (exit code 1), unless that test is
on ALLOWED_SKIPS below with the reason why skipping is right there. An xfail is a skip
here too (a test expected to fail proves nothing while it does), and so is an xpass of a
non-strict xfail. Every skip is listed
at the end of the run with its reason (scripts/test and the molecule verifiers also pass
-rs). A test that needs a component must fail naming what installs it
(`scripts/setup`), not skip.
"""

from __future__ import annotations

import pytest

# node id, or a prefix of it ("tests/test_x.py::test_y") -> why this test may skip.
# Keep it empty unless a skip is the right outcome on a correctly set-up CI machine.
ALLOWED_SKIPS: dict[str, str] = {}


class _SkipPolicy:
    def __init__(self) -> None:
        self.refused: list[tuple[str, str]] = []  # (node id, reason)

    @staticmethod
    def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
        if hasattr(report, "wasxfail"):
            return f"xfail: {report.wasxfail or 'no reason given'}"
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            return str(longrepr[2]).removeprefix("Skipped: ")
        return str(longrepr)

    def _seen(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        # an xfail is reported as skipped, an xpass as passed with wasxfail set: both are skips here
        if not (report.skipped or hasattr(report, "wasxfail")):
            return
        if any(report.nodeid == allowed or report.nodeid.startswith(allowed.rstrip(":") + "::")
               or report.nodeid.startswith(allowed + "[") for allowed in ALLOWED_SKIPS):
            return
        self.refused.append((report.nodeid or "(collection)", self._reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._seen(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._seen(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.refused and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.refused:
            return
        tr = terminalreporter
        tr.section("skipped tests fail this run (conftest.py: a skip is not a pass)", sep="=", red=True, bold=True)
        for nodeid, reason in self.refused:
            tr.line(f"SKIPPED {nodeid}: {reason}", red=True)
        tr.line(f"{len(self.refused)} test(s) skipped. Fix what made them skip (a missing component: run "
                "scripts/setup), or, when skipping is right on a set-up CI machine, add the test to "
                "ALLOWED_SKIPS in conftest.py with the reason.")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_SkipPolicy(), "pdnode-skip-policy")
