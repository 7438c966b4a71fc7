"""Threshold math on metric text captured from the stand-in (tests/verify/data/*.prom:
one warm-up request, then four non-streaming requests of 8 tokens). Expected numbers are
worked out by hand from the bucket lines of those files (shown in the comments)."""

from __future__ import annotations

import math

import pytest

from pdnode.verify import metrics as pm
from pdnode.verify.checks import threshold_value


@pytest.fixture
def decode(data_text):
    return pm.parse(data_text("decode_before.prom")), pm.parse(data_text("decode_after.prom"))


@pytest.fixture
def prefill(data_text):
    return pm.parse(data_text("prefill_before.prom")), pm.parse(data_text("prefill_after.prom"))


def test_parse_keeps_types_and_counter_names(decode):
    _, after = decode
    assert after.kind("sglang:generation_tokens_total") == "counter"
    assert after.kind("sglang:inter_token_latency_seconds") == "histogram"
    assert after.has("sglang:generation_tokens_total") and after.has("sglang:inter_token_latency_seconds")
    assert not after.has("sglang:no_such_metric")
    assert after.total("sglang:generation_tokens_total") == 36.0


def test_counter_delta(decode, prefill):
    assert pm.counter_delta(*decode, "sglang:generation_tokens_total") == 32.0  # 36 - 4: 4 requests x 8
    assert pm.counter_delta(*prefill, "sglang:prompt_tokens_total") == 460.0  # 474 - 14
    assert pm.counter_delta(*decode, "sglang:absent_total") is None


def test_counter_reset_counts_the_new_value():
    before = pm.parse('c_total{a="1"} 10\nc_total{a="2"} 5\n')
    after = pm.parse('c_total{a="1"} 3\nc_total{a="2"} 7\n')  # a=1 restarted
    assert pm.counter_delta(before, after, "c_total") == 3 + 2


def test_itl_quantiles_by_hand(decode):
    d = pm.histogram_delta(*decode, "sglang:inter_token_latency_seconds")
    # after - before per bucket: le 0.002: 0, 0.004: 26-2=24, 0.006: 26, 0.008: 26, 0.01: 27, 0.015: 27,
    # 0.02: 28, ... +Inf: 28
    assert d.count == 28
    assert d.buckets[0.004] == 24 and d.buckets[0.02] == 28 and d.buckets[math.inf] == 28
    # p50: rank 14 lies in (0.002, 0.004] holding 24: 0.002 + 0.002 * 14/24
    assert d.quantile(0.5) == pytest.approx(0.002 + 0.002 * 14 / 24)
    # p99: rank 27.72 lies in (0.015, 0.02] holding 28-27=1, 0.72 into it: 0.015 + 0.005 * 0.72
    assert d.quantile(0.99) == pytest.approx(0.0186)
    assert d.sum == pytest.approx(0.1040328659998977 - 0.012278102999971452)


def test_ttft_and_e2e_quantiles_by_hand(decode):
    ttft = pm.histogram_delta(*decode, "sglang:time_to_first_token_seconds")
    assert ttft.count == 4  # all four in (0, 0.1]
    assert ttft.quantile(0.5) == pytest.approx(0.1 * 2 / 4)
    assert ttft.quantile(0.99) == pytest.approx(0.1 * 3.96 / 4)
    e2e = pm.histogram_delta(*decode, "sglang:e2e_request_latency_seconds")
    assert e2e.quantile(0.99) == pytest.approx(0.099)


def test_histogram_quantile_like_prometheus():
    b = {0.1: 0, 0.2: 10, 0.4: 10, math.inf: 20}
    assert pm.histogram_quantile(0.25, b) == pytest.approx(0.15)  # rank 5 in (0.1, 0.2]
    assert pm.histogram_quantile(0.5, b) == pytest.approx(0.2)  # rank 10: top of the bucket
    assert pm.histogram_quantile(0.9, b) == 0.4  # rank in +Inf: highest finite bound
    assert math.isnan(pm.histogram_quantile(0.5, {0.1: 0, math.inf: 0}))  # no observations
    assert math.isnan(pm.histogram_quantile(0.5, {0.1: 3, 0.2: 4}))  # no +Inf bucket
    assert pm.histogram_quantile(-1, b) == -math.inf and pm.histogram_quantile(2, b) == math.inf
    # non-monotonic counts (scrape races) are repaired by carrying the maximum forward
    assert pm.histogram_quantile(0.5, {1.0: 4, 2.0: 3, math.inf: 4}) == pytest.approx(0.5)


def test_thresholds_from_snapshots(decode, prefill):
    before = {"decode": decode[0], "prefill": prefill[0]}
    after = {"decode": decode[1], "prefill": prefill[1]}
    assert threshold_value("itl_p50_max_s", before, after, 2.0)[0] == pytest.approx(0.002 + 0.002 * 14 / 24)
    assert threshold_value("ttft_p99_max_s", before, after, 2.0)[0] == pytest.approx(0.099)
    assert threshold_value("decode_throughput_min_tok_s", before, after, 2.0)[0] == pytest.approx(16.0)  # 32/2
    speed, how = threshold_value("kv_transfer_speed_min_gb_s", before, after, 2.0)
    # (sum after - sum before) / (count after - count before)
    assert speed == pytest.approx((0.6009386787958984 - 0.009015505286285438) / 4)
    assert "mean of 4 transfers" in how


def test_kv_speed_as_a_gauge():
    before = pm.parse("# TYPE sglang:kv_transfer_speed_gb_s gauge\nsglang:kv_transfer_speed_gb_s{tp_rank=\"0\"} 1\n")
    after = pm.parse("# TYPE sglang:kv_transfer_speed_gb_s gauge\nsglang:kv_transfer_speed_gb_s{tp_rank=\"0\"} 3.5\n")
    value, how = threshold_value("kv_transfer_speed_min_gb_s", {"prefill": before}, {"prefill": after}, 1.0)
    assert value == 3.5 and "gauge" in how


def test_throughput():
    assert pm.throughput(100, 4.0) == 25.0
    assert pm.throughput(None, 4.0) is None and pm.throughput(5, 0) is None


def test_renamed_metric_is_missing_and_found_by_likeness(data_text):
    renamed = pm.parse(data_text("decode_renamed.prom"))
    assert not renamed.has("sglang:e2e_request_latency_seconds")
    assert "sglang:request_e2e_latency_seconds" in pm.close_names("sglang:e2e_request_latency_seconds",
                                                                   renamed.names())


def test_bad_text_raises():
    with pytest.raises(pm.MetricsParseError):
        pm.parse("this is {not prometheus\n")
