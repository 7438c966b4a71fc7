"""Threshold math on metric text captured from the stand-in (tests/verify/data/*.prom:
one warm-up request, then four non-streaming requests of 8 tokens). Expected numbers are
worked out by hand from the bucket lines of those files (shown in the comments)."""

from __future__ import annotations

import math

import pytest

from pdnode.verify import metrics as pm
from pdnode.verify.checks_load import threshold_value


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


def test_a_declared_counter_without_series_rose_by_zero():
    declared = pm.parse("# TYPE sglang:num_requests counter\n")  # an engine that served nothing yet
    assert pm.counter_delta(declared, declared, "sglang:num_requests_total") is None
    assert pm.counter_rise(declared, declared, "sglang:num_requests_total") == 0
    assert pm.counter_rise(declared, pm.parse("sglang:num_requests_total 2\n"), "sglang:num_requests_total") == 2
    assert pm.counter_rise(declared, declared, "sglang:absent_total") is None  # not declared: missing


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


ROLES = {"prefill-0": "prefill", "decode-0": "decode"}
# decode_before/after.prom: the burst's 4 requests as the decode timed them (e2e sum
# delta) and the 32 tokens it generated
E2E_SUM, TOKENS = 0.17575329199962653, 32.0


def test_thresholds_from_snapshots(decode, prefill):
    before = {"decode-0": decode[0], "prefill-0": prefill[0]}
    after = {"decode-0": decode[1], "prefill-0": prefill[1]}
    assert threshold_value("itl_p50_max_s", before, after, 2.0, ROLES)[0] == pytest.approx(0.002 + 0.002 * 14 / 24)
    assert threshold_value("ttft_p99_max_s", before, after, 2.0, ROLES)[0] == pytest.approx(0.099)
    # tokens over the engines' time: the requests' e2e sum spread over the 2 in flight at once
    rate, how = threshold_value("decode_throughput_min_tok_s", before, after, 2, ROLES)
    assert rate == pytest.approx(TOKENS / (E2E_SUM / 2))
    assert "of engine time" in how and "concurrency 2" in how, how
    speed, how = threshold_value("kv_transfer_speed_min_gb_s", before, after, 2.0, ROLES)
    # (sum after - sum before) / (count after - count before)
    assert speed == pytest.approx((0.6009386787958984 - 0.009015505286285438) / 4)
    assert "mean of 4 transfers" in how


def test_thresholds_sum_the_instances_of_a_role(decode):
    """Two decodes: the second served nothing during the burst, the first the captured
    requests. The quantile is the one of ALL requests (the same numbers as one decode),
    the throughput counts both: nothing is averaged per instance."""
    idle = decode[1]  # an instance whose counters did not move: after == before
    before = {"decode-0": decode[0], "decode-1": idle}
    after = {"decode-0": decode[1], "decode-1": idle}
    roles = {"decode-0": "decode", "decode-1": "decode"}
    value, how = threshold_value("itl_p50_max_s", before, after, 2.0, roles)
    assert value == pytest.approx(0.002 + 0.002 * 14 / 24) and "decode-0, decode-1 summed" in how
    # both busy: twice the observations, the same distribution, the same p50; twice the tokens
    both_b = {"decode-0": decode[0], "decode-1": decode[0]}
    both_a = {"decode-0": decode[1], "decode-1": decode[1]}
    assert threshold_value("itl_p50_max_s", both_b, both_a, 2.0, roles)[0] == pytest.approx(0.002 + 0.002 * 14 / 24)
    assert "p50 of 56 observations" in threshold_value("itl_p50_max_s", both_b, both_a, 2.0, roles)[1]
    # the throughput counts both: twice the requests in flight, twice the tokens in the same time
    one = threshold_value("decode_throughput_min_tok_s", before, after, 2, roles)[0]
    assert one == pytest.approx(TOKENS / (E2E_SUM / 2))  # the idle decode adds neither tokens nor time
    assert threshold_value("decode_throughput_min_tok_s", both_b, both_a, 4, roles)[0] == pytest.approx(2 * one)
    # one decode unreadable: no value, and which one says why
    value, how = threshold_value("itl_p50_max_s", {**before, "decode-1": "refused"}, after, 2.0, roles)
    assert value is None and how == "decode-1 metrics unreadable"


def test_a_rate_without_timed_requests_is_not_measurable(decode):
    """No e2e observations during the burst: no time to divide by, so no value (the
    threshold check then FAILs "not measurable"), never a rate over the client's clock."""
    before, _ = decode
    value, how = threshold_value("decode_throughput_min_tok_s", {"decode-0": before}, {"decode-0": before}, 4,
                                 {"decode-0": "decode"})
    assert value is None and how == "no sglang:e2e_request_latency_seconds observations on decode during the burst"


def test_merge_keeps_instances_apart():
    a = pm.parse('# TYPE c counter\nc_total{x="1"} 5\n')
    b = pm.parse('# TYPE c counter\nc_total{x="1"} 7\n')
    merged = pm.merge({"prefill-0": a, "prefill-1": b})
    assert merged.total("c_total") == 12 and len(merged.series("c_total")) == 2
    assert merged.total("c_total", {"pdnode_instance": "prefill-1"}) == 7
    # a reset on one instance counts its new value only, the other's increase as usual
    later = pm.merge({"prefill-0": pm.parse('c_total{x="1"} 2\n'), "prefill-1": pm.parse('c_total{x="1"} 9\n')})
    assert pm.counter_delta(merged, later, "c_total") == 2 + 2


def test_kv_speed_as_a_gauge():
    before = pm.parse("# TYPE sglang:kv_transfer_speed_gb_s gauge\nsglang:kv_transfer_speed_gb_s{tp_rank=\"0\"} 1\n")
    after = pm.parse("# TYPE sglang:kv_transfer_speed_gb_s gauge\nsglang:kv_transfer_speed_gb_s{tp_rank=\"0\"} 3.5\n")
    value, how = threshold_value("kv_transfer_speed_min_gb_s", {"prefill-0": before}, {"prefill-0": after}, 1.0,
                                 {"prefill-0": "prefill"})
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
