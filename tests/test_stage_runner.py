"""scripts/test's stage runner (scripts/lib/stages.sh): a stage that hangs is stopped and
says so, one that is slow but talking is not, one that runs past the total bound is
stopped and says that, a failure keeps its exit code, and a stage that never reported
is a failure in the summary. Each case runs the real shell functions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_stages(tmp_path: Path, script: str, **env: str) -> tuple[list[str], str]:
    """Run SCRIPT after sourcing the runner; returns the recorded summary lines and the logs."""
    results, logs = tmp_path / "results", tmp_path / "logs"
    results.mkdir()
    logs.mkdir()
    prelude = (f'source {REPO}/scripts/lib/common.sh; root={REPO}; results_dir={results}; logs={logs}; '
               f'source {REPO}/scripts/lib/stages.sh; ')
    subprocess.run(["bash", "-c", prelude + script], check=True, timeout=240, capture_output=True, text=True,
                   env={"PATH": "/usr/bin:/bin", **env})
    lines = sorted(p.read_text().strip() for p in results.iterdir() if p.name[0].isdigit())
    return lines, "\n".join(p.read_text() for p in sorted(logs.iterdir()))


@pytest.mark.integration
def test_a_silent_stage_is_stopped_as_a_hang(tmp_path):
    lines, log = run_stages(tmp_path, "logged_stage hung bash -c 'echo started; exec sleep 600'",
                            PDNODE_TEST_STAGE_IDLE_S="3")
    assert len(lines) == 1 and lines[0].startswith("FAIL") and "hung" in lines[0]
    assert "no output for 3 s, a hang" in lines[0] and "no output for 3 s" in log


@pytest.mark.integration
def test_a_slow_stage_that_talks_is_not_stopped(tmp_path):
    lines, _ = run_stages(tmp_path, "logged_stage slow bash -c 'for i in 1 2 3 4 5 6; do echo $i; sleep 1.5; done'",
                          PDNODE_TEST_STAGE_IDLE_S="3")
    assert len(lines) == 1 and lines[0].startswith("ok") and "slow" in lines[0], lines


@pytest.mark.integration
def test_a_stage_past_the_total_bound_is_stopped_and_says_so(tmp_path):
    lines, _ = run_stages(tmp_path, "logged_stage long bash -c 'while :; do echo tick; sleep 0.5; done'",
                          PDNODE_TEST_STAGE_IDLE_S="60", PDNODE_TEST_STAGE_TIMEOUT_S="3")
    assert len(lines) == 1 and lines[0].startswith("FAIL") and "ran 3 s in all" in lines[0], lines


def test_a_failing_stage_keeps_its_exit_code(tmp_path):
    lines, log = run_stages(tmp_path, "logged_stage broken bash -c 'echo oops; exit 3'")
    assert len(lines) == 1 and lines[0].startswith("FAIL") and "broken" in lines[0]
    assert "exit code 3" in log


def test_a_stage_that_never_reported_fails_the_summary(tmp_path):
    lines, _ = run_stages(tmp_path, "logged_stage first true; record_unreported first second")
    assert [line.split("(")[0].split() for line in lines] == [["FAIL", "second"], ["ok", "first"]], lines
    assert "never reported" in lines[0]


def test_the_stages_write_bytecode_caches(tmp_path):
    # A caller's PYTHONDONTWRITEBYTECODE made every Ansible fork compile its imports again
    # (docs/measurements.md, "Bytecode caches"); scripts/lib/common.sh turns caching back on.
    probe = "import sys; print('dont_write_bytecode', sys.dont_write_bytecode)"
    lines, log = run_stages(tmp_path, f'logged_stage probe python3 -c "{probe}"', PYTHONDONTWRITEBYTECODE="1")
    assert lines[0].startswith("ok") and "dont_write_bytecode False" in log, (lines, log)


def test_every_scenario_and_python_suite_is_in_exactly_one_lane():
    """scripts/test's lanes, as its own lane() lists them: each molecule scenario once, and
    the Python tests split by marker into parts that together select every test once."""
    text = (REPO / "scripts" / "test").read_text()
    functions = text[text.index("lint_stages() {"):text.index("if $quick; then")]
    script = (f"cd {REPO}; pytest=(PYTEST); molecule_test=(MOLECULE); {functions}\n"
              "show() { printf '%s\\t%s\\n' \"$1\" \"${*:2}\"; }\n"
              "for n in $LANES; do lane $n show | sed \"s/^/$n\\t/\"; done")
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout
    stages = [line.split("\t") for line in out.splitlines()]
    scenarios = [cmd.split()[-1] for _, _, cmd in stages if cmd.startswith("MOLECULE")]
    assert sorted(scenarios) == sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
    markers = [cmd.split("-m ")[1].split(" tests")[0] for _, _, cmd in stages if cmd.startswith("PYTEST")]
    assert sorted(markers) == sorted(["not conformance and not integration", "integration and not conformance",
                                      "conformance"]), markers
    assert {lane for lane, _, _ in stages} == {"1", "2", "3", "4", "5"}


def test_the_node_tests_run_once_across_the_scenarios_that_share_them():
    """molecule/node/tests is run by three scenarios (node, day2, repair), each selecting its
    part by a marker expression: together they must select every test, and no test twice."""
    import yaml

    def collected(*args: str) -> list[str]:
        r = subprocess.run([str(REPO / ".venv/bin/python"), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            *args, "molecule/node/tests"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode in (0, 5), r.stdout[-2000:] + r.stderr[-2000:]
        return [line for line in r.stdout.splitlines() if "::" in line]

    expressions = {}
    for config in sorted((REPO / "molecule").glob("*/molecule.yml")):
        verifier = yaml.safe_load(config.read_text()).get("verifier", {})
        directory = (config.parent / verifier.get("directory", "tests")).resolve()
        if directory == REPO / "molecule" / "node" / "tests":
            expressions[config.parent.name] = verifier.get("options", {}).get("m")
    assert set(expressions) == {"node", "day2", "repair"}, expressions
    every = collected()
    chosen = {name: collected("-m", expr) for name, expr in expressions.items()}
    assert all(chosen.values()), {name: len(tests) for name, tests in chosen.items()}
    counts = {test: sum(test in tests for tests in chosen.values()) for test in every}
    assert {test: n for test, n in counts.items() if n != 1} == {}
