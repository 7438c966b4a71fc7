"""ServerArgs that SGLang 0.5.23 rejects, with SGLang's reason -- and the mistakes it
does NOT catch (the plan core has to refuse those itself)."""

from __future__ import annotations

import pytest
from sglang_cases import DECODE_DP4_EP4, DEEPSEEK_V3_TINY, PREFILL_TP4, with_

pytestmark = pytest.mark.conformance

# name -> (serverargs, substrings the verdict line must contain)
REJECTED = {
    # The recipe copied from many blog posts: with DP attention tp_size is the whole
    # instance, so tp 1 cannot hold 4 attention-DP ranks. SGLang fails on a bare
    # assert (the launcher quotes the source line).
    "widely-copied-decode": (
        {
            "model_path": DEEPSEEK_V3_TINY,
            "disaggregation_mode": "decode",
            "tp_size": 1,
            "dp_size": 4,
            "enable_dp_attention": True,
            "ep_size": 4,
            "moe_dense_tp_size": 1,
        },
        ["AssertionError", "assert cfg.tp_size % cfg.attn_dp_size == 0", "handle_data_parallelism"],
    ),
    "decode-tp4-attndp3": (
        with_(DECODE_DP4_EP4, attn_dp_size=3, ep_size=..., enable_dp_lm_head=...),
        ["assert cfg.tp_size % cfg.attn_dp_size == 0"],
    ),
    "decode-moe-dense-tp2-with-tp4": (
        with_(DECODE_DP4_EP4, moe_dense_tp_size=2),
        ["moe_dense_tp_size only supports None, 1, or tp_size currently"],
    ),
    # removed in 2026-03: the launcher names the key before SGLang's argparse would
    # say "unrecognized arguments: --disaggregation-decode-tp 4"
    "prefill-removed-decode-tp": (
        with_(PREFILL_TP4, disaggregation_decode_tp=4),
        ["unknown key 'disaggregation_decode_tp'", "--disaggregation-decode-tp"],
    ),
    "prefill-removed-decode-dp": (
        with_(PREFILL_TP4, disaggregation_decode_dp=4),
        ["unknown key 'disaggregation_decode_dp'"],
    ),
    "prefill-fake-backend": (
        with_(PREFILL_TP4, disaggregation_transfer_backend="fake"),
        ["Prefill server does not support 'fake' as the transfer backend"],
    ),
    "prefill-unknown-backend": (
        with_(PREFILL_TP4, disaggregation_transfer_backend="rdma"),
        ["argument parsing", "--disaggregation-transfer-backend", "invalid choice: 'rdma'"],
    ),
    "prefill-tp-size-not-int": (
        with_(PREFILL_TP4, tp_size="four"),
        ["argument parsing", "--tp-size", "invalid int value: 'four'"],
    ),
    "prefill-served-name-with-colon": (
        with_(PREFILL_TP4, served_model_name="deepseek:v3"),
        ["served_model_name cannot contain a colon"],
    ),
    "prefill-missing-model-dir": (
        with_(PREFILL_TP4, model_path="/nonexistent/pdnode/model"),
        ["/nonexistent/pdnode/model"],
    ),
    # the API key must never be in the JSON (it would be on the command line)
    "prefill-api-key-in-json": (
        with_(PREFILL_TP4, api_key="sk-123"),
        ["key 'api_key'", "--api-key-file"],
    ),
    # a ServerArgs field that has no flag
    "prefill-field-without-flag": (
        with_(PREFILL_TP4, stat_loggers="x"),
        ["'stat_loggers' is a ServerArgs field without a command-line flag"],
    ),
}

# Host-dependent: SGLang lists /sys/class/infiniband for every device named in
# disaggregation_ib_device (with the mooncake backend). The device below exists nowhere.
IB_DEVICE_CASES = {
    "prefill-ib-device-missing": with_(PREFILL_TP4, disaggregation_ib_device="pdnode_no_such_hca"),
    "decode-ib-device-map-missing": with_(
        DECODE_DP4_EP4,
        disaggregation_ib_device={str(g): "pdnode_no_such_hca" for g in range(4, 8)},
    ),
}

# Mistakes SGLang 0.5.23's argument validation lets through. Each is a rule the plan
# core must enforce on its own; if SGLang starts rejecting one, this test says so.
NOT_CAUGHT = {
    # `_data_parallelism_defaults` silently resets enable_dp_lm_head to False when
    # there is one DP rank: accepted, and the flag does nothing.
    "prefill-dp-lm-head-without-dp-attention": (
        with_(PREFILL_TP4, enable_dp_lm_head=True),
        "enable_dp_lm_head silently dropped",
    ),
    # ep_size is not checked against tp_size; moe_tp_size = tp // ep = 0 at start-up.
    "decode-ep8-with-tp4": (
        with_(DECODE_DP4_EP4, ep_size=8),
        "ep_size 8 > tp_size 4 not validated",
    ),
    "prefill-ep3-with-tp4": (
        with_(PREFILL_TP4, ep_size=3),
        "tp_size % ep_size != 0 not validated",
    ),
    # mooncake_tcp: handle_pd_disaggregation sets disaggregation_ib_device=None
    # (silently ignored, not refused) before any IB device is validated.
    "prefill-ib-device-with-mooncake-tcp": (
        with_(
            PREFILL_TP4,
            disaggregation_transfer_backend="mooncake_tcp",
            disaggregation_ib_device="mlx5_0",
        ),
        "ib device silently dropped with mooncake_tcp",
    ),
}


@pytest.fixture(scope="module")
def verdicts(sglang_check_many):
    cases = {name: serverargs for name, (serverargs, _) in REJECTED.items()}
    cases.update(IB_DEVICE_CASES)
    cases.update({name: serverargs for name, (serverargs, _) in NOT_CAUGHT.items()})
    return sglang_check_many(cases)


@pytest.mark.parametrize("case", list(REJECTED))
def test_rejected(verdicts, case):
    accepted, message = verdicts[case]
    assert not accepted, f"SGLang accepted {case}: {message}"
    assert message.startswith(f"REJECTED: {case}.json: "), message
    assert "Traceback" not in message
    for needle in REJECTED[case][1]:
        assert needle in message, f"{needle!r} not in {message!r}"


@pytest.mark.parametrize("case", list(IB_DEVICE_CASES))
def test_ib_device_is_checked_against_the_host(verdicts, case):
    accepted, message = verdicts[case]
    assert not accepted, message
    assert "host-dependent" in message and "/sys/class/infiniband" in message, message
    assert (
        "InfiniBand sysfs path not found" in message  # no RDMA stack (this CI machine)
        or "Invalid IB devices specified" in message  # a host with other HCAs
        or "No IB devices found" in message
    ), message


@pytest.mark.parametrize("case", list(NOT_CAUGHT))
def test_sglang_does_not_catch(verdicts, case):
    accepted, message = verdicts[case]
    assert accepted, (
        f"SGLang now rejects {case} ({NOT_CAUGHT[case][1]} no longer holds): {message}"
    )
