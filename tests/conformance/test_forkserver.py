"""The fork server (forkserver.py) that runs the suite's validator-Python runs after one
SGLang import: each run behaves as a process of its own would: its exit status, its two
output streams, its own environment and argv, and nothing of one run left for the next."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.conformance


def test_exit_status_and_streams_are_the_runs(sglang_run):
    r = sglang_run(["-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
    r = sglang_run(["-c", "raise ValueError('boom')"])
    assert r.returncode == 1 and "ValueError: boom" in r.stderr
    r = sglang_run(["-c", "import os; os.write(1, b'fd')"])  # what C code writes to the descriptor too
    assert (r.returncode, r.stdout) == (0, "fd")


def test_environment_argv_and_module_state_do_not_carry_over(sglang_run):
    show = ("import json, os, sys, sglang; print(json.dumps({'argv': sys.argv, 'x': os.environ.get('PDNODE_X'), "
            "'mark': getattr(sglang, 'pdnode_mark', None)})); sglang.pdnode_mark = 1")
    first = json.loads(sglang_run(["-c", show, "a"], {"PDNODE_X": "1"}).stdout)
    second = json.loads(sglang_run(["-c", show, "b"]).stdout)
    assert first == {"argv": ["-c", "a"], "x": "1", "mark": None}
    assert second == {"argv": ["-c", "b"], "x": None, "mark": None}


def test_a_module_runs_as_main_with_its_arguments(sglang_run):
    r = sglang_run(["-m", "pdnode.node.launcher", "--help"])
    assert r.returncode == 0 and "--check" in r.stdout
