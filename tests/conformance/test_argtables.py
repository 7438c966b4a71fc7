"""src/pdnode/data/serverargs-0.5.23.json (the plan core's table of SGLang's
arguments: flag, type, list, choices; used to type-check pdnode_*_extra_args on a
controller without SGLang) is exactly what the installed SGLang's parser says."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.conformance

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "src/pdnode/data/serverargs-0.5.23.json"


def test_sglang_argument_table_is_current(sglang_env):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    r = subprocess.run([str(sglang_env), "-m", "pdnode.core.rules.argtable", "sglang"], check=False, capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    live = json.loads(r.stdout)
    assert live["source"] == "sglang 0.5.23"
    assert json.loads(TABLE.read_text()) == live, (
        'regenerate: PYTHONPATH=src "$(scripts/sglang-validator)" -m pdnode.core.rules.argtable sglang '
        "> src/pdnode/data/serverargs-0.5.23.json")

