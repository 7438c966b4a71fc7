"""What pdnode.node.launcher assumes about SGLang 0.5.23's command line, checked against
the installed parser (run inside the validator environment)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.conformance

REPO = Path(__file__).resolve().parents[2]


def run_in_env(run, code: str) -> dict:
    """CODE's last line of JSON, run by RUN (the sglang_run fixture, or fresh() for a
    process of its own) in the validator's Python."""
    r = run(["-c", textwrap.dedent(code)], {"PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


PARSER = """
import argparse, contextlib, io, json
with contextlib.redirect_stderr(io.StringIO()):
    from sglang.srt.server_args import ServerArgs, prepare_server_args
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
"""


def test_launcher_tables_match_the_installed_parser(sglang_run):
    got = run_in_env(
        sglang_run,
        PARSER
        + """
from pdnode.node.launcher import table_drift
print(json.dumps({k: [list(v[0]), list(v[1])] for k, v in table_drift(parser).items()}))
""",
    )
    assert got == {}, f"launcher tables differ from SGLang (missing, stale): {got}"


def test_no_store_true_flag_defaults_to_true(sglang_run):
    """A store_true flag with default True could never be turned off from the command
    line; the launcher relies on there being none (the one default-True bool,
    dllm_fdfo, is a BooleanOptionalAction: --no-dllm-fdfo)."""
    got = run_in_env(
        sglang_run,
        PARSER
        + """
bad = [a.dest for a in parser._actions
       if isinstance(a, argparse._StoreTrueAction) and a.default is True]
opt = sorted(a.dest for a in parser._actions
             if isinstance(a, argparse.BooleanOptionalAction) and a.default is True)
print(json.dumps({"store_true_default_true": bad, "negatable_default_true": opt}))
""",
    )
    assert got == {"store_true_default_true": [], "negatable_default_true": ["dllm_fdfo"]}


def test_config_yaml_carries_the_key_and_the_command_line_wins(sglang_run, tmp_path):
    """`--config` YAML: SGLang inserts its options before the command-line ones, so
    the command line wins; keys are turned into flags verbatim, so only the dashed
    spelling `api-key:` works (`api_key:` becomes the unknown flag --api_key)."""
    good = tmp_path / "good.yaml"
    good.write_text('api-key: "sk-from-yaml"\nport: 1234\ntp-size: 2\n')
    under = tmp_path / "under.yaml"
    under.write_text('api_key: "sk-from-yaml"\n')
    got = run_in_env(
        sglang_run,
        PARSER
        + f"""
out = {{}}
sa = prepare_server_args(["--model-path", "m", "--port", "30000", "--config", {str(good)!r}])
out["good"] = [sa.api_key, sa.port, sa.tp_size]
try:
    with contextlib.redirect_stderr(io.StringIO()) as err:
        prepare_server_args(["--model-path", "m", "--config", {str(under)!r}])
    out["under"] = "accepted"
except SystemExit:
    out["under"] = err.getvalue().strip().splitlines()[-1]
print(json.dumps(out))
""",
    )
    assert got["good"] == ["sk-from-yaml", 30000, 2]
    assert "unrecognized arguments: --api_key" in got["under"]


def test_ib_device_mapping_round_trip(sglang_run):
    """A dict value goes on the command line as JSON; SGLang's own parser of
    --disaggregation-ib-device reads it back as {gpu: device}."""
    got = run_in_env(
        sglang_run,
        """
import json
from pdnode.node.launcher import to_argv
from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
    get_ib_devices_for_gpu, parse_ib_device_config)
argv = to_argv({"disaggregation_ib_device": {"4": "mlx5_4", "5": "mlx5_5,mlx5_6"}})
value = argv[argv.index("--disaggregation-ib-device") + 1]
parsed = parse_ib_device_config(value)
print(json.dumps({"argv": argv, "parsed": {str(k): v for k, v in parsed.items()},
                  "gpu5": get_ib_devices_for_gpu(value, 5)}))
""",
    )
    assert got["argv"] == ["--disaggregation-ib-device", '{"4":"mlx5_4","5":"mlx5_5,mlx5_6"}']
    assert got["parsed"] == {"4": "mlx5_4", "5": "mlx5_5,mlx5_6"}
    assert got["gpu5"] == "mlx5_5,mlx5_6"


def test_launcher_is_standard_library_only(sglang_env):
    """The launcher runs on the GPU host inside the SGLang venv: no third-party import
    (in a process of its own: the fork server's children have SGLang imported already)."""
    def fresh(argv: list[str], env: dict) -> subprocess.CompletedProcess:
        return subprocess.run([str(sglang_env), *argv], capture_output=True, text=True, env={**os.environ, **env},
                              timeout=900)

    got = run_in_env(
        fresh,
        """
import json, sys
before = set(sys.modules)
import pdnode.node.launcher
new = {m.split(".")[0] for m in set(sys.modules) - before}
std = set(sys.stdlib_module_names) | {"pdnode"}
print(json.dumps(sorted(new - std)))
""",
    )
    assert got == []


def test_plan_core_field_list_matches_installed_sglang(sglang_run):
    """src/pdnode/data/serverargs-0.5.23.txt (the plan core's list of ServerArgs
    fields, used to vet pdnode_*_extra_args) is exactly SGLang's."""
    listed = {
        line.strip()
        for line in (REPO / "src/pdnode/data/serverargs-0.5.23.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    got = run_in_env(
        sglang_run,
        """
import contextlib, io, json
with contextlib.redirect_stderr(io.StringIO()):
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.arg_groups.arg_utils import record_fields
print(json.dumps(sorted(f.name for f in record_fields(ServerArgs))))
""",
    )
    assert sorted(listed) == got
