"""One SGLang import for the conformance suite's runs of the validator's Python.

Run by that Python (`python forkserver.py`). It imports what `pdnode.node.launcher --check`
imports (SGLang's ServerArgs, its plugins, the resolution hooks), with the environment
the launcher sets before that import, then serves runs: each request is one line of
JSON on stdin, `{"argv": ["-m", MODULE, ARG...] | ["-c", CODE, ARG...], "env": {...},
"stdout": PATH, "stderr": PATH}`, run in a forked child with that environment and argv,
its output in those files; the answer is one line on stdout, the child's exit status.

Why: each run imported SGLang again, about 7 CPU-s, some twenty times a CI
(docs/measurements.md). The launcher judges several files the same way (one import,
each file in a forked child, so no side effect of one judgement reaches the next), and
its own path through a fresh process stays tested (test_check_sglang.py, the `pdnode
check` CLI; test_plan_conformance.py's --verbose run; test_argtables.py).
Standard library only, besides what it imports to warm up.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import traceback


def warm_up() -> None:
    """What the launcher's --check imports, under the environment it sets first."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from pdnode.node import launcher

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        launcher._SGLang().warm_up()


def run(request: dict) -> int:
    """In a forked child: REQUEST's argv with its environment; the exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
            os.environ.clear()
            os.environ.update(request["env"])
            flag, target, *args = request["argv"]
            if flag == "-m":
                sys.argv = [target, *args]
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            elif flag == "-c":
                sys.argv = ["-c", *args]
                exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
            else:
                raise ValueError(f"argv must start with -m or -c, not {flag!r}")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported as a Python process would
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the imports print must not reach the answers
    warm_up()
    answers.write("ready\n")
    for line in sys.stdin:
        answers.write(f"{run(json.loads(line))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
