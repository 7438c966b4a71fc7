"""pdnode.node.launcher without SGLang: argv conversion, the API key hand-off, refusals.

SGLang's own view of the same conversions is in tests/conformance/ (slow)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdnode.node import launcher
from pdnode.node.launcher import LaunchError, to_argv

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
KEY = "sk-pdnode-unit-0123456789abcdef"


def run_launcher(*args, env=None, cwd=None, timeout=60):
    e = dict(os.environ)
    e.pop("RUNTIME_DIRECTORY", None)
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), *(env or {}).pop("_extra_path", [])])
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pdnode.node.launcher", *map(str, args)],
        capture_output=True,
        text=True,
        env=e,
        cwd=cwd,
        timeout=timeout,
    )


def one_line_error(r, *needles):
    """exit 2, exactly one line on stderr naming the problem, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def serverargs_file(tmp_path):
    def write(data, name="prefill.json"):
        path = tmp_path / name
        path.write_text(json.dumps(data) if not isinstance(data, str) else data)
        return path

    return write


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------- to_argv


def test_scalars_and_bools():
    argv = to_argv(
        {
            "model_path": "/models/dsv3",
            "tp_size": 4,
            "mem_fraction_static": 0.85,
            "enable_metrics": True,
            "enable_dp_lm_head": False,
            "nccl_port": None,
        }
    )
    assert argv == [
        "--model-path", "/models/dsv3",
        "--tp-size", "4",
        "--mem-fraction-static", "0.85",
        "--enable-metrics",
    ]


def test_false_becomes_no_flag_for_boolean_optional_actions():
    # dllm_fdfo defaults to True in SGLang 0.5.23: omitting it would leave it on
    assert to_argv({"dllm_fdfo": False}) == ["--no-dllm-fdfo"]
    assert to_argv({"dllm_fdfo": True}) == ["--dllm-fdfo"]
    assert to_argv({"enable_tp_lm_head_all_to_all": False}) == [
        "--no-enable-tp-lm-head-all-to-all"
    ]
    assert to_argv({"enable_tf32_matmul": None}) == []


def test_false_for_an_auto_store_true_flag_is_refused():
    with pytest.raises(LaunchError, match="cannot be told false for --enable-multimodal"):
        to_argv({"enable_multimodal": False})
    assert to_argv({"enable_multimodal": True}) == ["--enable-multimodal"]
    assert to_argv({"enable_multimodal": None}) == []


def test_dict_is_one_json_argument():
    argv = to_argv({"disaggregation_ib_device": {"4": "mlx5_4", "5": "mlx5_5"}})
    assert argv == ["--disaggregation-ib-device", '{"4":"mlx5_4","5":"mlx5_5"}']
    assert json.loads(argv[1]) == {"4": "mlx5_4", "5": "mlx5_5"}
    assert to_argv({"disaggregation_ib_device": "mlx5_0,mlx5_1"}) == [
        "--disaggregation-ib-device", "mlx5_0,mlx5_1",
    ]


def test_lists():
    # nargs="+": repeated values
    assert to_argv({"cuda_graph_bs_decode": [1, 2, 4, 8]}) == [
        "--cuda-graph-bs-decode", "1", "2", "4", "8",
    ]
    assert to_argv({"bucket_time_to_first_token": [0.1, 0.5]}) == [
        "--bucket-time-to-first-token", "0.1", "0.5",
    ]
    # nargs="*": an empty list is the bare flag
    assert to_argv({"uvicorn_access_log_exclude_prefixes": []}) == [
        "--uvicorn-access-log-exclude-prefixes"
    ]
    # json_list_type fields take the whole list as one JSON string
    assert to_argv({"forward_hooks": [{"name": "h"}]}) == ["--forward-hooks", '[{"name":"h"}]']
    # dict items of a list (e.g. --lora-paths '{"lora_name":..,"lora_path":..}')
    assert to_argv({"lora_paths": ["a=/x", {"lora_name": "b", "lora_path": "/y"}]}) == [
        "--lora-paths", "a=/x", '{"lora_name":"b","lora_path":"/y"}',
    ]


def test_flag_names_that_differ_from_the_field():
    assert to_argv({"fp8_gemm_runner_backend": "auto"}) == ["--fp8-gemm-backend", "auto"]


def test_value_starting_with_dash_is_attached():
    assert to_argv({"tool_call_parser": "-x"}) == ["--tool-call-parser=-x"]
    assert to_argv({"base_gpu_id": -1}) == ["--base-gpu-id=-1"]


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"api_key": "sk"}, "--api-key-file"),
        ({"admin_api_key": "sk"}, "secret"),
        ({"config": "x.yaml"}, "--config is written by the launcher"),
        ({"tp-size": 4}, "not a ServerArgs field name"),
        ({"TpSize": 4}, "not a ServerArgs field name"),
        ({"mem_fraction_static": float("nan")}, "not a finite number"),
        ({"cuda_graph_bs_decode": [True]}, "cannot be a boolean"),
    ],
)
def test_refused_values(data, needle):
    with pytest.raises(LaunchError) as e:
        to_argv(data)
    assert needle in str(e.value)


# --------------------------------------------------------------------------- API key


def test_api_key_never_in_argv_and_yaml_is_0600(serverargs_file, key_file, tmp_path):
    path = serverargs_file({"model_path": "/m", "tp_size": 4})
    rundir = tmp_path / "run"
    rundir.mkdir()
    r = run_launcher("--dry-run", "--api-key-file", key_file, path,
                     env={"RUNTIME_DIRECTORY": str(rundir)})
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout + r.stderr
    argv = r.stdout.split()
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    config = Path(argv[argv.index("--config") + 1])
    assert config == rundir / "prefill.sglang-config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    # SGLang 0.5.23 turns YAML keys into flags verbatim: the dashed spelling is required
    assert yaml.safe_load(config.read_text()) == {"api-key": KEY}
    assert [p.name for p in rundir.iterdir()] == ["prefill.sglang-config.yaml"]


def test_api_key_with_yaml_special_characters(serverargs_file, tmp_path):
    key = 'a"b\\c:#{}[]&*!|>\'%@`é'
    kf = tmp_path / "k"
    kf.write_text(key)  # no trailing newline is fine too
    kf.chmod(0o400)
    rundir = tmp_path / "run"
    rundir.mkdir()
    r = run_launcher("--dry-run", "--api-key-file", kf, serverargs_file({"model_path": "/m"}),
                     env={"RUNTIME_DIRECTORY": str(rundir)})
    assert r.returncode == 0, r.stderr
    config = rundir / "prefill.sglang-config.yaml"
    assert yaml.safe_load(config.read_text()) == {"api-key": key}


def test_api_key_config_replaces_a_planted_symlink(serverargs_file, key_file, tmp_path):
    rundir = tmp_path / "run"
    rundir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (rundir / "prefill.sglang-config.yaml").symlink_to(victim)
    r = run_launcher("--dry-run", "--api-key-file", key_file, serverargs_file({"model_path": "/m"}),
                     env={"RUNTIME_DIRECTORY": str(rundir)})
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "untouched"
    assert not (rundir / "prefill.sglang-config.yaml").is_symlink()


def test_without_runtime_directory_a_private_tempdir_is_used(serverargs_file, key_file):
    r = run_launcher("--dry-run", "--api-key-file", key_file, serverargs_file({"model_path": "/m"}))
    assert r.returncode == 0, r.stderr
    argv = r.stdout.split()
    config = Path(argv[argv.index("--config") + 1])
    try:
        assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert yaml.safe_load(config.read_text()) == {"api-key": KEY}
    finally:
        config.unlink()
        config.parent.rmdir()


def test_read_api_key_strips_one_newline_only(tmp_path):
    kf = tmp_path / "k"
    kf.write_text("abc\n")
    kf.chmod(0o600)
    assert launcher.read_api_key(str(kf)) == "abc"
    kf.write_text("abc\r\n")
    assert launcher.read_api_key(str(kf)) == "abc"
    kf.write_text("abc\n\n")
    with pytest.raises(LaunchError, match="whitespace"):
        launcher.read_api_key(str(kf))


@pytest.mark.parametrize(
    "content, mode, needle",
    [
        ("", 0o600, "is empty"),
        ("\n", 0o600, "is empty"),
        (KEY, 0o644, "accessible by group/other (mode 0644)"),
        (KEY, 0o640, "accessible by group/other (mode 0640)"),
        (KEY, 0o604, "accessible by group/other"),
        ("two words", 0o600, "whitespace or control characters"),
    ],
)
def test_key_file_refusals(serverargs_file, tmp_path, content, mode, needle):
    kf = tmp_path / "k"
    kf.write_text(content)
    kf.chmod(mode)
    r = run_launcher("--dry-run", "--api-key-file", kf, serverargs_file({"model_path": "/m"}))
    one_line_error(r, needle, str(kf))


def test_missing_key_file(serverargs_file, tmp_path):
    r = run_launcher("--api-key-file", tmp_path / "nope", serverargs_file({"model_path": "/m"}))
    one_line_error(r, "cannot read API key file", "No such file")


def test_key_file_that_is_a_directory(serverargs_file, tmp_path):
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    r = run_launcher("--api-key-file", d, serverargs_file({"model_path": "/m"}))
    one_line_error(r, "not a regular file")


# --------------------------------------------------------------------------- CLI refusals


def test_unknown_engine(serverargs_file):
    r = run_launcher("--engine", "vllm", serverargs_file({"model_path": "/m"}))
    one_line_error(r, "invalid choice: 'vllm'")


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must hold one JSON object"),
        ('"text"', "must hold one JSON object"),
        (b"\xff\xfe{}", "is not UTF-8"),
    ],
)
def test_bad_serverargs_file(tmp_path, content, needle):
    path = tmp_path / "prefill.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    one_line_error(run_launcher(path), needle)
    r = run_launcher("--check", path)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CANNOT CHECK: prefill.json: "), r.stdout
    assert needle in lines[0]


def test_unreadable_serverargs_file(tmp_path):
    one_line_error(run_launcher(tmp_path / "missing.json"), "cannot read", "No such file")
    one_line_error(run_launcher(tmp_path), "cannot read")  # a directory


def test_refused_key_in_exec_mode(serverargs_file):
    one_line_error(
        run_launcher(serverargs_file({"model_path": "/m", "api_key": "sk-1"})),
        "key 'api_key'",
        "--api-key-file",
    )


def test_exec_needs_exactly_one_file(serverargs_file):
    a = serverargs_file({"model_path": "/m"}, "a.json")
    b = serverargs_file({"model_path": "/m"}, "b.json")
    one_line_error(run_launcher(a, b), "exactly one FILE.json")


def test_check_without_sglang_cannot_run(serverargs_file, tmp_path):
    """exit 2 and one line when SGLang is not importable (a broken package shadows it)."""
    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("raise ImportError('no sglang here')\n")
    r = run_launcher("--check", serverargs_file({"model_path": "/m"}),
                     env={"_extra_path": [str(fake)]})
    assert r.returncode == 2
    assert r.stdout.strip() == (
        "CANNOT CHECK: prefill.json: SGLang is not importable here: ImportError: no sglang here"
    )
    assert "Traceback" not in r.stdout + r.stderr


# --------------------------------------------------------------------------- exec


FAKE_LAUNCH_SERVER = """
import json, os, sys
argv = sys.argv[1:]
config = argv[argv.index("--config") + 1] if "--config" in argv else None
with open(os.environ["PDNODE_TEST_OUT"], "w") as f:
    json.dump({"pid": os.getpid(), "argv": argv, "executable": sys.executable,
               "cmdline": open("/proc/self/cmdline", "rb").read().decode(),
               "config": open(config).read() if config else None}, f)
"""


def test_exec_replaces_the_process_and_keeps_the_key_off_the_command_line(
    serverargs_file, key_file, tmp_path
):
    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    (fake / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    out = tmp_path / "out.json"
    rundir = tmp_path / "run"
    rundir.mkdir()
    path = serverargs_file(
        {"model_path": "/m", "tp_size": 4, "enable_metrics": True,
         "disaggregation_ib_device": {"0": "mlx5_0"}}
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), str(fake)]),
               PDNODE_TEST_OUT=str(out), RUNTIME_DIRECTORY=str(rundir))
    p = subprocess.Popen(
        [sys.executable, "-m", "pdnode.node.launcher", "--api-key-file", str(key_file), str(path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr
    got = json.loads(out.read_text())
    assert got["pid"] == p.pid  # os.execve: systemd sees the server itself
    assert got["executable"] == sys.executable
    assert got["argv"] == [
        "--model-path", "/m", "--tp-size", "4", "--enable-metrics",
        "--disaggregation-ib-device", '{"0":"mlx5_0"}',
        "--config", str(rundir / "prefill.sglang-config.yaml"),
    ]
    assert KEY not in got["cmdline"] and KEY not in stdout + stderr
    assert yaml.safe_load(got["config"]) == {"api-key": KEY}


def test_sim_engine_dry_run(serverargs_file, key_file):
    path = serverargs_file({"model_path": "/m"})
    r = run_launcher("--engine", "sim", "--dry-run", "--api-key-file", key_file, path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [
        sys.executable, "-m", "pdnode.standin", str(path), "--api-key-file", str(key_file),
    ]


def test_sim_engine_applies_the_same_refusals(serverargs_file):
    one_line_error(
        run_launcher("--engine", "sim", serverargs_file({"model_path": "/m", "api_key": "x"})),
        "key 'api_key'",
    )


def test_dry_run_redacts_the_key_if_it_ever_shows_up(serverargs_file, tmp_path):
    # a key that happens to equal a value in the file is still never printed
    kf = tmp_path / "k"
    kf.write_text("deepseek-v3-secret")
    kf.chmod(0o600)
    path = serverargs_file({"model_path": "/m", "served_model_name": "deepseek-v3-secret"})
    r = run_launcher("--dry-run", "--api-key-file", kf, path, env={"RUNTIME_DIRECTORY": str(tmp_path)})
    assert r.returncode == 0
    assert "deepseek-v3-secret" not in r.stdout
    assert "<redacted>" in r.stdout


def test_launcher_imports_only_the_standard_library():
    code = (
        "import sys; before = set(sys.modules); import pdnode.node.launcher; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names) - {'pdnode'}))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(SRC)))
    assert r.stdout.strip() == "[]", r.stderr
