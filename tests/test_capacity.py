"""pdnode.capacity: do the weights fit each instance's GPUs?

Model sizes: DeepSeek-V3's 671,026,419,200 is the main model's parameter count (issue 10)
at 1 byte per FP8 weight; the published checkpoint also holds the MTP layer and BF16
embeddings, so the real index is larger, which only strengthens the refusal. The
config.json values are the models' published configs; the parameter counts they are
compared with are the ones the model cards publish (671B, 8.03B, 235B, 46.7B).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdnode.core.rules import capacity
from pdnode.core.rules.capacity import (Finding, WeightsError, check_instances, estimate_parameters, gpu_memory_mib,
                             smallest_tp, weight_bytes, weight_bytes_from_dir)

DSV3_BYTES = 671_026_419_200
QWEN3_235B_FP8_BYTES = 236_000_000_000  # ~236 GB: 235B parameters at 1 byte, plus BF16 embeddings
DSV3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "num_hidden_layers": 61, "vocab_size": 129280, "num_attention_heads": 128, "num_key_value_heads": 128,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
LLAMA31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 128256,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
QWEN3_235B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 94, "vocab_size": 151936,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def model_dir(tmp_path: Path, config: dict | None, total_size: int | None = None, index_text: str | None = None,
              name: str = "model") -> Path:
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if index_text is not None:
        (d / "model.safetensors.index.json").write_text(index_text)
    elif total_size is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total_size}, "weight_map": {"model.embed_tokens.weight": "a.safetensors"}}))
    return d


def instance(tp: int = 4, dp: int = 1, mfs: float | None = 0.85, role: str = "prefill", i: int = 0) -> dict:
    return {"field": f"pdnode_{role}_instances[{i}]", "id": f"{role}-{i}", "tp_size": tp, "dp_size": dp,
            "gpus": list(range(tp * dp)), "mem_fraction_static": mfs}


def line(f: Finding) -> str:
    """As the plan's Problem prints it."""
    return f"{f.field}={f.value}: {f.rule}. Fix: {f.fix}."


# --- the refusal and the acceptance ------------------------------------------------------

def test_deepseek_v3_fp8_on_one_4xh200_instance_is_refused_with_the_smallest_tp(tmp_path):
    d = model_dir(tmp_path, DSV3_CONFIG, DSV3_BYTES)
    got, source = weight_bytes({"pdnode_model_controller_path": str(d)}, tmp_path)
    assert (got, source) == (DSV3_BYTES, f"{d}/model.safetensors.index.json metadata.total_size")
    findings = check_instances([instance(4)], "NVIDIA H200", got, source, gpu_count=8)
    assert [line(f) for f in findings] == [
        f"pdnode_prefill_instances[0].tp_size=4: prefill-0 holds 167.8 GB of weights per GPU (671.0 GB from {d}/"
        "model.safetensors.index.json metadata.total_size / tp_size 4), more than the 115.3 GB per GPU left for "
        "weights (NVIDIA H200: 150.8 GB x mem_fraction_static 0.85 = 128.1 GB, less 12.8 GB kept for the KV "
        "cache). Fix: tp_size: 8 with 8 GPUs in gpus (83.9 GB per GPU), or a smaller or more quantised model."]
    assert findings[0].severity == "error"


def test_qwen3_235b_fp8_fits_the_same_instance(tmp_path):
    d = model_dir(tmp_path, QWEN3_235B_CONFIG | {"quantization_config": {"quant_method": "fp8"}},
                  QWEN3_235B_FP8_BYTES)
    got, source = weight_bytes({"pdnode_model_controller_path": str(d)}, tmp_path)
    assert check_instances([instance(4)], "NVIDIA H200", got, source, gpu_count=8) == []


def test_every_instance_is_judged_on_its_own(tmp_path):
    # 8 x H200 host, DeepSeek-V3: prefill on 4 GPUs fails, decode on 8 fits; a tighter
    # mem_fraction_static makes the 8-GPU decode fail too (83.9 GB > 0.6 x 150.8 - 9.0).
    found = check_instances([instance(4), instance(8, role="decode"), instance(8, mfs=0.6, role="decode", i=1)],
                            "NVIDIA H200", DSV3_BYTES, "x", gpu_count=8)
    assert [f.field for f in found] == ["pdnode_prefill_instances[0].tp_size", "pdnode_decode_instances[1].tp_size"]
    assert "no tp_size up to the host's 8 GPUs fits" in found[1].fix


def test_fixes_that_fit_alone_but_not_together_get_one_line_for_the_host():
    # DeepSeek-V3 on 4 + 4 H200s: each instance needs TP 8, 16 GPUs in all on an 8-GPU host
    found = check_instances([instance(4), instance(4, role="decode")], "NVIDIA H200", DSV3_BYTES, "x", gpu_count=8)
    assert [f.field for f in found] == ["pdnode_prefill_instances[0].tp_size", "pdnode_decode_instances[0].tp_size",
                                        "pdnode_gpu_count"]
    assert line(found[2]) == (
        "pdnode_gpu_count=8: with each instance at the smallest tp_size that holds the weights, the instances need "
        "16 GPUs (prefill-0 8, decode-0 8), more than the host has. Fix: a smaller or more quantised model, or GPUs "
        "with more memory (a PD node runs at least one prefill and one decode instance).")
    # on a 16-GPU host the two fixes fit together: no host line
    assert len(check_instances([instance(4), instance(4, role="decode")], "NVIDIA H200", DSV3_BYTES, "x",
                               gpu_count=16)) == 2
    # 400 GB: both TP-2 prefill instances need TP 4; the decode instance fits on its own 4 GPUs;
    # 4 + 4 + 4 = 12 > 8, and with three instances "fewer instances" is a fix
    found = check_instances([instance(2), instance(2, i=1), instance(4, role="decode")], "NVIDIA H200",
                            400 * 10**9, "x", gpu_count=8)
    assert found[-1].rule.endswith("the instances need 12 GPUs (prefill-0 4, prefill-1 4, decode-0 4), more than "
                                   "the host has")
    assert found[-1].fix.startswith("fewer instances, ")


def test_the_fix_is_the_smallest_tp_that_fits_and_respects_replicas_and_the_host():
    budget = 143771 * capacity.MIB * 0.85
    assert [smallest_tp(gb * 10**9, budget) for gb in (50, 200, 400, 671, 1000)] == [1, 2, 4, 8, 16]
    assert smallest_tp(1000 * 10**9, budget, max_tp=8) is None
    # two replicas of TP 2 (300 GB: 150 GB per GPU): TP 4 fits but needs 2 x 4 GPUs,
    # which an 8-GPU host has and a 4-GPU host does not
    found = check_instances([instance(2, dp=2)], "NVIDIA H200", 300 * 10**9, "x", gpu_count=8)
    assert found[0].fix == ("tp_size: 4 with 8 GPUs (2 replicas of 4) in gpus (75.0 GB per GPU), or a smaller or "
                            "more quantised model")
    found = check_instances([instance(2, dp=2)], "NVIDIA H200", 300 * 10**9, "x", gpu_count=4)
    assert found[0].fix.startswith("no tp_size up to the host's 4 GPUs fits")


def test_kv_room_is_ten_percent_of_the_budget_with_a_2_gib_floor():
    assert capacity.kv_room(100e9) == pytest.approx(10e9)
    assert capacity.kv_room(10e9) == 2 * capacity.GIB
    # right at the edge: weights that leave exactly the KV room pass, one byte more fails
    budget = 81559 * capacity.MIB * 0.9
    edge = int(budget - capacity.kv_room(budget))
    assert check_instances([instance(1, mfs=0.9)], "NVIDIA H100 80GB HBM3", edge, "x") == []
    assert len(check_instances([instance(1, mfs=0.9)], "NVIDIA H100 80GB HBM3", edge + 1, "x")) == 1


def test_unknown_gpu_is_a_warning_that_says_how_to_add_it():
    found = check_instances([instance(4)], "NVIDIA H100 PCIe", DSV3_BYTES, "x")
    assert found == [Finding(
        "pdnode_gpu_model", "NVIDIA H100 PCIe",
        "is not in src/pdnode/data/gpu-memory.json, so whether the model's weights (671.0 GB) fit each instance "
        "was not checked",
        "add it with the memory.total (MiB) that `nvidia-smi --query-gpu=name,memory.total --format=csv` prints "
        "on the host (docs/capacity.md), or correct pdnode_gpu_model", "warning")]


def test_no_weights_no_check():
    assert check_instances([instance(1)], "NVIDIA H200", None) == []
    assert weight_bytes({}, Path("/")) is None
    assert weight_bytes({"pdnode_model_weights_gb": None, "pdnode_model_controller_path": None}, Path("/")) is None


# --- the table -------------------------------------------------------------------------

def test_table_names_are_what_nvidia_smi_prints_and_every_entry_says_where_it_comes_from():
    raw = json.loads(capacity.GPU_TABLE.read_text())
    assert raw["gpus"], "empty table"
    for name, entry in raw["gpus"].items():
        assert name.startswith("NVIDIA "), name
        assert isinstance(entry["memory_total_mib"], int) and entry["memory_total_mib"] > 10000, name
        assert len(entry["_source"]) > 20, name
    # the H200 entry agrees with this repository's real capture
    capture = (Path(__file__).parent / "fixtures/nvidia-smi/h200-2gpu/query-gpu.txt").read_text()
    assert "NVIDIA H200, GPU-" in capture and f", {gpu_memory_mib('NVIDIA H200')} MiB," in capture


def test_table_lookup_ignores_case_only():
    assert gpu_memory_mib("nvidia h200") == gpu_memory_mib("NVIDIA H200") == 143771
    assert gpu_memory_mib("NVIDIA H200 (stand-in)") is None and gpu_memory_mib(None) is None


# --- where the weights come from ----------------------------------------------------------

def test_weights_gb_wins_over_the_directory(tmp_path):
    d = model_dir(tmp_path, DSV3_CONFIG, DSV3_BYTES)
    assert weight_bytes({"pdnode_model_weights_gb": 236.5, "pdnode_model_controller_path": str(d)}, tmp_path) == (
        236_500_000_000, "pdnode_model_weights_gb 236.5")


def test_relative_controller_path_is_relative_to_the_repo_root(tmp_path):
    model_dir(tmp_path, None, 123_456_789, name="m")
    assert weight_bytes({"pdnode_model_controller_path": "m"}, tmp_path)[0] == 123_456_789


def test_without_an_index_the_safetensors_files_are_summed(tmp_path):
    d = model_dir(tmp_path, LLAMA31_8B_CONFIG)
    (d / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"x" * 234)
    assert weight_bytes_from_dir(d) == (1234, f"2 *.safetensors files in {d}")


@pytest.mark.parametrize(("config", "published"), [
    (DSV3_CONFIG, 671e9), (LLAMA31_8B_CONFIG, 8.03e9), (QWEN3_235B_CONFIG, 235e9), (MIXTRAL_CONFIG, 46.7e9)],
    ids=["deepseek-v3-mla-moe", "llama-3.1-8b-dense", "qwen3-235b-moe", "mixtral-8x7b"])
def test_config_estimate_is_within_two_percent_of_the_published_parameter_count(config, published):
    params, _ = estimate_parameters(config)
    assert abs(params - published) / published < 0.02, params


def test_config_estimate_bytes_use_the_dtype_and_fp8_quantisation(tmp_path):
    b, source = weight_bytes_from_dir(model_dir(tmp_path, DSV3_CONFIG, name="dsv3"))
    # 669.2B FP8 weights at 1 byte + 1.85B BF16 embedding/LM-head parameters at 2 bytes
    assert 672e9 < b < 674e9
    assert source == f"an estimate from {tmp_path}/dsv3/config.json: 671.0B parameters x 1 byte (fp8)"
    b, source = weight_bytes_from_dir(model_dir(tmp_path, LLAMA31_8B_CONFIG, name="llama"))
    assert b == 2 * estimate_parameters(LLAMA31_8B_CONFIG)[0]
    assert source.endswith("8.0B parameters x 2 bytes (bfloat16)")


def test_multimodal_text_config_is_read():
    nested = {"architectures": ["X"], "text_config": LLAMA31_8B_CONFIG}
    assert estimate_parameters(nested) == estimate_parameters(LLAMA31_8B_CONFIG)


# --- bad input: one clear line, never a traceback -----------------------------------------

@pytest.mark.parametrize(("index_text", "message"), [
    ("{not json", "model.safetensors.index.json is not JSON (Expecting property name enclosed in double quotes "
                  "at line 1)"),
    ('{"weight_map": {}}', "model.safetensors.index.json has no positive integer metadata.total_size (got None)"),
    ('{"metadata": {"total_size": "671GB"}}', "has no positive integer metadata.total_size (got '671GB')"),
    ('{"metadata": {"total_size": -5}}', "has no positive integer metadata.total_size (got -5)"),
    ('{"metadata": []}', "has no positive integer metadata.total_size (got None)"),
    ("[1, 2]", "has no positive integer metadata.total_size (got None)"),
])
def test_garbage_index_is_one_clean_line_naming_the_field(tmp_path, index_text, message):
    d = model_dir(tmp_path, DSV3_CONFIG, index_text=index_text)
    with pytest.raises(WeightsError) as info:
        weight_bytes({"pdnode_model_controller_path": str(d)}, tmp_path)
    exc = info.value
    assert exc.field == "pdnode_model_controller_path" and exc.value == str(d)
    assert message in exc.rule and "\n" not in str(exc)
    assert exc.fix == ("point it at a copy of the model's config.json and model.safetensors.index.json, or set "
                       "pdnode_model_weights_gb")


def test_binary_index_and_bad_config_are_clean_lines(tmp_path):
    d = model_dir(tmp_path, None, name="bin")
    (d / "model.safetensors.index.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=r"model.safetensors.index.json is not UTF-8 text$"):
        weight_bytes_from_dir(d)
    d = model_dir(tmp_path, {"hidden_size": "big", "num_hidden_layers": 2}, name="cfg")
    with pytest.raises(ValueError, match=r"config.json: hidden_size is .big., not an integer from 0 to 10000000"):
        weight_bytes_from_dir(d)
    d = model_dir(tmp_path, LLAMA31_8B_CONFIG | {"quantization_config": {"quant_method": "hqq"}}, name="q")
    with pytest.raises(ValueError, match="quant_method 'hqq' is not one this estimate knows .*pdnode_model_weights_gb"):
        weight_bytes_from_dir(d)


@pytest.mark.parametrize("value", [0, -3, True, "671", float("nan"), float("inf")])
def test_bad_weights_gb_names_the_field(value):
    with pytest.raises(WeightsError) as info:
        weight_bytes({"pdnode_model_weights_gb": value}, Path("/"))
    assert info.value.field == "pdnode_model_weights_gb" and info.value.rule == "is not a positive number of GB (1e9 bytes)"


def test_missing_or_empty_directory_names_the_field(tmp_path):
    with pytest.raises(WeightsError, match="is not a directory"):
        weight_bytes({"pdnode_model_controller_path": "nope"}, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError) as info:
        weight_bytes({"pdnode_model_controller_path": "empty"}, tmp_path)
    assert info.value.rule == (f"{tmp_path}/empty has no model.safetensors.index.json, no *.safetensors and no "
                               "config.json")


def test_absurd_config_values_are_refused_not_computed():
    """A broken config.json with 1e12 layers must fail fast (the layer loop would never end)."""
    with pytest.raises(ValueError, match=r"num_hidden_layers is 1000000000000, not an integer from 0 to 10000000"):
        estimate_parameters(DSV3_CONFIG | {"num_hidden_layers": 10**12})
    with pytest.raises(ValueError, match=r"mlp_only_layers is 'all', not a list of layer numbers"):
        estimate_parameters(QWEN3_235B_CONFIG | {"mlp_only_layers": "all"})
    with pytest.raises(ValueError, match=r"n_routed_experts is 'many'"):
        estimate_parameters(DSV3_CONFIG | {"n_routed_experts": "many"})
