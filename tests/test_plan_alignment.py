"""What the plan accepts, aligned with SGLang 0.5.23's own verdicts (issue 10, item 2).

One test per case users met: the plan refused what SGLang runs, or said six lines for
one cause. SGLang's verdict on the same ServerArgs is in
tests/conformance/test_plan_conformance.py (run with `-m conformance`); port allocation
for 2P1D, 1P2D, 4P4D and prefill DP attention is in tests/test_ports.py, the retired
one-instance variables in tests/test_fields.py.
"""

from __future__ import annotations

import pytest
from planvars import changed, layout

from pdnode.core.plan.build import PlanError, build_plan


def _problems(v):
    with pytest.raises(PlanError) as info:
        build_plan(v)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("tp", [4, None], ids=["tp-given", "tp-from-gpus"])
def test_dp_replicas_are_accepted_and_rendered(host16, tp):
    """dp_size without DP attention: two TP-4 copies of the model in one decode instance
    (SGLang's data-parallel controller, replica r on GPUs base + r * tp_size * step)."""
    v = layout(host16, [{"gpus": [8, 9, 10, 11]}],
               [{"gpus": list(range(8)), "dp_size": 2, **({"tp_size": tp} if tp else {})}])
    plan = build_plan(v)
    args = plan.services["decode-0"]["args"]
    assert (args["tp_size"], args["dp_size"], args["base_gpu_id"], args["gpu_id_step"]) == (4, 2, 0, 1)
    assert "attn_dp_size" not in args and "nccl_port" not in args  # each replica picks its own
    # ...from 22000-29999, where the router's metrics port (29000) lies: the one warning
    assert [(w.rule_id, w.field) for w in plan.warnings] == [("dp-replica-port-draw", "pdnode_router_metrics_port")]
    assert build_plan({**v, "pdnode_router_metrics_port": 30900}).warnings == []


def test_a_prefill_of_dp_replicas_is_one_line_naming_sglangs_failure(host16):
    """Field failure 14 (sglang#29725): the pin fails every hand-off of a prefill's replicas
    but the first."""
    v = layout(host16, [{"gpus": list(range(8)), "dp_size": 4}], [{"gpus": [8, 9, 10, 11], "attn_dp_size": 4}])
    assert _problems(v) == [
        "pdnode_prefill_instances[0].dp_size=4: makes prefill-0 4 plain DP replicas, and SGLang 0.5.23 fails every "
        "hand-off of replicas 1..3 ('follow_bootstrap_room conflict': its KV sender compares the request's room "
        "with the attention-DP rank, 0 in every replica; sglang#29725). Fix: list each replica as a prefill instance "
        "of its own in pdnode_prefill_instances."]


def test_dp_replicas_with_dp_attention_are_one_line_with_sglangs_reason(gpu01_vars):
    assert _problems(changed(gpu01_vars, {"decode[0]": {"dp_size": 2}})) == [
        "pdnode_decode_instances[0].dp_size=2: DP replicas cannot be combined with DP attention (attn_dp_size=4); "
        "SGLang 0.5.23 refuses --dp-size with --attn-dp-size. Fix: remove dp_size and list each replica as an "
        "instance of its own, or remove attn_dp_size."]


def test_deprecated_dp_attention_spelling_is_one_line_naming_attn_dp_size(gpu01_vars):
    v = changed(gpu01_vars, {"decode[0]": {"attn_dp_size": None, "enable_dp_lm_head": None,
                                           "extra_args": {"enable_dp_attention": True, "dp_size": 4}}})
    assert _problems(v) == [
        "pdnode_decode_instances[0].extra_args.enable_dp_attention=True: is the deprecated DP-attention spelling "
        "(--enable-dp-attention --dp-size N; rewritten by SGLang to attn_dp_size=N and rejected by its YAML config). "
        "Fix: remove enable_dp_attention and dp_size from extra_args and set attn_dp_size: 4 on the instance."]


def test_deepep_without_ep_size_is_accepted_and_left_to_sglang(gpu01_vars):
    plan = build_plan(changed(gpu01_vars, {"decode[0]": {"ep_size": None,
                                                         "extra_args": {"moe_a2a_backend": "deepep"}}}))
    args = plan.services["decode-0"]["args"]
    assert args["moe_a2a_backend"] == "deepep" and "ep_size" not in args  # SGLang sets ep_size = tp_size
    assert plan.warnings == []


@pytest.mark.parametrize("backend", ["deepep", "mooncake", "flashinfer"])
def test_an_ep_size_sglang_would_replace_is_refused(gpu01_vars, backend):
    assert _problems(changed(gpu01_vars, {"decode[0]": {"ep_size": 2,
                                                        "extra_args": {"moe_a2a_backend": backend}}})) == [
        f"pdnode_decode_instances[0].ep_size=2: must equal tp_size=4 with moe_a2a_backend={backend!r}: SGLang 0.5.23 "
        "replaces any other ep_size with tp_size for this backend, so 2 would not take effect. Fix: leave ep_size "
        "out (SGLang sets it to tp_size) or set ep_size: 4."]


@pytest.mark.parametrize("backend", ["none", "ascend_tp"])
def test_backends_that_keep_ep_size_take_any_divisor(gpu01_vars, backend):
    plan = build_plan(changed(gpu01_vars, {"decode[0]": {"ep_size": 2, "extra_args": {"moe_a2a_backend": backend}}}))
    assert plan.services["decode-0"]["args"]["ep_size"] == 2


def test_moe_settings_on_a_dense_model_are_warnings(gpu01_vars):
    """SGLang ignores ep_size and moe_dense_tp_size for a dense model: the plan builds, says
    so once per setting, and leaves them out of the ServerArgs."""
    plan = build_plan(changed(gpu01_vars, {"pdnode_model_kind": "dense"}))
    assert [str(w) for w in plan.warnings] == [
        "pdnode_decode_instances[0].ep_size=4: has no effect on a dense model (SGLang ignores it). Fix: remove it.",
        "pdnode_decode_instances[0].moe_dense_tp_size=1: has no effect on a dense model (SGLang ignores it). "
        "Fix: remove it."]
    args = plan.services["decode-0"]["args"]
    assert "ep_size" not in args and "moe_dense_tp_size" not in args


def test_gpu_id_step_is_the_spacing_of_the_gpus(gpu01_vars):
    plan = build_plan(layout(gpu01_vars, [{"gpus": [0, 2, 4, 6]}], [{"gpus": [1, 3, 5, 7], "attn_dp_size": 4}]))
    p, d = plan.services["prefill-0"]["args"], plan.services["decode-0"]["args"]
    assert (p["base_gpu_id"], p["gpu_id_step"], p["tp_size"]) == (0, 2, 4)
    assert (d["base_gpu_id"], d["gpu_id_step"], d["tp_size"]) == (1, 2, 4)
    # the RDMA map follows the physical GPUs SGLang looks up (base + rank * step)
    assert sorted(p["disaggregation_ib_device"]) == ["0", "2", "4", "6"]


def test_gpu_id_step_in_extra_args_points_at_gpus(gpu01_vars):
    assert _problems(changed(gpu01_vars, {"prefill[0]": {"extra_args": {"gpu_id_step": 2}}})) == [
        "pdnode_prefill_instances[0].extra_args.gpu_id_step=2: is set by the plan from the instance's gpus (their "
        "spacing). Fix: remove it from extra_args."]


def test_prefill_dp_attention_at_given_ports_is_one_line_naming_both_and_the_fix(gpu01_vars):
    """Issue 10: the defaults of the one-instance release (prefill 30000, decode 30001) with
    DP attention on both printed six lines for one cause."""
    assert _problems(changed(gpu01_vars, {"prefill[0]": {"attn_dp_size": 4, "port": 30000},
                                          "decode[0]": {"port": 30001}})) == [
        "pdnode_decode_instances[0].port=30001: decode-0's port+233..+239 (30234-30240) and prefill-0's "
        "port+233..+239 (30233-30239) overlap at port 30234 (an instance with DP attention also binds its "
        "port+233..+239). Fix: set pdnode_decode_instances[0].port: 30007 (the nearest free port), or leave the "
        "instances' ports out so the plan allocates them."]


def test_prefill_dp_attention_without_ports_is_allocated_apart(gpu01_vars):
    plan = build_plan(changed(gpu01_vars, {"prefill[0]": {"attn_dp_size": 4}}))
    assert (plan.ports["decode-0.port"], plan.ports["prefill-0.port"]) == (30001, 30010)
    assert [str(w) for w in plan.warnings] == [
        "pdnode_prefill_instances[0].attn_dp_size=4: DP attention on prefill makes each GPU attend one request: "
        "TTFT gets several times worse. Fix: use plain TP on prefill (attn_dp_size 1)."]
