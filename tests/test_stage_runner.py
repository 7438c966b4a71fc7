"""scripts/test's stage runner (scripts/lib/stages.sh): a stage that hangs is stopped and
says so, one that is slow but talking is not, one that runs past the total bound is
stopped and says that, a failure keeps its exit code, and a stage that never reported
is a failure in the summary. Each case runs the real shell functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def run_summary(tmp_path: Path, lanes: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """scripts/test's end of a run, the real functions: run_lanes (each lane in the
    background, a dead lane and its unreported stages recorded) then summarize, on the
    lane() given in LANES. Returns the finished shell (its exit code is the run's) and the
    summary's stage lines."""
    results, logs = tmp_path / "results", tmp_path / "logs"
    results.mkdir()
    logs.mkdir()
    script = (f'set -euo pipefail; source {REPO}/scripts/lib/common.sh; root={REPO}; results_dir={results}; '
              f'logs={logs}; source {REPO}/scripts/lib/stages.sh\n{lanes}\nrun_lanes 1 2 3 >/dev/null\nsummarize')
    done = subprocess.run(["bash", "-c", script], timeout=240, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    lines = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    return done, sorted(line.split("(")[0].strip() for line in lines)


def test_the_summary_fails_the_run_on_a_failed_stage_and_on_a_dead_lane(tmp_path):
    # lane 3 dies (SIGKILL, as the OOM killer would) after its first stage: the lane's exit
    # code and its stage that never ran must each be a FAIL; `lane 3 expect` (the list of
    # what should report) runs in the main shell and must not kill it
    done, lines = run_summary(tmp_path, """lane() {
      case $1 in
        1) $2 "one ok" true ;;
        2) $2 "two ok" true; $2 "two broken" bash -c 'echo oops; exit 3' ;;
        3) $2 "three first" true; [ "$2" = expect ] || kill -KILL "$BASHPID"; $2 "three never" true ;;
      esac
    }""")
    assert lines == ["FAIL   lane 3", "FAIL   three never", "FAIL   two broken", "ok     one ok", "ok     three first",
                     "ok     two ok"], (lines, done.stdout, done.stderr)
    assert "the lane exited with code 137" in done.stdout and "its lane died before it" in done.stdout
    assert "3 passed, 3 failed" in done.stdout
    assert done.returncode == 1, (done.returncode, done.stderr)


def test_the_summary_of_a_green_run_exits_0(tmp_path):
    done, lines = run_summary(tmp_path, """lane() {
      case $1 in 1) $2 "one" true ;; 2) $2 "two" true; $2 "two more" true ;; 3) $2 "three" true ;; esac
    }""")
    assert lines == ["ok     one", "ok     three", "ok     two", "ok     two more"], (lines, done.stderr)
    assert "4 passed, 0 failed" in done.stdout and done.returncode == 0, (done.returncode, done.stderr)


def lane_stages() -> list[tuple[str, str, list[str]]]:
    """(lane, stage name, its command's words) of every stage of scripts/test's lanes, as its
    own lane() lists them; the pytest and molecule commands begin with PYTEST and MOLECULE."""
    text = (REPO / "scripts" / "test").read_text()
    functions = text[text.index("lint_stages() {"):text.index("if $quick; then")]
    script = (f"cd {REPO}; pytest=(PYTEST); molecule_test=(MOLECULE); {functions}\n"
              "show() { printf '%s' \"$n\"; printf '\\x1f%s' \"$@\"; printf '\\n'; }\n"
              "for n in $LANES; do lane $n show; done")
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout
    return [(lane, name, words) for lane, name, *words in (line.split("\x1f") for line in out.splitlines())]


# Runs pytest's own collection once per (label, argv) in one process (the imports made
# once), and writes {label: [node id of every test it selects]} as JSON: what a stage's
# pytest would run, not what its command line looks like.
COLLECT = """
import json, sys
import pytest

class Selected:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

out = {}
for label, argv in json.loads(sys.argv[2]):
    plugin = Selected()
    code = pytest.main([*argv, "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[plugin])
    if code not in (0, 5):  # 5: nothing selected (the check below says so)
        sys.exit(f"collecting {label} ({argv}) failed: pytest exit code {code}")
    out[label] = getattr(plugin, "ids", [])
open(sys.argv[1], "w").write(json.dumps(out))
"""


def collected(tmp_path: Path, name: str, runs: list[tuple[str, list[str]]], **env: str) -> dict[str, list[str]]:
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, "-c", COLLECT, str(out), json.dumps(runs)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_test_file_and_test_is_in_exactly_one_lane(tmp_path):
    """What the lanes of scripts/test run, by test path: pytest collects what each Python
    stage's own arguments select (its marker expression, its paths) and what each molecule
    scenario's verifier selects (its test directory, its -m); together they must select
    every test once, and the files they select must be the test files on disk. A lane
    pointed at one file, a marker expression that drops some tests or takes some twice, a
    scenario left out or a test file no stage runs: each fails here."""
    import yaml

    stages = lane_stages()
    assert {lane for lane, _, _ in stages} == {"1", "2", "3", "4", "5"}
    python = [(name, words[1:]) for _, name, words in stages if words[0] == "PYTEST"]
    scenarios = [words[-1] for _, _, words in stages if words[0] == "MOLECULE"]
    assert len(scenarios) == len(set(scenarios)), scenarios  # no scenario twice
    verifiers = []  # each scenario's pytest arguments: its verifier's directory and marker expression
    for scenario in scenarios:
        config = yaml.safe_load((REPO / "molecule" / scenario / "molecule.yml").read_text())
        verifier = config.get("verifier") or {}
        directory = (REPO / "molecule" / scenario / verifier.get("directory", "tests")).resolve()
        options = verifier.get("options") or {}
        assert not {"k", "deselect", "ignore"} & set(options), (scenario, options)  # other selections: add them here
        marker = ["-m", options["m"]] if "m" in options else []
        verifiers.append((f"molecule {scenario}", [str(directory.relative_to(REPO)), *marker]))
    # every test there is, per process: tests/ and molecule/ share test file names (test_collect.py),
    # which one pytest process cannot import both of
    everything = {"tests": ["tests"]}
    everything.update({f"all of {d}": [d] for d in sorted({argv[0] for _, argv in verifiers})})
    chosen = collected(tmp_path, "python", [("tests", ["tests"]), *python])
    # (a verifier module reads the scenario's ephemeral directory, which molecule sets, at import)
    chosen.update(collected(tmp_path, "molecule", [(k, v) for k, v in everything.items() if k != "tests"] + verifiers,
                            MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path)))
    every = [test for label in everything for test in chosen[label]]
    stages_selected = {label: chosen[label] for label, _ in python + verifiers}
    assert all(stages_selected.values()), {label: len(t) for label, t in stages_selected.items()}
    counts = {test: 0 for test in every}
    for tests in stages_selected.values():
        for test in tests:
            counts[test] = counts.get(test, 0) + 1
    assert {test: n for test, n in counts.items() if n != 1} == {}, "tests not run exactly once by the lanes"
    on_disk = {str(p.relative_to(REPO)) for top in ("tests", "molecule") for pattern in ("test_*.py", "*_test.py")
               for p in (REPO / top).rglob(pattern)}
    assert {test.split("::")[0] for test in every} == on_disk
