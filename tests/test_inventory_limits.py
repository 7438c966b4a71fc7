"""Inputs that would hang or crash the reader (issue 17, section 8): an alias bomb,
a 20,000-deep nesting and a 5 MB string are each refused with one line and exit 2,
before Ansible reads them. (How fast: docs/measurements.md; a hang fails here through
the subprocess timeout, which only a reader that walks the expansion reaches.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU01 = ROOT / "inventories" / "gpu01"

BOMB = "\n".join(
    ["pdnode_engine_environment:", '  a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    + [f"  a{i}: &a{i} [*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},"
       f"*a{i - 1},*a{i - 1}]" for i in range(1, 10)]) + "\n"
EXTRA_ARGS_BOMB = BOMB.replace("pdnode_engine_environment:", "bomb_base:") + (
    "pdnode_prefill_instances:\n  - gpus: [0, 1, 2, 3]\n    tp_size: 4\n    extra_args:\n      x: *a9\n")

CASES = {
    "alias_bomb_in_environment": ("group_vars/all/zz.yml", BOMB, "aliases are expanded"),
    "alias_bomb_in_extra_args": ("group_vars/all/zz.yml", EXTRA_ARGS_BOMB, "aliases are expanded"),
    "nesting_20000_yaml": ("group_vars/all/zz.yml", "pdnode_x: " + "[" * 20000 + "]" * 20000 + "\n",
                           "nested deeper than"),
    "nesting_20000_json": ("group_vars/all/zz.json", '{"pdnode_x": ' + "[" * 20000 + "]" * 20000 + "}",
                           "nested deeper than"),
    "nesting_100_block": ("host_vars/gpu01.yml",
                          "".join(f"{' ' * i}k{i}:\n" for i in range(100)) + " " * 100 + "v: 1\n", "nested deeper than"),
    # a .json name does not exempt YAML: Ansible falls back to YAML when JSON fails
    "alias_bomb_in_a_json_named_file": ("group_vars/all/zz.json", BOMB, "aliases are expanded"),
    "string_5mb": ("group_vars/all/zz.yml", "pdnode_model_served_name: " + "a" * 5_000_000 + "\n", "bytes, more than"),
    "total_size": ("group_vars/all", None, "hold more than"),
}


def _check(inv: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "check", str(inv)], capture_output=True, text=True,
                          check=False, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_size_depth_and_aliases_are_one_line_exit_2(tmp_path, case):
    inv = tmp_path / "gpu01"
    shutil.copytree(GPU01, inv)
    rel, text, needle = CASES[case]
    if text is None:  # many files, each under the per-file limit, together over the total
        for i in range(6):
            (inv / rel / f"pad{i}.yml").write_text("pdnode_pad: |\n" + ("  " + "x" * 78 + "\n") * 2500)
    else:
        (inv / rel).parent.mkdir(parents=True, exist_ok=True)
        (inv / rel).write_text(text)
    r = _check(inv)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and len(lines[0]) < 400, lines[:3]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_aliases_within_the_limit_are_read_as_ansible_reads_them(tmp_path):
    """A merge key and a shared anchor (what operators write) pass and resolve."""
    inv = tmp_path / "gpu01"
    shutil.copytree(GPU01, inv)
    (inv / "group_vars" / "all" / "zz.yml").write_text(
        "common: &common {SGLANG_LOG_LEVEL_X: info}\npdnode_engine_environment:\n  <<: *common\n  TZ: UTC\n")
    r = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "render", str(inv), "--role", "plan"], capture_output=True,
                       text=True, check=False, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["settings"]["pdnode_engine_environment"]
    assert env["SGLANG_LOG_LEVEL_X"] == "info" and env["TZ"] == "UTC"
