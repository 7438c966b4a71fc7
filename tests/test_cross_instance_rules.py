"""Rules across a layout's instances that SGLang cannot check itself, one process seeing
none of its peers (issue 28, docs/field-failures.md row 9): attention TP sizes of a
non-MLA model that do not divide one another, and HiCache on a prefill beside HiSparse
on a decode. Each is refused where the pin breaks and accepted where it does not."""

from __future__ import annotations

import pytest
from planvars import changed

from pdnode.core.rules.instances import Instance, attention_tp
from pdnode.core.plan.build import PlanError, build_plan


def problems(variables: dict) -> list:
    try:
        return build_plan(variables).warnings
    except PlanError as exc:
        return exc.problems


def ids(variables: dict) -> list[str]:
    return [p.rule_id for p in problems(variables)]


def instance(tp_size: int, dp_size: int = 1, attn_dp_size: int = 1) -> Instance:
    return Instance(role="decode", index=0, name="0", gpus=list(range(tp_size * dp_size)), tp_size=tp_size,
                    dp_size=dp_size, attn_dp_size=attn_dp_size, ep_size=None, moe_dense_tp_size=None,
                    enable_dp_lm_head=False, port=None, bootstrap_port=None, nccl_port=None, mem_fraction_static=0.8)


@pytest.mark.parametrize(("sizes", "want"), [
    ({"tp_size": 4}, 4),
    ({"tp_size": 4, "attn_dp_size": 4}, 1),
    ({"tp_size": 4, "attn_dp_size": 2}, 2),
    ({"tp_size": 1, "dp_size": 2}, 1),  # each DP replica is its own TP group
])
def test_attention_tp_is_tp_over_the_attention_dp_size(sizes, want):
    assert attention_tp(instance(**sizes)) == want


def test_gpu01_prefill_4_against_decode_1_divides_and_is_accepted_without_a_line(gpu01_vars):
    assert gpu01_vars["pdnode_model_kind"] == "moe"  # GQA attention: the rule applies
    assert ids(gpu01_vars) == []


@pytest.mark.parametrize(("kind", "refused"), [("moe", True), ("dense", True), ("moe_mla", False)])
def test_attention_tp_that_does_not_divide_is_refused_for_a_non_mla_model_only(gpu01_vars, kind, refused):
    v = changed(gpu01_vars, {"pdnode_model_kind": kind, "prefill[0]": {"gpus": [0, 1, 2], "tp_size": 3},
                             "decode[0]": {"attn_dp_size": 2, "ep_size": None, "moe_dense_tp_size": None}
                             if kind == "dense" else {"attn_dp_size": 2}})
    got = problems(v)
    assert ("disagg-attn-tp-divides" in [p.rule_id for p in got]) == refused, [str(p) for p in got]
    if refused:
        (line,) = [str(p) for p in got if p.rule_id == "disagg-attn-tp-divides"]
        assert line.startswith("pdnode_decode_instances[0].tp_size=4: ") and "attention TP 2" in line
        assert "prefill-0's 3" in line and "Fix: " in line


def test_each_decode_is_named_once_against_the_first_prefill_it_does_not_divide(gpu01_vars):
    v = changed(gpu01_vars, {
        "pdnode_prefill_instances": [{"gpus": [0, 1, 2], "tp_size": 3}, {"gpus": [3], "tp_size": 1}],
        "pdnode_decode_instances": [{"gpus": [4, 5], "tp_size": 2}, {"gpus": [6, 7], "tp_size": 2}]})
    lines = [str(p) for p in problems(v) if p.rule_id == "disagg-attn-tp-divides"]
    assert [ln.split(":")[0] for ln in lines] == ["pdnode_decode_instances[0].tp_size=2",
                                                  "pdnode_decode_instances[1].tp_size=2"], lines


@pytest.mark.parametrize(("prefill", "decode", "refused"), [
    ({"enable_hierarchical_cache": True}, {"enable_hisparse": True}, True),
    ({"enable_hierarchical_cache": True}, {}, False),
    ({}, {"enable_hisparse": True}, False),
    ({"enable_hierarchical_cache": False}, {"enable_hisparse": True}, False),
])
def test_hicache_prefill_beside_hisparse_decode_is_refused(gpu01_vars, prefill, decode, refused):
    v = changed(gpu01_vars, {"prefill[0]": {"extra_args": prefill}, "decode[0]": {"extra_args": decode}})
    got = problems(v)
    hit = [str(p) for p in got if p.rule_id == "disagg-hicache-hisparse"]
    assert bool(hit) == refused, [str(p) for p in got]
    if refused:
        assert hit[0].startswith("pdnode_decode_instances[0].extra_args.enable_hisparse=True: ")
        assert "prefill-0" in hit[0] and "sglang#26092" in hit[0]


MXFP8 = {"extra_args": {"kv_cache_dtype": "mxfp8"}}


# Row 13: the pin slices KV heads, sliding-window and Mamba state between attention TP
# sizes, not the MXFP8 KV cache's block scales (tests/conformance/test_pinned_fixes.py).
@pytest.mark.parametrize(("kind", "decode", "dtype", "refused"), [
    ("moe", {}, "mxfp8", True),  # gpu01: prefill attention TP 4, decode 1
    ("dense", {"attn_dp_size": 1, "dp_size": 1, "ep_size": None, "moe_dense_tp_size": None,
               "enable_dp_lm_head": False}, "mxfp8", False),  # 4 against 4
    ("moe_mla", {}, "mxfp8", False),  # the latent is whole on every rank
    ("moe", {}, "fp8_e4m3", False),  # no block scales
])
def test_block_scaled_kv_at_different_attention_tp_is_refused_for_a_non_mla_model(gpu01_vars, kind, decode, dtype,
                                                                                   refused):
    args = {"extra_args": {"kv_cache_dtype": dtype}}
    v = changed(gpu01_vars, {"pdnode_model_kind": kind, "prefill[0]": args, "decode[0]": {**decode, **args}})
    got = problems(v)
    hit = [str(p) for p in got if p.rule_id == "disagg-attn-tp-block-scaled-kv"]
    assert len(hit) == int(refused), [str(p) for p in got]
    if refused:
        assert hit[0].startswith("pdnode_decode_instances[0].tp_size=4: gives decode-0 attention TP 1 against "
                                 "prefill-0's 4 with kv_cache_dtype mxfp8"), hit[0]
        assert "BLOCK_SCALE" in hit[0] and "Fix: " in hit[0]
