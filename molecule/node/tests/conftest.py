"""Fixtures shared by the node scenario's tests that drive the bundle from the controller."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")


_CONFIG: list[pytest.Config] = []  # for the reporter of pytest_runtest_logreport


def pytest_configure(config):
    _CONFIG.append(config)
    config.addinivalue_line("markers", "day2: a day-2 test of the node (layouts, upgrade): scenario day2 runs them")
    config.addinivalue_line("markers", "repair: how a deploy repairs the node (drift matrix, interrupted deploys): "
                            "scenario repair runs them")
    config.addinivalue_line("markers", "model: the model role against a real HF-compatible server: scenario model "
                            "runs them")


# What the node's services logged around a failed test, in the test's report: the
# container is gone by the time anyone reads the log (molecule destroys it), and a failure
# seen only on a busy machine cannot be asked again.
FAILURE_JOURNAL_LINES = 80


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    try:
        journal = subprocess.run(
            ["docker", "exec", CONTAINER, "journalctl", "--no-pager", "-o", "short-precise", "--since", "-5min",
             "-n", str(FAILURE_JOURNAL_LINES), "-u", "sglang-pd-*"],
            capture_output=True, text=True, timeout=60, check=False)
        text = journal.stdout or journal.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        text = f"(no journal: {exc})"
    report.sections.append((f"journal of {CONTAINER}'s services, the last {FAILURE_JOURNAL_LINES} lines", text))


# A failure's text as soon as the test fails, not in the summary at the end: a stage that
# is stopped later (a hang, its time limit) never prints that summary, and its log then
# said only FAILED (a repair scenario beside two CPU burners, session 21).
FAILURE_TEXT_CHARS = 6000


def pytest_runtest_logreport(report):
    if not report.failed:
        return
    text = report.longreprtext
    if len(text) > FAILURE_TEXT_CHARS:
        text = "...\n" + text[-FAILURE_TEXT_CHARS:]
    sections = "".join(f"\n--- {title}\n{body}" for title, body in report.sections if title.startswith("journal of"))
    reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    if reporter is not None:  # the terminal's own writer: outside any capture
        reporter.write_line(f"\n==== {report.nodeid} failed ({report.when}):\n{text}{sections}\n"
                            f"==== end of {report.nodeid}")


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    """An inventory for the scenario's instance with the scenario's description."""
    inv = tmp_path_factory.mktemp("inv")
    (inv / "host_vars").mkdir()
    (inv / "group_vars").symlink_to(REPO / "inventories" / "demo" / "group_vars")
    (inv / "hosts.yml").write_text(json.dumps({"all": {"hosts": {CONTAINER: {
        "ansible_connection": "community.docker.docker", "ansible_host": CONTAINER}}}}))
    (inv / "host_vars" / f"{CONTAINER}.yml").write_text(
        (REPO / "molecule" / "node" / "host_vars" / "pdnode-mol-node.yml").read_text())
    return inv
