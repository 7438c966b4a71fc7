"""ServerArgs that SGLang 0.5.23 accepts (parse + resolve_once + check_server_args)."""

from __future__ import annotations

import os

import pytest
from sglang_cases import DECODE_DP4_EP4, PREFILL_TP4, QWEN2_TINY, with_

pytestmark = pytest.mark.conformance

QWEN2 = {"model_path": QWEN2_TINY, "served_model_name": "qwen2"}

CASES = {
    "prefill-tp4-mooncake": PREFILL_TP4,
    "decode-tp4-attndp4-ep4-dplmhead": DECODE_DP4_EP4,
    "prefill-tp2": with_(PREFILL_TP4, tp_size=2),
    "prefill-tp8": with_(PREFILL_TP4, tp_size=8),
    "decode-moe-dense-tp1": with_(DECODE_DP4_EP4, moe_dense_tp_size=1),
    "decode-moe-dense-tp4": with_(DECODE_DP4_EP4, moe_dense_tp_size=4),
    "qwen2-prefill-tp4": with_(PREFILL_TP4, **QWEN2),
    "qwen2-decode-tp4-no-ep": with_(
        DECODE_DP4_EP4, **QWEN2, attn_dp_size=..., ep_size=..., enable_dp_lm_head=...
    ),
    "qwen2-decode-tp2-no-ep": with_(
        DECODE_DP4_EP4, **QWEN2, tp_size=2, attn_dp_size=..., ep_size=..., enable_dp_lm_head=...
    ),
    "prefill-mooncake-tcp": with_(PREFILL_TP4, disaggregation_transfer_backend="mooncake_tcp"),
    "decode-mooncake-tcp": with_(DECODE_DP4_EP4, disaggregation_transfer_backend="mooncake_tcp"),
    "prefill-nixl": with_(PREFILL_TP4, disaggregation_transfer_backend="nixl"),
    "decode-nixl": with_(DECODE_DP4_EP4, disaggregation_transfer_backend="nixl"),
    # the deprecated spelling of decode's layout: rewritten to attn_dp_size=4, dp_size=1
    "decode-deprecated-dp-attention": with_(
        DECODE_DP4_EP4, attn_dp_size=..., dp_size=4, enable_dp_attention=True
    ),
    # a bool that defaults to True, turned off: the launcher must say --no-dllm-fdfo
    "prefill-bool-default-true-off": with_(PREFILL_TP4, dllm_fdfo=False),
    # tri-state bools: false -> --no-flag
    "decode-tri-state-false": with_(DECODE_DP4_EP4, enable_tp_lm_head_all_to_all=False),
    # prefill on its own GPU slots via gpu_id_step, model with the served name default
    "prefill-gpu-id-step": with_(PREFILL_TP4, gpu_id_step=2, served_model_name=...),
}


@pytest.fixture(scope="module")
def verdicts(sglang_check_many):
    return sglang_check_many(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_accepted(verdicts, case):
    accepted, message = verdicts[case]
    assert accepted, message
    assert message == f"OK: {case}.json accepted by SGLang 0.5.23"


def test_api_key_reaches_sglang_through_the_yaml_config(sglang_check, tmp_path):
    """--api-key-file: the launcher writes `api-key:` into a --config YAML; --check
    verifies that SGLang's parsed ServerArgs carries exactly that key (else it says
    CANNOT CHECK, which fails the test)."""
    key_file = tmp_path / "api-key"
    key_file.write_text("sk-pdnode-conformance-0123456789\n")
    os.chmod(key_file, 0o600)
    accepted, message = sglang_check(
        DECODE_DP4_EP4, name="decode-with-key", extra=["--api-key-file", str(key_file)]
    )
    assert accepted, message
    assert message == "OK: decode-with-key.json accepted by SGLang 0.5.23"
