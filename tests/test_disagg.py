"""SGLang's disaggregation settings owned by the plan (issue 19, section 3): one
inventory setting each, rendered into every engine; what one SGLang process cannot
check across instances is refused in one line."""

from __future__ import annotations

import pytest
from planvars import changed, variables

from pdnode.core.plan.build import PlanError, build_plan


def _plan(**changes):
    return build_plan(changed(variables("gpu01"), changes), "gpu01")


def test_the_hand_offs_timeouts_and_heartbeat_are_explicit_in_every_engine():
    plan = build_plan(variables("gpu01"), "gpu01")
    for svc in plan.engines():
        env = svc["environment"]
        assert env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "600"
        assert env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "5"
        assert env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "2"


def test_checksum_and_policy_are_set_on_every_engine_from_one_setting():
    plan = _plan(pdnode_kv_checksum=True)
    assert all(s["args"]["disaggregation_enable_kv_checksum"] is True for s in plan.engines())
    assert all("disaggregation_decode_allocation_policy" not in s["args"] for s in plan.engines())


def test_the_defaults_render_nothing_sglang_does_not_already_do():
    plan = build_plan(variables("gpu01"), "gpu01")
    for s in plan.engines():
        assert "disaggregation_enable_kv_checksum" not in s["args"]
        assert "disaggregation_decode_allocation_policy" not in s["args"]


@pytest.mark.parametrize(("changes", "rule"), [
    ({"decode[0]": {"extra_args": {"disaggregation_enable_kv_checksum": True}}}, "disagg-setting-same-everywhere"),
    ({"pdnode_kv_checksum": True, "prefill[0]": {"extra_args": {"disaggregation_enable_kv_checksum": False}}},
     "disagg-setting-same-everywhere"),
    ({"decode[0]": {"extra_args": {"disaggregation_decode_allocation_policy": "prefill_complete"}}},
     "disagg-setting-same-everywhere"),
    ({"pdnode_decode_allocation_policy": "late"}, "disagg-setting-range"),
    ({"pdnode_disagg_heartbeat_interval_s": 1.5}, "disagg-setting-range"),
    ({"pdnode_disagg_waiting_timeout_s": 0}, "disagg-setting-range"),
    ({"pdnode_engine_environment": {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "7"}}, "disagg-environment-owned"),
])
def test_what_breaks_the_hand_off_is_refused(changes, rule):
    try:
        build_plan(changed(variables("gpu01"), changes), "gpu01")
    except PlanError as exc:
        assert [p.rule_id for p in exc.problems] == [rule], [str(p) for p in exc.problems]
    else:
        pytest.fail("accepted")


def test_an_instance_may_override_the_setting_when_all_agree():
    plan = _plan(**{"pdnode_kv_checksum": False,
                    "prefill[0]": {"extra_args": {"disaggregation_enable_kv_checksum": True}},
                    "decode[0]": {"extra_args": {"disaggregation_enable_kv_checksum": True}}})
    assert all(s["args"]["disaggregation_enable_kv_checksum"] is True for s in plan.engines())


@pytest.mark.parametrize("changes", [
    {"decode[0]": {"extra_args": {"page_size": 64}}},
    {"prefill[0]": {"extra_args": {"page_size": 32}}, "decode[0]": {"extra_args": {"page_size": 64}}},
    {"prefill[0]": {"extra_args": {"kv_cache_dtype": "fp8_e4m3"}}},
])
def test_a_different_kv_layout_between_prefill_and_decode_is_refused_naming_both(changes):
    """The decode would raise 'Page size mismatch' / 'KV cache dtype mismatch' at its first
    request (SGLang 0.5.23, disaggregation/common/conn.py, try_ensure_parallel_info)."""
    with pytest.raises(PlanError) as info:
        _plan(**changes)
    [problem] = info.value.problems
    assert problem.rule_id == "disagg-kv-layout-same"
    assert "prefill-0" in str(problem) and "mismatch" in str(problem) and "every prefill and decode" in str(problem)


def test_the_same_kv_layout_everywhere_and_sglangs_default_spelled_out_are_accepted():
    same = {"extra_args": {"page_size": 64, "kv_cache_dtype": "fp8_e4m3"}}
    assert _plan(**{"prefill[0]": same, "decode[0]": same})
    # "auto" is SGLang's own default: writing it on one side only changes nothing
    assert _plan(**{"decode[0]": {"extra_args": {"kv_cache_dtype": "auto"}}})
