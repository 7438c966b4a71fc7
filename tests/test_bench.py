"""`pdnode bench`: the client's record, the engines' counter deltas, the layout, the table
and the JSON (unit, no network beyond a loopback fake); and (marker integration) the real
client -- SGLang's bench_serving from the validator environment -- through the real
sglang-router against a 2-prefill + 1-decode stand-in node started from a real plan,
its numbers checked against the engines' own counters."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdnode.commands import bench, bench_report
from pdnode.node import bench_counters
from pdnode.commands.cli import main as pdnode_main
from pdnode.verify.metrics import parse
from standin.node import free_ports, plan_accepts

REPO = Path(__file__).resolve().parents[1]
API_KEY = "sk-bench-3f9a1c77"  # the integration node's (a test value)
DATA = REPO / "tests" / "verify" / "data"


# --- helpers -----------------------------------------------------------------------------
def record(**over: Any) -> dict[str, Any]:
    """A bench_serving JSONL record (the keys pdnode reads, values in its units: ms, tok/s)."""
    rec = {"backend": "sglang", "completed": 10, "duration": 2.5, "total_input_tokens": 5120,
           "total_output_tokens": 640, "request_throughput": 4.0, "input_throughput": 2048.0,
           "output_throughput": 256.0, "mean_ttft_ms": 40.0, "median_ttft_ms": 35.0, "p99_ttft_ms": 90.0,
           "mean_itl_ms": 4.0, "median_itl_ms": 3.5, "p99_itl_ms": 12.0, "mean_e2e_latency_ms": 300.0,
           "median_e2e_latency_ms": 290.0, "p99_e2e_latency_ms": 420.0, "errors": [""] * 10}
    rec.update(over)
    return rec


def reading(**instances: tuple[str, str | None, str | None]) -> dict[str, Any]:
    """A pdnode.node.bench_counters report: id -> (role, Prometheus text or None, error)."""
    out = {}
    for iid, (role, text, error) in instances.items():
        out[iid.replace("_", "-")] = {"role": role, "url": "http://127.0.0.1:1/metrics", "error": error,
                                      "metrics": bench_counters.counter_lines(text) if text else ""}
    return {"schema": bench_counters.SCHEMA, "instances": out}


def prom(role: str, requests: float, prompt: float, gen: float, stream: str = "true") -> str:
    lab = f'engine_type="{role}",is_streaming="{stream}",model_name="m"'
    return "\n".join([
        "# TYPE sglang:num_requests_total counter", f"sglang:num_requests_total{{{lab}}} {requests}",
        "# TYPE sglang:prompt_tokens_total counter", f"sglang:prompt_tokens_total{{{lab}}} {prompt}",
        "# TYPE sglang:generation_tokens_total counter", f"sglang:generation_tokens_total{{{lab}}} {gen}", ""])


def plan_dict(prefill: list[dict[str, Any]], decode: list[dict[str, Any]], **router: Any) -> dict[str, Any]:
    def inst(i: int, d: dict[str, Any]) -> dict[str, Any]:
        return {"name": str(i), "dp_size": 1, "attn_dp_size": 1, "ep_size": None, **d}

    return {"host": "gpu01", "services": {"router": {"role": "router", "args": {"host": "0.0.0.0", "port": 8000,
                                                                                 **router}}},
            "settings": {"pdnode_prefill_instances": [inst(i, d) for i, d in enumerate(prefill)],
                         "pdnode_decode_instances": [inst(i, d) for i, d in enumerate(decode)],
                         "pdnode_model_served_name": "m"}}


def args(**over: Any) -> Any:
    import argparse

    base = {"requests": None, "concurrency": None, "rate": None, "input_len": None, "output_len": None,
            "range_ratio": None, "warmup": None, "seed": None}
    base.update(over)
    return argparse.Namespace(**base)


# --- the client's record -------------------------------------------------------------------
def test_last_record_of_the_jsonl_is_read() -> None:
    text = json.dumps(record(completed=3)) + "\n" + json.dumps(record(completed=7)) + "\n\n"
    assert bench_report.parse_client_output(text)["completed"] == 7


@pytest.mark.parametrize("text, words", [
    ("", "wrote no result"),
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"completed": 1}), "lacks duration"),
])
def test_unusable_client_output_is_one_clear_error(text: str, words: str) -> None:
    with pytest.raises(bench_report.ClientOutputError, match=words):
        bench_report.parse_client_output(text)


def test_results_are_seconds_and_failures_are_what_did_not_complete() -> None:
    res = bench_report.results(record(), requests=12)
    assert res["completed"] == 10 and res["failed"] == 2
    assert res["ttft_s"] == {"mean": 0.04, "p50": 0.035, "p99": 0.09}
    assert res["itl_s"] == {"mean": 0.004, "p50": 0.0035, "p99": 0.012}
    assert res["e2e_s"] == {"mean": 0.3, "p50": 0.29, "p99": 0.42}
    assert (res["request_throughput"], res["input_token_throughput"], res["output_token_throughput"]) == (4.0, 2048.0, 256.0)
    assert (res["input_tokens"], res["output_tokens"]) == (5120, 640)


def test_no_completed_request_gives_null_latencies_not_zero() -> None:
    # bench_serving reports 0 ms when nothing completed; 0 would read as "fast"
    res = bench_report.results(record(completed=0, mean_ttft_ms=0.0, median_ttft_ms=0.0, p99_ttft_ms=0.0), 5)
    assert res["ttft_s"] == {"mean": None, "p50": None, "p99": None}
    assert res["failed"] == 5


def test_client_errors_are_distinct_last_lines() -> None:
    rec = record(errors=["", "Traceback ...\naiohttp.ClientConnectorError: refused", "x\naiohttp.ClientConnectorError: refused",
                         "Bad Request: too long"])
    assert bench_report.client_errors(rec) == ["aiohttp.ClientConnectorError: refused", "Bad Request: too long"]


# --- the counters ----------------------------------------------------------------------------
def test_counters_from_sglang_text_keep_every_series() -> None:
    text = (DATA / "prefill_after.prom").read_text()
    kept = bench_counters.counter_lines(text)
    assert len(kept) < len(text) / 4  # only the counters' lines travel
    snap = bench_report.snapshot_of({"metrics": kept})
    assert {name for name in bench_counters.COUNTERS if snap.series(name)} == set(bench_counters.COUNTERS)
    assert snap.series("sglang:prompt_tokens_total") == parse(text).series("sglang:prompt_tokens_total")
    [(labels, value)] = snap.series("sglang:prompt_tokens_total").items()
    assert dict(labels)["engine_type"] == "prefill" and value == 474.0


def test_counters_that_do_not_parse_are_the_instances_error() -> None:
    good = reading(prefill_0=("prefill", prom("prefill", 5, 400, 5), None))
    bad = json.loads(json.dumps(good))
    bad["instances"]["prefill-0"]["metrics"] = "sglang:num_requests_total{ 7\n"
    row = bench_report.instance_work(good, bad)["prefill-0"]
    assert row["requests"] is None and "prefill-0" not in row["error"] and "/metrics" in row["error"]


def test_instance_work_is_the_counter_delta_per_instance() -> None:
    before = reading(prefill_0=("prefill", prom("prefill", 5, 400, 5), None),
                     prefill_1=("prefill", prom("prefill", 2, 100, 2), None),
                     decode_0=("decode", prom("decode", 7, 500, 70), None))
    after = reading(prefill_0=("prefill", prom("prefill", 9, 900, 9), None),
                    prefill_1=("prefill", prom("prefill", 8, 700, 8), None),
                    decode_0=("decode", prom("decode", 17, 1600, 230), None))
    work = bench_report.instance_work(before, after)
    assert list(work) == ["prefill-0", "prefill-1", "decode-0"]
    assert work["prefill-0"] == {"role": "prefill", "requests": 4, "prompt_tokens": 500, "generation_tokens": 4}
    assert work["prefill-1"] == {"role": "prefill", "requests": 6, "prompt_tokens": 600, "generation_tokens": 6}
    assert work["decode-0"] == {"role": "decode", "requests": 10, "prompt_tokens": 1100, "generation_tokens": 160}


def test_a_prefills_kv_hand_offs_are_counted_with_their_mean_time_and_speed() -> None:
    def kv(count: int, ms: float, mb: float) -> str:
        labels = '{engine_type="unified",tp_rank="0",pp_rank="0"}'
        return ("# TYPE sglang:kv_transfer_latency_ms histogram\n"
                f"sglang:kv_transfer_latency_ms_sum{labels} {ms}\nsglang:kv_transfer_latency_ms_count{labels} {count}\n"
                "# TYPE sglang:kv_transfer_total_mb histogram\n"
                f"sglang:kv_transfer_total_mb_sum{labels} {mb}\nsglang:kv_transfer_total_mb_count{labels} {count}\n")
    before = reading(prefill_0=("prefill", prom("prefill", 1, 10, 1) + kv(1, 5.0, 2.0), None))
    after = reading(prefill_0=("prefill", prom("prefill", 11, 1010, 11) + kv(11, 45.0, 82.0), None))
    work = bench_report.instance_work(before, after)["prefill-0"]
    # 10 hand-offs, 40 ms and 80 MB between the readings: 4 ms each, 2 GB/s (MB per ms)
    assert work["kv_handoff"] == {"transfers": 10, "mean_ms": 4.0, "gb_s": 2.0}


def test_a_restarted_engine_counts_from_zero_and_a_new_series_counts_whole() -> None:
    before = reading(decode_0=("decode", prom("decode", 50, 5000, 500), None))
    # restarted mid-run: the counter went down, so all of its value after is this run's
    after_text = prom("decode", 3, 300, 30) + prom("decode", 2, 20, 4, stream="false").replace("# TYPE", "# X")
    after = reading(decode_0=("decode", after_text, None))
    work = bench_report.instance_work(before, after)["decode-0"]
    assert work == {"role": "decode", "requests": 5, "prompt_tokens": 320, "generation_tokens": 34}


def test_an_engine_without_counters_yet_did_no_work_and_an_unreadable_one_is_null() -> None:
    before = reading(prefill_0=("prefill", None, None), decode_0=("decode", prom("decode", 1, 1, 1), None))
    after = reading(prefill_0=("prefill", None, None), decode_0=("decode", None, "GET x: refused"))
    work = bench_report.instance_work(before, after)
    assert work["prefill-0"] == {"role": "prefill", "requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
    assert work["decode-0"]["requests"] is None and work["decode-0"]["error"] == "GET x: refused"


def test_consistency_is_silent_when_the_engines_agree_and_names_the_difference_otherwise() -> None:
    res = bench_report.results(record(completed=10, total_input_tokens=1000, total_output_tokens=160), 10)
    agree = {"prefill-0": {"role": "prefill", "requests": 4, "prompt_tokens": 400, "generation_tokens": 4},
             "prefill-1": {"role": "prefill", "requests": 6, "prompt_tokens": 600, "generation_tokens": 6},
             "decode-0": {"role": "decode", "requests": 10, "prompt_tokens": 1000, "generation_tokens": 160}}
    assert bench_report.consistency(res, agree) == []
    extra = json.loads(json.dumps(agree))
    extra["decode-0"]["generation_tokens"] = 176
    [note] = bench_report.consistency(res, extra)
    assert "decode instances counted 176 generation tokens, the client 160" in note


def test_snapshot_reads_every_engine_of_the_plan_and_reports_one_that_does_not_answer() -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    text = prom("prefill", 3, 30, 3).encode()

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/metrics" else 404
            self.send_response(code)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again before the read: refused
    try:
        plan = {"host": "h", "services": {
            "prefill-0": {"id": "prefill-0", "role": "prefill", "url": f"http://127.0.0.1:{srv.server_address[1]}"},
            "decode-0": {"id": "decode-0", "role": "decode", "url": f"http://127.0.0.1:{dead}"},
            "router": {"id": "router", "role": "router", "url": "http://127.0.0.1:1"}}}
        snap = bench_counters.snapshot(plan, timeout_s=2)
    finally:
        srv.shutdown()
        srv.server_close()
    assert list(snap["instances"]) == ["prefill-0", "decode-0"]
    assert bench_report.snapshot_of(snap["instances"]["prefill-0"]).series("sglang:num_requests_total") == {
        (("engine_type", "prefill"), ("is_streaming", "true"), ("model_name", "m")): 3.0}
    assert snap["instances"]["prefill-0"]["error"] is None
    assert "decode-0" in snap["instances"] and snap["instances"]["decode-0"]["error"]


def test_counters_module_refuses_an_old_plan_with_one_line(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"prefill": {}, "decode": {}})))
    assert bench_counters.main(["--plan", "-"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unversioned" in err and "pdnode.plan/1" in err
    # the version right, the shape not: still one line
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"schema": "pdnode.plan/1", "prefill": {}})))
    assert bench_counters.main(["--plan", "-"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no services" in err


# --- the plan, the workload, the client's command line ------------------------------------
def test_layout_lists_every_instance_with_its_parallelism() -> None:
    plan = plan_dict([{"gpus": [0, 1], "tp_size": 2}, {"gpus": [2, 3], "tp_size": 2}],
                     [{"gpus": [4, 5, 6, 7], "tp_size": 4, "attn_dp_size": 4, "ep_size": 4}])
    lay = bench_report.layout(plan)
    assert [i["id"] for i in lay["prefill"]] == ["prefill-0", "prefill-1"]
    assert lay["decode"] == [{"id": "decode-0", "gpus": [4, 5, 6, 7], "tp_size": 4, "dp_size": 1,
                              "attn_dp_size": 4, "ep_size": 4}]
    assert lay["prefill"][0]["ep_size"] == 1  # null in the plan: SGLang's default


def test_defaults_and_a_rate_workload() -> None:
    wl = bench.workload(args())
    assert (wl["requests"], wl["concurrency"], wl["rate"], wl["range_ratio"]) == (64, 8, None, 1.0)
    wl = bench.workload(args(rate="2.5", requests="10", range_ratio="0.5"))
    assert (wl["rate"], wl["concurrency"], wl["requests"], wl["range_ratio"]) == (2.5, None, 10, 0.5)


@pytest.mark.parametrize("over, option", [
    ({"requests": "0"}, "--requests '0'"), ({"requests": "ten"}, "--requests 'ten'"),
    ({"concurrency": "-1"}, "--concurrency '-1'"), ({"rate": "inf"}, "--rate 'inf'"), ({"rate": "0"}, "--rate '0'"),
    ({"input_len": "1.5"}, "--input-len '1.5'"), ({"range_ratio": "0"}, "--range-ratio '0'"),
    ({"range_ratio": "1.5"}, "--range-ratio '1.5'"), ({"output_len": "nan"}, "--output-len 'nan'"),
])
def test_bad_workload_values_are_refused_naming_the_option(over: dict[str, str], option: str) -> None:
    with pytest.raises(bench.BenchError) as exc:
        bench.workload(args(**over))
    assert exc.value.code == 1 and option in str(exc.value) and "\n" not in str(exc.value)


def test_bad_input_on_the_command_line_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert pdnode_main(["bench", "inventories/demo", "--requests", "many"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--requests 'many'" in err[0]


def test_concurrency_and_rate_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        pdnode_main(["bench", "inventories/demo", "--rate", "1", "--concurrency", "2"])


def test_client_argv_closed_loop_and_open_loop() -> None:
    wl = bench.workload(args(requests="5", input_len="100", output_len="10", range_ratio="0.25"))
    argv = bench.client_argv("py", base_url="http://h:8000", tokenizer="/t", served_model_name="m", wl=wl,
                             output_file="/o.jsonl")
    # bench_serving through pdnode's wrapper (pdnode.commands.bench_client), which keeps each request's times
    assert argv[:3] == ["py", "-m", "pdnode_bench_client"]
    flags = dict(zip(argv[3::1], argv[4::1]))
    assert flags["--backend"] == "sglang" and flags["--dataset-name"] == "random-ids" and "--tokenize-prompt" in argv
    assert (flags["--num-prompts"], flags["--random-input-len"], flags["--random-output-len"],
            flags["--random-range-ratio"], flags["--max-concurrency"]) == ("5", "100", "10", "0.25", "8")
    assert "--request-rate" not in argv and flags["--warmup-requests"] == "0"
    rate = bench.client_argv("py", base_url="u", tokenizer="t", served_model_name="m",
                             wl=bench.workload(args(rate="3")), output_file="o")
    assert rate[rate.index("--request-rate") + 1] == "3.0" and "--max-concurrency" not in rate


def test_the_api_key_goes_in_the_environment_never_on_the_command_line() -> None:
    env = bench.client_env({"API_KEY": "stray", "PATH": "/bin", "NO_PROXY": "a"}, api_key="sk-1",
                           router_host="10.0.0.5", stub_dir="/s")
    assert env["OPENAI_API_KEY"] == "sk-1" and "API_KEY" not in env
    assert env["NO_PROXY"] == "a,10.0.0.5" and env["HF_HUB_OFFLINE"] == "1" and env["PYTHONPATH"] == "/s"
    assert "OPENAI_API_KEY" not in bench.client_env({"OPENAI_API_KEY": "other"}, api_key=None, router_host="h",
                                                    stub_dir="/s")
    assert bench.client_env({}, api_key=None, router_host="h", stub_dir="/s",
                            requests_file="/w/r.json")["PDNODE_BENCH_REQUESTS_FILE"] == "/w/r.json"


@pytest.mark.parametrize("bind, variables, want", [
    ("0.0.0.0", {"ansible_connection": "local"}, "http://127.0.0.1:8000"),
    ("127.0.0.1", {"ansible_connection": "local"}, "http://127.0.0.1:8000"),
    ("0.0.0.0", {"ansible_host": "gpu01.example.internal"}, "http://gpu01.example.internal:8000"),
    ("0.0.0.0", {}, "http://gpu01:8000"),
    ("10.1.2.3", {"ansible_host": "gpu01.example.internal"}, "http://10.1.2.3:8000"),
    ("0.0.0.0", {"ansible_connection": "community.docker.docker", "ansible_host": "pdnode-demo"},
     "http://172.17.0.9:8000"),
    ("::", {"ansible_host": "fd00::5"}, "http://[fd00::5]:8000"),
])
def test_router_url_as_the_controller_reaches_it(bind: str, variables: dict[str, str], want: str) -> None:
    plan = plan_dict([], [], host=bind)
    docker = {"pdnode-demo": "172.17.0.9"}
    assert bench.router_base_url(plan, variables, "gpu01", resolve_docker=docker.__getitem__) == want


@pytest.mark.parametrize("raw, want", [
    ("http://10.0.0.5:8000", "http://10.0.0.5:8000"), ("http://10.0.0.5:8000/", "http://10.0.0.5:8000"),
    ("https://gw.example.internal", "https://gw.example.internal"), ("http://[fd00::5]:8000", "http://[fd00::5]:8000"),
])
def test_base_url_is_the_router_root(raw: str, want: str) -> None:
    assert bench.checked_base_url(raw) == want


@pytest.mark.parametrize("raw", ["10.0.0.5:8000", "ftp://h:1", "http://", "http://h:99999", "http://h:8000/v1",
                                 "http://u:p@h:8000", "http://h:8000?x=1"])
def test_a_base_url_that_is_not_a_root_is_refused(raw: str) -> None:
    with pytest.raises(bench.BenchError) as exc:
        bench.checked_base_url(raw)
    assert exc.value.code == 1 and f"--base-url {raw!r}" in str(exc.value)


def test_a_loopback_only_router_is_refused_from_elsewhere_with_the_way_out() -> None:
    with pytest.raises(bench.BenchError, match="--base-url"):
        bench.router_base_url(plan_dict([], [], host="127.0.0.1"), {"ansible_host": "gpu01"}, "gpu01")


# --- table and JSON ------------------------------------------------------------------------------
def _report(**over: Any) -> dict[str, Any]:
    plan = plan_dict([{"gpus": [0, 1, 2, 3], "tp_size": 4}],
                     [{"gpus": [4, 5, 6, 7], "tp_size": 4, "attn_dp_size": 4, "ep_size": 4}])
    before = reading(prefill_0=("prefill", prom("prefill", 0, 0, 0), None), decode_0=("decode", prom("decode", 0, 0, 0), None))
    after = reading(prefill_0=("prefill", prom("prefill", 10, 5120, 10), None),
                    decode_0=("decode", prom("decode", 10, 5120, 640), None))
    wl = bench.workload(args(requests="10"))
    kw = {"host": "gpu01", "client": {"name": "sglang.bench_serving", "version": "0.5.23"}, "plan": plan,
          "workload": wl, "record": record(), "before": before, "after": after}
    kw.update(over)
    return bench_report.build_report(**kw)


def test_json_report_has_the_schema_the_planner_reads() -> None:
    rep = json.loads(bench_report.to_json(_report()))
    assert rep["schema"] == "pdnode.bench/1" and rep["host"] == "gpu01"
    assert set(rep["client"]) == {"name", "version"}
    assert set(rep["layout"]) == {"prefill", "decode"}
    assert {"id", "gpus", "tp_size", "dp_size", "attn_dp_size", "ep_size"} <= set(rep["layout"]["decode"][0])
    assert {"requests", "concurrency", "rate", "input_len", "output_len", "range_ratio"} <= set(rep["workload"])
    assert {"duration_s", "completed", "failed", "request_throughput", "input_token_throughput",
            "output_token_throughput", "ttft_s", "itl_s", "e2e_s"} <= set(rep["results"])
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert set(rep["results"][key]) == {"mean", "p50", "p99"}
    assert rep["instances"]["decode-0"] == {"role": "decode", "requests": 10, "prompt_tokens": 5120,
                                            "generation_tokens": 640}
    assert rep["notes"] == []


def test_the_planner_reads_the_report() -> None:
    # the consumer of --json (pdnode plan --measurements) takes it as it is
    from pdnode.core.planner.model import run_from_bench

    run = run_from_bench(json.loads(bench_report.to_json(_report())), "bench.json")
    assert run.request_s == 4.0 and run.ttft_s == 0.04 and run.itl_s == 0.004
    assert (run.workload.input_len, run.workload.output_len, run.workload.concurrency) == (512, 64, 8)


def test_table_shows_the_numbers_for_people() -> None:
    text = bench_report.to_table(_report())
    assert "10 requests, concurrency 8, input 512 / output 64 tokens (fixed)" in text
    assert "prefill-0 GPUs 0-3 TP 4; decode-0 GPUs 4-7 TP 4 attn-DP 4 EP 4" in text
    assert "completed 10 of 10 (0 failed) in 2.50 s" in text
    assert "4.00 req/s, 2048.0 input tok/s, 256.0 output tok/s" in text
    ttft = next(line for line in text.splitlines() if line.startswith("TTFT"))
    assert ttft.split() == ["TTFT", "40.0", "35.0", "90.0"]
    decode = next(line for line in text.splitlines() if line.startswith("decode-0"))
    assert decode.split() == ["decode-0", "decode", "10", "5120", "640"]


def test_unknown_counters_and_failures_are_said_in_notes() -> None:
    rep = _report(before=None, record=record(completed=8, errors=["", "x\nBad Request: too long"]))
    assert rep["instances"] == {} and rep["results"]["failed"] == 2
    assert any("per-instance work unknown" in n for n in rep["notes"])
    assert any("2 requests failed: Bad Request: too long" in n for n in rep["notes"])
    assert "note: 2 requests failed" in bench_report.to_table(rep)


# --- integration: the real client, router and stand-ins ------------------------------------------
def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - the test node's own URL
            return r.status
    except OSError:
        return 0


# in bench_node_variables' ports: the decode with DP attention (it binds port+233..+239), the router
DECODE_PORT_INDEX, ROUTER_PORT_INDEX = 4, 5


def bench_ports() -> list[int]:
    """The ports of bench_node_variables, drawn as the plan checks them (the decode's DP range)."""
    return free_ports(10, dp_attention_at=[DECODE_PORT_INDEX])


def bench_node_variables(model: Path, root: Path, key_file: Path, ports: list[int]) -> dict[str, Any]:
    """The local node's inventory: 2 prefills and a decode with DP attention, on PORTS
    (p0, b0, p1, b1, d0, router, metrics, n0, n1, n2)."""
    p0, b0, p1, b1, d0, router, metrics, n0, n1, n2 = ports
    return {
        "pdnode_gpu_count": 8, "pdnode_gpu_model": "NVIDIA H200 (stand-in)", "pdnode_engine": "sim",
        "pdnode_model_path": str(model), "pdnode_model_served_name": "demo-moe", "pdnode_model_kind": "moe_mla",
        "pdnode_transfer_backend": "mooncake_tcp", "pdnode_router_host": "127.0.0.1", "pdnode_router_port": router,
        "pdnode_router_metrics_port": metrics, "pdnode_sim_decode_ms_per_token": 2.0,
        "pdnode_install_root": str(root), "pdnode_api_key_file": str(key_file),
        "pdnode_sim_prefill_ms_per_token": 0.01, "pdnode_sim_startup_s": 0.0,
        "pdnode_prefill_instances": [{"gpus": [0, 1], "port": p0, "bootstrap_port": b0, "nccl_port": n0},
                                     {"gpus": [2, 3], "port": p1, "bootstrap_port": b1, "nccl_port": n1}],
        "pdnode_decode_instances": [{"gpus": [4, 5, 6, 7], "attn_dp_size": 4, "ep_size": 4, "port": d0,
                                     "nccl_port": n2}],
    }


def test_the_test_nodes_port_draw_refuses_exactly_what_the_plan_refuses(tmp_path: Path) -> None:
    """free_ports redraws a set that build_plan would refuse (a decode's port+233..+239 on
    another port, or past 65535). It runs the plan's port rule on the ports alone (the
    DP-attention instances and plain listeners), so that view of the node is compared with
    the whole plan's verdict: every other port at every offset around the decode's range,
    and the top edge."""
    from pdnode.core.plan.build import PlanError, build_plan

    base = [20000 + 10 * i for i in range(10)]
    cases = []
    for other in (i for i in range(10) if i != DECODE_PORT_INDEX):
        for offset in range(230, 243):
            ports = list(base)
            ports[DECODE_PORT_INDEX] = 40000
            ports[other] = 40000 + offset
            cases.append(ports)
    for top in (65290, 65296, 65297, 65300):
        cases.append([*base[:DECODE_PORT_INDEX], top, *base[DECODE_PORT_INDEX + 1:]])
    verdicts = {True: 0, False: 0}
    for ports in cases:
        variables = bench_node_variables(tmp_path, Path("/opt/pdnode-test"), tmp_path / "key", ports)
        try:
            build_plan(variables, "benchnode")
            accepted = True
        except PlanError:
            accepted = False
        assert plan_accepts(ports, [DECODE_PORT_INDEX]) == accepted, ports
        verdicts[accepted] += 1
    assert verdicts[True] and verdicts[False]  # both verdicts were exercised


@contextlib.contextmanager
def local_node(tmp: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A 2-prefill + 1-decode node on 127.0.0.1, every service requiring API_KEY, started from
    the plan of an inventory with ansible_connection: local (so `pdnode bench` reads the counters directly). Its release
    virtualenv (install.venv, under a private pdnode_install_root) is this Python's, so
    playbooks/bench.yml finds pdnode there. Yields (inventory directory, plan)."""
    from pdnode.core.inventory.read import load_inventory
    from pdnode.core.plan.build import build_plan

    model = tmp / "model"
    model.mkdir()
    # the plan refuses an install root in a system tree (/tmp, /root, ...): a directory of
    # its own under /opt, as a real one would be (removed below)
    scratch = Path(tempfile.mkdtemp(prefix="pdnode-test-bench-", dir="/opt"))
    root = scratch / "root"
    (model / "config.json").write_text((REPO / "playbooks/files/demo-moe/config.json").read_text())
    key_file = tmp / "api-key"  # every service requires it: the client must send it
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o600)
    inv = tmp / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"benchnode": {"ansible_connection": "local"}}}}))
    ports = bench_ports()
    (inv / "group_vars" / "all" / "node.yml").write_text(yaml.safe_dump(bench_node_variables(model, root, key_file, ports)))
    hv = load_inventory(str(inv), None)
    plan = build_plan(hv.variables, hv.host).as_dict()
    venv = Path(plan["install"]["venv"])
    venv.parent.mkdir(parents=True)
    venv.symlink_to(sys.prefix)  # the project's .venv: pdnode, prometheus_client, Ansible
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1", "NO_COLOR": "1",
           "PDNODE_SIM_KV_POOL_MB": "64", "PDNODE_SIM_KV_BYTES_PER_TOKEN": "4096"}
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for sid, svc in plan["services"].items():
            log = open(tmp / f"{sid}.log", "wb")
            logs.append(log)
            if svc["role"] == "router":
                # the plan's router package (smg by default): its arguments are that package's
                module = {"smg": "smg.launch_router"}.get(plan["settings"]["pdnode_router_package"],
                                                          "sglang_router.launch_router")
                argv = [sys.executable, "-m", module, *plan["router_argv"],
                        "--worker-startup-check-interval", "1", "--api-key", API_KEY]
            else:
                cfg = tmp / f"{sid}.json"
                cfg.write_text(json.dumps(svc["args"]))
                argv = [sys.executable, "-m", "pdnode.standin", str(cfg), "--api-key-file", str(key_file)]
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                                          env={**env, **svc.get("environment", {})}, start_new_session=True))
        deadline = time.monotonic() + 90
        while _status(f"http://127.0.0.1:{ports[ROUTER_PORT_INDEX]}/readiness") != 200:
            dead = [p.args for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tails = "\n".join(f"--- {f.name}\n" + Path(f.name).read_text(errors="replace")[-1500:] for f in logs)
                pytest.fail(f"the local node did not come up (exited: {dead})\n{tails}")
            time.sleep(0.2)
        yield inv, plan
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(scratch, ignore_errors=True)
        for f in logs:
            f.close()
        shutil.rmtree(root.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    with local_node(tmp_path_factory.mktemp("bench-node")) as started:
        yield started


@pytest.mark.integration
def test_bench_through_the_real_router_agrees_with_the_engines_counters(
        node: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    inv, _ = node
    out = tmp_path / "report.json"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pdnode.commands.cli", "bench", str(inv), "--json", "--out", str(out),
         "--requests", "24", "--concurrency", "4", "--input-len", "200", "--output-len", "12",
         "--range-ratio", "0.5", "--warmup", "2", "--plot", str(tmp_path / "bench.svg")],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == rep
    res, inst = rep["results"], rep["instances"]
    assert rep["client"]["name"] == "sglang.bench_serving" and rep["client"]["version"] == "0.5.23"
    assert res["completed"] == 24 and res["failed"] == 0
    # lengths drawn from [100, 200] and [6, 12]; ignore_eos: every request gets what it asked for
    assert 24 * 100 <= res["input_tokens"] <= 24 * 200 and 24 * 6 <= res["output_tokens"] <= 24 * 12
    assert list(inst) == ["prefill-0", "prefill-1", "decode-0"]
    prefill = [inst["prefill-0"], inst["prefill-1"]]
    # every measured request passed one prefill and one decode instance, warm-ups excluded
    assert sum(p["requests"] for p in prefill) == 24 and inst["decode-0"]["requests"] == 24
    assert sum(p["prompt_tokens"] for p in prefill) == res["input_tokens"]
    assert inst["decode-0"]["generation_tokens"] == res["output_tokens"]
    assert inst["decode-0"]["prompt_tokens"] == res["input_tokens"]
    # every request's KV went through a prefill's hand-off, measured by the engines (the
    # stand-in moves it through the real Mooncake): one transfer per request it served
    assert all(("kv_handoff" in p) == (p["requests"] > 0) for p in prefill), prefill
    handoffs = [p["kv_handoff"] for p in prefill if "kv_handoff" in p]
    assert sum(h["transfers"] for h in handoffs) == 24
    assert all(h["mean_ms"] > 0 and h["gb_s"] > 0 for h in handoffs), handoffs
    assert "kv_handoff" not in inst["decode-0"]
    assert rep["notes"] == []
    for key in ("ttft_s", "itl_s", "e2e_s"):
        t = res[key]
        assert 0 < t["p50"] <= t["p99"] and t["mean"] > 0, (key, t)
    assert res["ttft_s"]["p99"] <= res["e2e_s"]["p99"]
    # throughput is what was counted over the client's wall time
    assert res["output_token_throughput"] == pytest.approx(res["output_tokens"] / res["duration_s"], rel=1e-6)
    # each request as the client timed it (its own start time, TTFT, latency; warm-ups excluded),
    # and the same numbers its summary was computed from
    reqs = rep["requests"]
    assert len(reqs) == 24 and all(r["ok"] for r in reqs) and min(r["start_s"] for r in reqs) == 0
    assert all(0 < r["ttft_s"] <= r["e2e_s"] for r in reqs)
    assert sum(r["ttft_s"] for r in reqs) / 24 == pytest.approx(res["ttft_s"]["mean"], rel=1e-3)
    assert sum(r["e2e_s"] for r in reqs) / 24 == pytest.approx(res["e2e_s"]["mean"], rel=1e-3)
    # and the picture: one point per request in each series (tests/test_plot.py)
    svg = "{http://www.w3.org/2000/svg}"
    groups = {g.get("id"): len(list(g.iter(f"{svg}use")))
              for g in ET.parse(tmp_path / "bench.svg").getroot().iter(f"{svg}g") if g.get("id", "").startswith("requests-")}  # noqa: S314 (the picture this test wrote)
    assert groups == {"requests-e2e": 24, "requests-ttft": 24}
    assert "running sglang.bench_serving" in proc.stderr
    assert API_KEY not in proc.stdout + proc.stderr
    print(f"pdnode bench (24 requests, local 2P1D stand-in node): {took:.1f} s wall; "
          f"{res['request_throughput']:.1f} req/s, TTFT p50 {res['ttft_s']['p50'] * 1000:.1f} ms")


@pytest.mark.integration
def test_a_wrong_api_key_is_one_line_before_the_client_starts(node: tuple[Path, dict[str, Any]]) -> None:
    _, plan = node
    base = f"http://127.0.0.1:{plan['services']['router']['args']['port']}"
    wl = bench.workload(args(input_len="8", output_len="2"))
    bench.warm_up(base, API_KEY, wl)  # the right key passes
    for key in ("sk-wrong", None):
        with pytest.raises(bench.BenchError) as exc:
            bench.warm_up(base, key, wl)
        assert "HTTP 401" in str(exc.value) and "pdnode_api_key_file" in str(exc.value)
        assert "\n" not in str(exc.value)


@pytest.mark.integration
def test_the_playbook_reads_every_engines_counters_on_the_host(node: tuple[Path, dict[str, Any]],
                                                               tmp_path: Path) -> None:
    inv, plan = node
    # one request, so that some counter is above zero whatever ran before
    bench.warm_up(f"http://127.0.0.1:{plan['services']['router']['args']['port']}", API_KEY,
                  bench.workload(args(input_len="8", output_len="2")))
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    extra = {"bench_counters_dir": str(tmp_path), "ansible_python_interpreter": sys.executable,
             "ansible_become": False}  # this machine is the node here, and needs no sudo
    proc = subprocess.run([str(ansible_playbook), str(REPO / "playbooks" / "bench.yml"), "-i", str(inv),
                           "-e", json.dumps(extra)], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "changed=0" in proc.stdout
    got = json.loads((tmp_path / "benchnode.json").read_text())
    direct = bench_counters.snapshot(plan)  # nothing is sent in between: the same values
    assert got["schema"] == bench_counters.SCHEMA and sorted(got["instances"]) == ["decode-0", "prefill-0", "prefill-1"]
    for iid, inst in got["instances"].items():
        assert inst["error"] is None, inst
        assert inst["metrics"] == direct["instances"][iid]["metrics"]
    decode = bench_report.snapshot_of(got["instances"]["decode-0"])
    assert sum(decode.series("sglang:generation_tokens_total").values()) >= 2


@pytest.mark.integration
def test_the_demo_tokenizer_is_rebuilt_byte_for_byte_and_counts_like_the_stand_in(tmp_path: Path) -> None:
    python = subprocess.run([str(REPO / "scripts" / "sglang-validator")], capture_output=True, text=True,
                            check=True, timeout=3600).stdout.strip().splitlines()[-1]
    subprocess.run([python, str(REPO / "scripts" / "bench-tokenizer"), str(tmp_path)], check=True, timeout=120)
    demo = REPO / "playbooks" / "files" / "demo-moe"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (demo / name).read_bytes(), name
    texts = ["Hello, world! abcdefghi x_y 12345 what's up?", "<|user|>\nWhat is 2+2?\n<|assistant|>\n",
             "  spaced   out\ttabs\nand newlines ", "mountain bridges, 2026-12-01T00:00Z; a.b.c"]
    probe = ("import json, sys\nfrom transformers import AutoTokenizer\n"
             f"t = AutoTokenizer.from_pretrained({str(demo)!r})\n"
             "texts = json.loads(sys.argv[1])\n"
             "print(json.dumps({'vocab_size': t.vocab_size, 'counts': [len(t.encode(x, add_special_tokens=False)) "
             "for x in texts], 'decoded': t.decode(list(range(4, 60)))}))")
    got = json.loads(subprocess.run([python, "-c", probe, json.dumps(texts)], capture_output=True, text=True,
                                    check=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1")).stdout)
    from pdnode.standin.model import count_tokens

    assert got["vocab_size"] == json.loads((demo / "config.json").read_text())["vocab_size"] == 1024
    assert got["counts"] == [count_tokens(t) for t in texts]
    # decoded ids are words the stand-in counts one token each
    assert count_tokens(got["decoded"]) == 56
