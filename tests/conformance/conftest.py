"""Conformance tests: ServerArgs dicts judged by SGLang 0.5.23's own validation.

The judge is `pdnode.node.launcher --check`, run by the Python of the environment that
`scripts/sglang-validator` builds (~/.cache/pdnode/sglang-validator: Python 3.11, CPU torch,
sglang --no-deps). Building it takes a few minutes the first time and well under a
second afterwards. If it cannot be built the tests fail -- they are never skipped:
a conformance suite that quietly does not run proves nothing.

Fixtures
  sglang_env         path of the validator's python (builds the environment once)
  sglang_check       fn(serverargs: dict, name="case", extra=None) -> (accepted: bool, message: str)
                     (extra: more launcher options, e.g. ["--api-key-file", path])
  sglang_check_many  fn({name: serverargs}) -> {name: (accepted, message)} (each file is
                     judged in its own forked process)
  sglang_run         fn(["-m", MODULE | "-c", CODE, ARG...], env=None) -> CompletedProcess:
                     what `sglang_env ARG...` would do, run by forkserver.py, which
                     imports SGLang once for the whole session (a run each forked child)
`message` is the launcher's verdict line, e.g.
  "REJECTED: decode.json: AssertionError: 'assert cfg.tp_size % cfg.attn_dp_size == 0' (...)"
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VALIDATOR = REPO / "scripts" / "sglang-validator"
FIXTURES = REPO / "src" / "pdnode" / "data" / "models"  # check uses them too
DEEPSEEK_V3_TINY = str(FIXTURES / "deepseek-v3-tiny")
QWEN2_TINY = str(FIXTURES / "qwen2-tiny")

# one launcher run may import SGLang (~10 s idle, much more on a busy machine)
CHECK_TIMEOUT_S = 900


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@pytest.fixture(scope="session")
def sglang_env() -> Path:
    try:
        r = subprocess.run(
            [str(VALIDATOR)], capture_output=True, text=True, timeout=3600, cwd=REPO
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"scripts/sglang-validator could not run: {e}", pytrace=False)
    if r.returncode != 0:
        pytest.fail(
            "scripts/sglang-validator could not build SGLang's validation environment "
            f"(exit {r.returncode}); the conformance tests need it.\n"
            f"{_tail(r.stderr)}",
            pytrace=False,
        )
    python = Path(r.stdout.strip().splitlines()[-1])
    if not python.is_file():
        pytest.fail(f"scripts/sglang-validator printed {python}, which does not exist", pytrace=False)
    return python


class ForkServer:
    """forkserver.py in the validator's Python: SGLang imported once, each run forked."""

    def __init__(self, python: Path, workdir: Path):
        self.workdir = workdir
        self.log = workdir / "forkserver.log"
        self.env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        with self.log.open("w") as log:
            self.process = subprocess.Popen([str(python), str(HERE / "forkserver.py")], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, text=True, env=self.env)
        self.runs = 0
        self._answer("start")

    def _answer(self, what: str) -> str:
        """The server's next line; a failure naming WHAT when it died or stayed silent."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if selector.select(CHECK_TIMEOUT_S):
                line = self.process.stdout.readline()
                if line:
                    return line.strip()
        self.process.kill()
        pytest.fail(f"the SGLang fork server gave no answer to {what} (exit {self.process.poll()}); "
                    f"its log:\n{_tail(self.log.read_text())}", pytrace=False)

    def run(self, argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
        self.runs += 1
        out, err = self.workdir / f"run-{self.runs}.out", self.workdir / f"run-{self.runs}.err"
        request = {"argv": [str(a) for a in argv], "env": {**self.env, **(env or {})},
                   "stdout": str(out), "stderr": str(err)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        code = int(self._answer(" ".join(request["argv"])[:200]))
        return subprocess.CompletedProcess(argv, code, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="session")
def sglang_run(sglang_env):
    with tempfile.TemporaryDirectory(prefix="pdnode-forkserver-") as tmp:
        server = ForkServer(sglang_env, Path(tmp))
        yield server.run
        server.close()


def _run_check(run, cases: dict[str, dict], extra: list[str] | None = None):
    bad = [n for n in cases if not re.fullmatch(r"[A-Za-z0-9_.-]+", n)]
    assert not bad, f"case names must be file-name safe: {bad}"
    with tempfile.TemporaryDirectory(prefix="pdnode-conformance-") as tmp:
        paths = []
        for name, serverargs in cases.items():
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(serverargs, indent=2))
            paths.append(str(path))
        r = run(["-m", "pdnode.node.launcher", "--check", *(extra or []), *paths])
    lines = r.stdout.strip().splitlines()
    verdicts = {}
    for name in cases:
        pattern = rf"^(OK|REJECTED|CANNOT CHECK): {re.escape(name)}\.json[: ]"
        line = next((ln for ln in lines if re.match(pattern, ln)), None)
        if line is None:
            pytest.fail(
                f"no verdict for {name} from pdnode.node.launcher --check (exit {r.returncode})\n"
                f"stdout: {_tail(r.stdout)}\nstderr: {_tail(r.stderr)}",
                pytrace=False,
            )
        if line.startswith("CANNOT CHECK"):
            pytest.fail(f"SGLang's validation could not run: {line}", pytrace=False)
        verdicts[name] = (line.startswith("OK:"), line)
    if "Traceback" in r.stdout:
        pytest.fail(f"the launcher printed a traceback:\n{_tail(r.stdout)}", pytrace=False)
    return verdicts


@pytest.fixture(scope="session")
def sglang_check_many(sglang_run):
    def check_many(cases: dict[str, dict], extra: list[str] | None = None):
        return _run_check(sglang_run, cases, extra)

    return check_many


@pytest.fixture(scope="session")
def sglang_check(sglang_check_many):
    def check(serverargs: dict, name: str = "case", extra: list[str] | None = None) -> tuple[bool, str]:
        return sglang_check_many({name: serverargs}, extra)[name]

    return check
