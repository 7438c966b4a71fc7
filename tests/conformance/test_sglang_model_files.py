"""SGLang judges the model's own files (issue 44): with an hf:// source pinned by its lock,
`pdnode check` hands SGLang's validation the commit's config files from the controller's
cache as the model, so a quantization argument the checkpoint contradicts is refused with
SGLang's own reason, before any GPU hour (the checkpoint here: Qwen3-30B-A3B-FP8's own
config.json, tests/fixtures/models)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdnode.core.inventory.model_source import Lock, ManifestFile, cache_path

pytestmark = pytest.mark.conformance

REPO = Path(__file__).resolve().parents[2]
FP8_MODEL = REPO / "tests" / "fixtures" / "models" / "Qwen--Qwen3-30B-A3B-FP8"
COMMIT = "5" * 40


def _inventory(tmp: Path, quantization: str | None) -> Path:
    inv = tmp / f"inv-{quantization}"
    shutil.copytree(REPO / "inventories" / "gpu01", inv)
    hv = yaml.safe_load((inv / "group_vars" / "all" / "topology.yml").read_text())
    prefill = hv["pdnode_prefill_instances"]
    if quantization:
        prefill[0]["extra_args"] = {**(prefill[0].get("extra_args") or {}), "quantization": quantization}
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu01.yml").write_text(yaml.safe_dump({
        "pdnode_prefill_instances": prefill, "pdnode_model_source": "hf://Qwen/Qwen3-30B-A3B-FP8@main",
        "pdnode_model_kind": None, "pdnode_model_weights_gb": None}))
    lock = Lock("hf://Qwen/Qwen3-30B-A3B-FP8@main", "Qwen/Qwen3-30B-A3B-FP8", "main", COMMIT,
                (ManifestFile("config.json", 1000, None), ManifestFile("model.safetensors", 31_000_000_000, "e" * 64)))
    (inv / ".model.lock.json").write_text(lock.text())
    return inv


@pytest.fixture(scope="module")
def env(sglang_env, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    target = cache_path("Qwen/Qwen3-30B-A3B-FP8", COMMIT, cache / "models")
    target.mkdir(parents=True)
    shutil.copy(FP8_MODEL / "config.json", target / "config.json")
    return {**os.environ, "PDNODE_CACHE_DIR": str(cache), "PDNODE_SGLANG_VALIDATOR": str(sglang_env)}


def _check(inv: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "check", "--json", str(inv)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=900)


def test_awq_asked_of_an_fp8_checkpoint_is_refused_with_sglangs_reason(env, tmp_path):
    r = _check(_inventory(tmp_path, "awq"), env)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and [p["rule"] for p in report["problems"]] == ["sglang-rejects"], r.stdout
    assert ("Quantization method specified in the model config (fp8) does not match the quantization method "
            "specified in the `quantization` argument (awq)") in report["problems"][0]["message"]


def test_the_checkpoints_own_quantization_is_accepted(env, tmp_path):
    r = _check(_inventory(tmp_path, "fp8"), env)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], r.stdout
