"""What the plan reads from a model's own files (pdnode.core.plan.model_facts), against
the config files of six real models (tests/fixtures/models): each fact is worked out by
hand from the model card's numbers, not by the code under test."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdnode.core.inventory.model_source import Lock, ManifestFile
from pdnode.core.plan import model_facts

MODELS = Path(__file__).parent / "fixtures" / "models"

# (directory, kind, KV bytes per token with a 16-bit cache, dtype, quantization)
CASES = [
    # 32 layers x 8 KV heads x head dim 4096/32=128 x (K and V) x 2 bytes
    ("meta-llama--Meta-Llama-3.1-8B", "dense", 32 * 8 * 128 * 2 * 2, "bfloat16", None),
    # the same attention as Llama's, 8 experts
    ("mistralai--Mixtral-8x7B-v0.1", "moe", 32 * 8 * 128 * 2 * 2, "bfloat16", None),
    # MLA: 61 layers x (latent 512 + rope key 64) x 2 bytes, one entry per token (no K/V pair)
    ("deepseek-ai--DeepSeek-V3", "moe_mla", 61 * (512 + 64) * 2, "bfloat16", "fp8"),
    # 48 layers x 4 KV heads x 128 x 2 x 2
    ("Qwen--Qwen3-30B-A3B-FP8", "moe", 48 * 4 * 128 * 2 * 2, "bfloat16", "fp8"),
    # 94 layers x 4 KV heads x 128 x 2 x 2; NVFP4 stated by hf_quant_config.json only
    ("nvidia--Qwen3-235B-A22B-NVFP4", "moe", 94 * 4 * 128 * 2 * 2, "bfloat16", "modelopt_fp4"),
    # 24 layers x 8 KV heads x head dim 64 x 2 x 2; its config names no torch_dtype
    ("openai--gpt-oss-20b", "moe", 24 * 8 * 64 * 2 * 2, None, "mxfp4"),
]


@pytest.mark.parametrize(("name", "kind", "kv", "dtype", "quant"), CASES, ids=[c[0] for c in CASES])
def test_facts_of_real_models(name, kind, kv, dtype, quant):
    facts = model_facts.read(MODELS / name)
    assert (facts.kind, facts.kv_bytes_per_token, facts.dtype, facts.quantization) == (kind, kv, dtype, quant)


def test_the_weights_come_from_the_lock_when_given():
    lock = Lock("hf://o/m@main", "o/m", "main", "a" * 40, (
        ManifestFile("config.json", 900, None), ManifestFile("model-1.safetensors", 5_000_000_000, "b" * 64),
        ManifestFile("model-2.safetensors", 3_000_000_000, "c" * 64), ManifestFile("tokenizer.json", 7, None)))
    facts = model_facts.read(MODELS / "meta-llama--Meta-Llama-3.1-8B", lock)
    assert facts.weight_bytes == 8_000_000_000
    assert "2 *.safetensors files" in facts.weight_source and "aaaaaaaaaaaa" in facts.weight_source


def test_without_a_lock_the_index_total_is_the_weight(tmp_path):
    (tmp_path / "config.json").write_text((MODELS / "mistralai--Mixtral-8x7B-v0.1" / "config.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 93405585408}}')
    assert model_facts.read(tmp_path).weight_bytes == 93405585408


def test_a_directory_without_config_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="config.json is missing"):
        model_facts.read(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        model_facts.read(tmp_path)


def _facts(name):
    return model_facts.read(MODELS / name)


def test_a_typed_kind_that_contradicts_the_files_is_named_with_both():
    found = model_facts.contradictions(_facts("deepseek-ai--DeepSeek-V3"), {"pdnode_model_kind": "dense"}, "X@1")
    assert len(found) == 1
    field, value, why, fix = found[0]
    assert (field, value) == ("pdnode_model_kind", "dense")
    assert "DeepseekV3ForCausalLM is moe_mla" in why and "X@1" in why and "moe_mla" in fix


def test_typed_facts_that_agree_are_not_refused():
    facts = _facts("Qwen--Qwen3-30B-A3B-FP8")
    assert model_facts.contradictions(facts, {"pdnode_model_kind": "moe", "pdnode_model_kv_bytes_per_token": 98304,
                                              "pdnode_model_weights_gb": None}, "w") == []
    # an 8-bit KV cache halves it: also what the files allow
    assert model_facts.contradictions(facts, {"pdnode_model_kv_bytes_per_token": 49152}, "w") == []


def test_a_typed_size_off_by_more_than_the_tolerance_is_refused():
    lock = Lock("hf://o/m", "o/m", "main", "a" * 40, (ManifestFile("m.safetensors", 100_000_000_000, "b" * 64),))
    facts = model_facts.read(MODELS / "meta-llama--Meta-Llama-3.1-8B", lock)
    assert model_facts.contradictions(facts, {"pdnode_model_weights_gb": 104.0}, "w") == []
    [(field, value, why, _)] = model_facts.contradictions(facts, {"pdnode_model_weights_gb": 106.0}, "w")
    assert (field, value) == ("pdnode_model_weights_gb", 106.0) and "100.0 GB" in why
    [(field, _, why, _)] = model_facts.contradictions(facts, {"pdnode_model_kv_bytes_per_token": 1000}, "w")
    assert field == "pdnode_model_kv_bytes_per_token" and "131072" in why


def test_kind_needs_more_than_one_expert_and_a_positive_latent():
    assert model_facts.kind_of({"num_local_experts": 1, "kv_lora_rank": 0}) == "dense"
    assert model_facts.kind_of({"n_routed_experts": 8, "kv_lora_rank": None}) == "moe"
    assert model_facts.kind_of({"text_config": {"num_experts": 4, "kv_lora_rank": 64}}) == "moe_mla"
    assert model_facts.kind_of({"n_routed_experts": True}) == "dense"  # a bool is not a count
