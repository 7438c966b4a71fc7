"""pdnode_model_source's forms, the lock file, and the plan's model section
(pdnode.core.inventory.model_source, pdnode.core.plan.model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from planvars import changed

from pdnode.core.inventory import model_source
from pdnode.core.inventory.model_source import Lock, ManifestFile, SourceError
from pdnode.core.plan.build import PlanError, build_plan

MODELS = Path(__file__).parent / "fixtures" / "models"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(("text", "repo", "revision"), [
    ("hf://Qwen/Qwen3-8B@main", "Qwen/Qwen3-8B", "main"),
    ("hf://Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "main"),
    ("hf://gpt2@v1.0", "gpt2", "v1.0"),
    ("hf://deepseek-ai/DeepSeek-V3@refs/pr/12", "deepseek-ai/DeepSeek-V3", "refs/pr/12"),
    (f"hf://o/m@{COMMIT}", "o/m", COMMIT),
])
def test_hf_sources(text, repo, revision):
    s = model_source.parse(text)
    assert (s.scheme, s.repo, s.revision) == ("hf", repo, revision)


@pytest.mark.parametrize("text", [
    "hf://", "hf://a/b/c", "hf://-a/b", "hf://a--b/c", "hf://a/b@", "hf://a/b@x y", "hf://a/b@../x",
    "hf://a/b@x;rm", "local://relative/path", "s3://bucket/model", "/models/x", "hf://a/b..c",
])
def test_refused_sources_say_why_and_the_fix(text):
    with pytest.raises(SourceError) as exc:
        model_source.parse(text)
    assert exc.value.why and exc.value.fix and "\n" not in str(exc.value)


def test_local_source_is_a_path():
    s = model_source.parse("local:///models/Qwen3-8B/")
    assert (s.scheme, s.path) == ("local", "/models/Qwen3-8B")


@pytest.mark.parametrize(("url", "ok"), [
    ("https://hf-mirror.example.internal", True), ("http://127.0.0.1:8090", True), ("http://[::1]:80/hf", True),
    ("https://user:pw@mirror.example", False), ("https://m.example/?x=1", False), ("ftp://m.example", False),
    ("https://m.example/a b", False),
])
def test_endpoints(url, ok):
    if ok:
        model_source.check_endpoint(url)
    else:
        with pytest.raises(SourceError):
            model_source.check_endpoint(url)


def _lock(source="hf://org/tiny@main", commit=COMMIT) -> Lock:
    return Lock(source, "org/tiny", "main", commit, (
        ManifestFile("config.json", 120, None), ManifestFile("model.safetensors", 16_000_000_000, "a" * 64)))


def test_the_lock_text_reads_back_and_lists_a_file_per_line(tmp_path):
    path = tmp_path / ".model.lock.json"
    path.write_text(_lock().text())
    assert model_source.read_lock(path) == _lock()
    lines = path.read_text().splitlines()
    assert sum('"path":' in line for line in lines) == 2


@pytest.mark.parametrize("broken", [
    {"format": "other"}, {"commit": "abc"}, {"files": []},
    {"files": [{"path": "../etc/passwd", "size": 1, "sha256": None}]},
    {"files": [{"path": "a", "size": -1, "sha256": None}]},
    {"files": [{"path": "a", "size": 1, "sha256": "xyz"}]},
    {"files": [{"path": "a", "size": 1, "sha256": None}, {"path": "a", "size": 2, "sha256": None}]},
])
def test_a_broken_lock_is_refused_with_the_fix(tmp_path, broken):
    doc = {**_lock().as_dict(), **broken}
    path = tmp_path / ".model.lock.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SourceError, match="pdnode model lock"):
        model_source.read_lock(path)


# --- the plan's model section -------------------------------------------------------------

@pytest.fixture
def hf_inventory(tmp_path, monkeypatch, gpu01_vars):
    """gpu01 naming an hf:// DeepSeek-V3, its lock in tmp_path and its config in the cache."""
    monkeypatch.setenv("PDNODE_CACHE_DIR", str(tmp_path / "cache"))
    lock = Lock("hf://deepseek-ai/DeepSeek-V3@main", "deepseek-ai/DeepSeek-V3", "main", COMMIT,
                (ManifestFile("config.json", 1700, None),
                 *(ManifestFile(f"model-{i:05d}-of-00163.safetensors", 1_000_000_000, f"{i:064x}")
                   for i in range(1, 164))))
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / ".model.lock.json").write_text(lock.text())
    cache = model_source.cache_path(lock.repo, lock.commit)
    cache.mkdir(parents=True)
    shutil.copy(MODELS / "deepseek-ai--DeepSeek-V3" / "config.json", cache / "config.json")
    v = changed(gpu01_vars, {"pdnode_model_source": "hf://deepseek-ai/DeepSeek-V3@main", "pdnode_model_kind": None,
                             "pdnode_model_weights_gb": None, "pdnode_model_controller_path": None})
    return v, str(tmp_path / "inv"), lock


def _problems(v, where):
    with pytest.raises(PlanError) as exc:
        build_plan(v, "gpu01", None, where)
    return {(p.rule_id, p.field): p for p in exc.value.problems}


def test_the_plan_reads_the_kind_and_size_from_the_files(hf_inventory):
    v, where, lock = hf_inventory
    plan = build_plan(v, "gpu01", None, where)
    assert plan.model["commit"] == COMMIT and plan.model["files"] == 164
    assert plan.model["facts"]["kind"] == "moe_mla"
    assert plan.model["facts"]["weight_bytes"] == 163 * 1_000_000_000
    assert plan.settings["pdnode_model_kind"] == "moe_mla"


def test_a_typed_kind_the_files_contradict_is_refused(hf_inventory):
    v, where, _ = hf_inventory
    found = _problems(changed(v, {"pdnode_model_kind": "dense"}), where)
    p = found[("model-fact-contradicts-files", "pdnode_model_kind")]
    assert "moe_mla" in p.rule and "deepseek-ai/DeepSeek-V3@0123456789ab" in p.rule


def test_a_lock_for_another_revision_is_stale(hf_inventory):
    v, where, _ = hf_inventory
    found = _problems(changed(v, {"pdnode_model_source": "hf://deepseek-ai/DeepSeek-V3@v2"}), where)
    assert "pdnode model lock" in found[("model-lock-stale", "pdnode_model_source")].fix


def test_without_a_lock_the_plan_says_how_to_write_it(hf_inventory, tmp_path):
    v, _, _ = hf_inventory
    (tmp_path / "empty").mkdir()
    found = _problems(v, str(tmp_path / "empty"))
    assert "does not exist" in found[("model-lock-missing", "pdnode_model_source")].rule
    # and with no facts the kind is needed
    assert ("model-kind-needed", "pdnode_model_kind") in found


def test_without_the_cache_the_typed_facts_stand_with_a_warning(hf_inventory, tmp_path):
    v, where, lock = hf_inventory
    shutil.rmtree(model_source.cache_path(lock.repo, lock.commit))
    plan = build_plan(changed(v, {"pdnode_model_kind": "moe_mla"}), "gpu01", None, where)
    assert "facts" not in plan.model
    assert [w.rule_id for w in plan.warnings if w.rule_id.startswith("model-")] == ["model-cache-missing"]


def test_a_local_source_must_name_the_model_path(gpu01_vars):
    v = changed(gpu01_vars, {"pdnode_model_source": "local:///models/other"})
    found = _problems(v, None)
    assert gpu01_vars["pdnode_model_path"] in found[("model-source-local-path", "pdnode_model_source")].fix
    plan = build_plan(changed(gpu01_vars, {"pdnode_model_source": f"local://{gpu01_vars['pdnode_model_path']}"}),
                      "gpu01", None, None)
    assert plan.model["scheme"] == "local" and "commit" not in plan.model


def test_no_source_no_model_section(gpu01_vars):
    assert build_plan(gpu01_vars, "gpu01").model == {}


def test_the_kind_is_needed_without_a_source(gpu01_vars):
    found = _problems(changed(gpu01_vars, {"pdnode_model_kind": None}), None)
    assert ("model-kind-needed", "pdnode_model_kind") in found
