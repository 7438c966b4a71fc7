"""The stand-in engine against the real sglang-router 0.3.2 and the real Mooncake transfer
engine, all as processes on 127.0.0.1 (free ports picked at run time).

Times are asserted only from below (a timeout is not reached early; a slowed decode is
slow); why a request failed is read from its error, never from how fast it failed, and a
wait for an event (the heartbeat marking a prefill dead) waits for the event itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error

import pytest

from .node import REPO, FAST_ENV, free_ports, metric_sum, parse_metrics, request, standin_node

PROBE = "What is the capital of France? Answer in one word."
ROUTE_ALL = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
# Deadlines only a broken pair misses: the faults below never deliver, so they always run
# out; a healthy hand-off on a busy machine (load 14 on two cores) stays far inside them.
WAITING_TIMEOUT_S = 8
BOOTSTRAP_TIMEOUT_S = 8
HEARTBEAT_S = 2  # the minimum SGLang accepts
HEARTBEAT_MAX_FAILURE = 2  # one slow /health answer on a busy machine is not a dead prefill


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with standin_node(
        tmp_path_factory.mktemp("node"),
        env={"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(BOOTSTRAP_TIMEOUT_S),
             "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": str(HEARTBEAT_S),
             "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": str(HEARTBEAT_MAX_FAILURE)},
        decode_env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S)},
    ) as n:
        yield n


# --- processes: the node, through the real router ------------------------------------------
@pytest.mark.integration
class TestThroughRouter:
    def test_router_lists_one_prefill_and_one_decode(self, node):
        body = node.get(node.router_url + "/workers").json()
        assert body["stats"]["prefill_count"] == 1 and body["stats"]["decode_count"] == 1
        by_type = {w["worker_type"]: w for w in body["workers"]}
        assert by_type["prefill"]["url"] == node.prefill_url
        assert by_type["prefill"]["bootstrap_port"] == node.ports["bootstrap"]
        assert by_type["decode"]["url"] == node.decode_url
        # what the router kept from /server_info and /model_info
        meta = by_type["decode"]["metadata"]
        assert meta["disaggregation_mode"] == "decode" and meta["tp_size"] == "4"
        assert meta["served_model_name"] == "fake-model" and meta["model_type"] == "llama"
        assert by_type["prefill"]["metadata"]["load_balance_method"] == "follow_bootstrap_room"

    def test_generate_answers_the_probe(self, node):
        resp = node.post(node.router_url + "/generate", {"text": PROBE, "sampling_params": {"max_new_tokens": 8}})
        assert resp.status == 200, resp.text
        body = resp.json()
        assert body["text"] == "Paris"
        meta = body["meta_info"]
        assert meta["finish_reason"] == {"type": "stop", "matched": 2}
        assert meta["prompt_tokens"] == 15 and meta["completion_tokens"] == 1

    def test_generate_length_and_stream(self, node):
        resp = node.post(node.router_url + "/generate", {"text": "Tell me a story", "sampling_params": {"max_new_tokens": 5}})
        body = resp.json()
        assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
        assert body["meta_info"]["completion_tokens"] == 5 and len(body["output_ids"]) == 5
        stream = node.post(node.router_url + "/generate",
                           {"text": "Tell me a story", "sampling_params": {"max_new_tokens": 5}, "stream": True})
        assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
        events = stream.sse()
        assert events[-1] == "[DONE]" and len(events) == 6
        assert events[-2]["text"] == body["text"]  # cumulative text, like SGLang
        assert events[-2]["meta_info"]["finish_reason"]["type"] == "length"

    def test_chat_completions(self, node):
        req = {"model": "fake-model", "messages": [{"role": "user", "content": PROBE}], "max_tokens": 4}
        body = node.post(node.router_url + "/v1/chat/completions", req).json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris", "reasoning_content": None}
        assert body["choices"][0]["finish_reason"] == "stop"
        usage = body["usage"]
        assert usage["completion_tokens"] == 1 and usage["total_tokens"] == usage["prompt_tokens"] + 1

    def test_chat_completions_stream_with_usage(self, node):
        req = {"model": "fake-model", "messages": [{"role": "user", "content": "Tell me a story"}],
               "max_completion_tokens": 6}
        full = node.post(node.router_url + "/v1/chat/completions", req).json()
        resp = node.post(node.router_url + "/v1/chat/completions",
                         {**req, "stream": True, "stream_options": {"include_usage": True}})
        assert resp.status == 200
        raw = resp.text
        assert raw.endswith("data: [DONE]\n\n") and all(b.startswith("data: ") for b in raw.split("\n\n") if b)
        events = resp.sse()
        chunks = events[:-1]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == full["choices"][0]["message"]["content"]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
        assert chunks[-1]["usage"]["prompt_tokens"] == full["usage"]["prompt_tokens"]

    def test_completions(self, node):
        body = node.post(node.router_url + "/v1/completions",
                         {"model": "fake-model", "prompt": "Once upon a time", "max_tokens": 3}).json()
        assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 3 and body["usage"]["prompt_tokens"] == 4
        resp = node.post(node.router_url + "/v1/completions",
                         {"model": "fake-model", "prompt": "Once upon a time", "max_tokens": 3, "stream": True,
                          "stream_options": {"include_usage": True}})
        events = resp.sse()
        assert events[-1] == "[DONE]"
        assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]) == body["choices"][0]["text"]
        assert events[-2]["usage"]["total_tokens"] == 7

    def test_max_tokens_zero_gives_an_empty_completion(self, node):
        body = node.post(node.router_url + "/v1/completions",
                         {"model": "fake-model", "prompt": "hi", "max_tokens": 0}).json()
        assert body["choices"][0]["text"] == "" and body["usage"]["completion_tokens"] == 0

    def test_models_through_the_router(self, node):
        body = node.get(node.router_url + "/v1/models").json()
        assert [m["id"] for m in body["data"]] == ["fake-model"]

    def test_both_sides_saw_the_same_bootstrap_room(self, node):
        resp = node.post(node.router_url + "/v1/completions", {"model": "fake-model", "prompt": "room check", "max_tokens": 2})
        assert resp.status == 200
        prefill, decode = node.recent_requests("prefill")[-1], node.recent_requests("decode")[-1]
        assert prefill["route"] == decode["route"] == "/v1/completions"
        assert isinstance(decode["bootstrap_room"], int) and prefill["bootstrap_room"] == decode["bootstrap_room"]
        assert prefill["status"] == decode["status"] == 200

    def test_counters_move_on_the_right_side(self, node):
        before_p, before_d = node.metrics("prefill"), node.metrics("decode")
        resp = node.post(node.router_url + "/generate", {"text": "count these tokens please", "sampling_params": {"max_new_tokens": 7}})
        assert resp.status == 200
        after_p, after_d = node.metrics("prefill"), node.metrics("decode")

        def delta(before, after, name):
            return metric_sum(after, name) - metric_sum(before, name)

        # both sides count prompt tokens; prefill generates one token, decode all of them
        assert delta(before_p, after_p, "sglang:prompt_tokens_total") == 8
        assert delta(before_d, after_d, "sglang:prompt_tokens_total") == 8
        assert delta(before_p, after_p, "sglang:generation_tokens_total") == 1
        assert delta(before_d, after_d, "sglang:generation_tokens_total") == 7
        assert delta(before_p, after_p, "sglang:num_requests_total") == 1
        assert delta(before_d, after_d, "sglang:time_to_first_token_seconds_count") == 1
        assert delta(before_p, after_p, "sglang:time_to_first_token_seconds_count") == 0
        assert delta(before_d, after_d, "sglang:inter_token_latency_seconds_count") == 6

    def test_kv_transfer_is_measured(self, node):
        long_prompt = " ".join(["word"] * 2000)  # 2000 tokens x 16 KiB = 31.25 MiB of KV
        resp = node.post(node.router_url + "/generate", {"text": long_prompt, "sampling_params": {"max_new_tokens": 2}})
        assert resp.status == 200
        fams = node.metrics("prefill")
        assert metric_sum(fams, "sglang:kv_transfer_total_mb_sum") >= 2000 * 16384 / 2**20
        count = metric_sum(fams, "sglang:kv_transfer_speed_gb_s_count")
        speed = metric_sum(fams, "sglang:kv_transfer_speed_gb_s_sum")
        assert count >= 1 and speed > 0
        assert metric_sum(fams, "sglang:kv_transfer_latency_ms_sum") > 0
        assert metric_sum(fams, "sglang:kv_transfer_bootstrap_ms_count") >= 1
        # decode observes bootstrap timings, not the transfer itself (like SGLang)
        d = node.metrics("decode")
        assert metric_sum(d, "sglang:kv_transfer_bootstrap_ms_count") >= 1
        assert metric_sum(d, "sglang:kv_transfer_speed_gb_s_count") == 0

    def test_metric_labels(self, node):
        d = node.metrics("decode")
        running = d["sglang:num_running_reqs"]
        assert sorted(lab["dp_rank"] for _, lab, _ in running) == ["0", "1", "2", "3"]
        for _, lab, _ in running:
            assert lab["engine_type"] == "decode" and lab["model_name"] == "fake-model"
            assert lab["tp_rank"] == lab["dp_rank"] and lab["moe_ep_rank"] == lab["tp_rank"] and lab["pp_rank"] == "0"
        p = node.metrics("prefill")
        (_, lab, _), = p["sglang:num_prefill_bootstrap_queue_reqs"]
        assert lab == {"model_name": "fake-model", "engine_type": "prefill", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        ttft = [lab for name, lab, _ in d["sglang:time_to_first_token_seconds"] if name.endswith("_count")]
        assert ttft and set(ttft[0]) == {"model_name", "engine_type", "is_streaming"}
        for family in ("sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_total_mb", "sglang:queue_time_seconds",
                       "sglang:e2e_request_latency_seconds", "sglang:inter_token_latency_seconds"):
            assert family in p or family in d

    def test_router_metrics_listener(self, node):
        text = request("GET", node.router_metrics_url).text
        assert "smg_" in text


# --- processes: the workers' own surface ----------------------------------------------------
@pytest.mark.integration
class TestWorkers:
    def test_bootstrap_route(self, node):
        info = request("GET", node.bootstrap_url + ROUTE_ALL).json()
        assert info["attn_tp_size"] == 4 and info["dp_size"] == 1 and info["pp_size"] == 1
        assert info["follow_bootstrap_room"] is True and info["prefill_http_port"] == node.ports["prefill"]
        rank = request("GET", node.bootstrap_url + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=3&target_pp_rank=0").json()
        assert rank["rank_ip"] == "127.0.0.1" and isinstance(rank["rank_port"], int)
        assert request("GET", node.bootstrap_url + "/health").text == "OK"
        assert request("GET", node.bootstrap_url + "/route").status == 400

    def test_server_and_model_info(self, node):
        for old, new in (("/get_server_info", "/server_info"), ("/get_model_info", "/model_info")):
            assert node.get(node.decode_url + old).json().keys() == node.get(node.decode_url + new).json().keys()
        info = node.get(node.decode_url + "/server_info").json()
        assert (info["tp_size"], info["dp_size"], info["attn_dp_size"], info["ep_size"]) == (4, 1, 4, 4)
        assert info["disaggregation_mode"] == "decode" and info["load_balance_method"] == "round_robin"
        assert info["version"].startswith("0.5.23") and "api_key" not in info
        minfo = node.get(node.prefill_url + "/model_info").json()
        assert minfo["served_model_name"] == "fake-model" and minfo["architectures"] == ["LlamaForCausalLM"]
        assert minfo["disaggregation_mode"] == "prefill"

    def test_health_generate(self, node):
        for url in (node.prefill_url, node.decode_url):
            assert request("GET", url + "/health_generate").status == 200

    def test_request_without_bootstrap_room_is_rejected_like_sglang(self, node):
        resp = node.post(node.decode_url + "/generate", {"text": "hi"})
        assert resp.status == 400
        assert "Disaggregated request received without bootstrap room id" in resp.json()["error"]["message"]
        resp = node.post(node.prefill_url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert resp.status == 400 and resp.json()["object"] == "error"

    def test_unknown_route_is_fastapi_404(self, node):
        resp = node.get(node.decode_url + "/nope")
        assert resp.status == 404 and resp.json() == {"detail": "Not Found"}

    def test_dual_dispatch_like_the_router(self, node):
        p, d = node.pd_request("/generate", {"text": PROBE, "sampling_params": {"max_new_tokens": 4}}, room=12345)
        assert p.status == d.status == 200
        assert d.json()["text"] == "Paris"
        assert p.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 0}  # a real prefill's answer
        assert p.json()["meta_info"]["completion_tokens"] == 1


# --- faults ---------------------------------------------------------------------------------
@pytest.mark.integration
class TestFaults:
    def test_wrong_output_and_slow(self, node):
        node.set_faults("decode", ["wrong_output", "slow:40"])
        try:
            t0 = time.monotonic()
            p, d = node.pd_request("/generate", {"text": "Tell me a story", "sampling_params": {"max_new_tokens": 4}})
            elapsed = time.monotonic() - t0
            assert d.status == 200 and elapsed >= 3 * 2 * 40 / 1000  # 3 inter-token gaps of 2 ms x 40
            p, d = node.pd_request("/generate", {"text": PROBE})
            assert d.json()["text"] == "Lyon"
        finally:
            node.set_faults("decode", [])
        p, d = node.pd_request("/generate", {"text": PROBE})
        assert d.json()["text"] == "Paris"

    def test_metric_faults(self, node):
        node.set_faults("decode", ["rename_metric"])
        try:
            text = node.get(node.decode_url + "/metrics").text
            assert "sglang:request_e2e_latency_seconds_count" in text
            assert "sglang:e2e_request_latency_seconds" not in text
            node.set_faults("decode", ["rename_metric:sglang:num_running_reqs=sglang:running_requests"])
            fams = parse_metrics(node.get(node.decode_url + "/metrics").text)
            assert "sglang:running_requests" in fams and "sglang:num_running_reqs" not in fams
            node.set_faults("decode", ["no_metrics"])
            assert node.get(node.decode_url + "/metrics").status == 404
        finally:
            node.set_faults("decode", [])
        assert node.get(node.decode_url + "/metrics").status == 200
        assert node.post(node.decode_url + "/sim/faults", {"faults": ["melt"]}).status == 400

    def test_bootstrap_down(self, node):
        before_p, before_d = node.metrics("prefill"), node.metrics("decode")
        dead = "heartbeats: marking it dead"
        seen = node.log("decode").count(dead)
        node.set_faults("prefill", ["bootstrap_down"])
        try:
            with pytest.raises(urllib.error.URLError):
                request("GET", node.bootstrap_url + ROUTE_ALL, timeout=2)
            # decode's heartbeat (every HEARTBEAT_S) marks the prefill dead: wait for it to say so
            deadline = time.monotonic() + 120
            while node.log("decode").count(dead) == seen:
                assert time.monotonic() < deadline, node.logs_tail()
                time.sleep(0.1)
            t0 = time.monotonic()
            p, d = node.pd_request("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
            elapsed = time.monotonic() - t0
        finally:
            node.set_faults("prefill", [])
        assert request("GET", node.bootstrap_url + ROUTE_ALL).status == 200
        assert d.status == 500 and "Decode handshake failed" in d.json()["message"]
        assert p.status == 500 and "KVPoll.Bootstrapping" in p.json()["message"]
        assert elapsed >= BOOTSTRAP_TIMEOUT_S  # it waited out the bootstrap timeout (the errors say which)
        name = "sglang:num_bootstrap_failed_reqs_total"
        assert metric_sum(node.metrics("decode"), name) - metric_sum(before_d, name) == 1
        assert metric_sum(node.metrics("prefill"), name) - metric_sum(before_p, name) == 1
        p, d = node.pd_request("/generate", {"text": PROBE})  # bootstraps again once it is back
        assert d.status == 200 and d.json()["text"] == "Paris"

    def test_transfer_stall_times_out_on_decode(self, node):
        before_p, before_d = node.metrics("prefill"), node.metrics("decode")
        node.set_faults("prefill", ["transfer_stall"])
        try:
            t0 = time.monotonic()
            p, d = node.pd_request("/generate", {"text": "stall me", "sampling_params": {"max_new_tokens": 2}})
            elapsed = time.monotonic() - t0
        finally:
            node.set_faults("prefill", [])
        assert d.status == 500 and p.status == 500
        # SGLang's form, with the seconds the decode waited: at least the timeout, and more
        # on a busy machine (the timer fires late), so the number is a floor, not a prefix
        waited = re.search(r"timed out after ([0-9.]+)s in KVPoll", d.json()["message"])
        assert waited and float(waited.group(1)) >= WAITING_TIMEOUT_S - 0.05, d.json()["message"]
        assert "KVPoll.WaitingForInput" in d.json()["message"]
        assert elapsed >= WAITING_TIMEOUT_S  # the message above says it was that timeout
        after_p, after_d = node.metrics("prefill"), node.metrics("decode")
        name = "sglang:num_transfer_failed_reqs_total"
        assert metric_sum(after_d, name) - metric_sum(before_d, name) == 1
        assert metric_sum(after_p, name) - metric_sum(before_p, name) == 1
        # the pair still works afterwards
        p, d = node.pd_request("/generate", {"text": PROBE})
        assert d.status == 200 and d.json()["text"] == "Paris"

    def test_error500_on_prefill_fails_through_the_router(self, node):
        node.set_faults("prefill", ["error500"])
        try:
            resp = node.post(node.router_url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        finally:
            node.set_faults("prefill", [])
        assert resp.status == 500, resp.text
        # router 0.3.2 answers with decode's error: the prefill failed the room, so decode aborted
        assert resp.json()["error"]["code"] == "decode_internal_error"
        rooms = [r["bootstrap_room"] for r in node.recent_requests("decode") if r["status"] == 500]
        assert len(set(rooms[-5:])) == 5  # the router retried, each time with a new room


# --- processes: API key, start-up and shutdown ----------------------------------------------
@pytest.mark.integration
def test_api_key_is_enforced_and_shutdown_is_clean(tmp_path):
    with standin_node(tmp_path, api_key="s3cret-key") as n:
        for url in (n.prefill_url, n.decode_url):
            assert n.get(url + "/server_info", auth=False).status == 401
            assert n.get(url + "/server_info", auth=False).json() == {"error": "Unauthorized"}
            assert n.get(url + "/server_info").status == 200
            assert n.get(url + "/health", auth=False).status == 200
            assert n.get(url + "/metrics", auth=False).status == 200
        assert request("GET", n.decode_url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status == 401
        # the router passes its --api-key to the workers and asks it from clients
        assert n.post(n.router_url + "/generate", {"text": PROBE}, auth=False).status == 401
        resp = n.post(n.router_url + "/generate", {"text": PROBE})
        assert resp.status == 200 and resp.json()["text"] == "Paris"
    assert n.exit_codes["prefill"] == 0 and n.exit_codes["decode"] == 0
    for role in ("prefill", "decode"):
        assert "s3cret-key" not in n.log(role)
        assert "stopped" in n.log(role)


@pytest.mark.integration
def test_health_is_503_while_loading(tmp_path):
    """503 for as long as the model loads, 200 after. The 503 is read from a stand-in whose
    load outlasts the test (no window the poller could miss on a busy machine); the 200
    from one that loads for a moment."""

    def start(startup_s: float) -> tuple[subprocess.Popen, int]:
        (port,) = free_ports(1)
        args = tmp_path / f"unified-{port}.json"
        args.write_text(json.dumps({"host": "127.0.0.1", "port": port, "model_path": "m", "enable_metrics": True}))
        env = {**os.environ, **FAST_ENV, "PDNODE_SIM_STARTUP_S": str(startup_s), "PYTHONPATH": str(REPO / "src")}
        return subprocess.Popen([sys.executable, "-m", "pdnode.standin", str(args)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT), port

    def first_answer(proc: subprocess.Popen, port: int, want: int | None = None) -> int:
        """The first status /health answers (or, with want, the first that is want)."""
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, f"/health on {port}: no answer{f' {want}' if want else ''}"
            try:
                status = request("GET", f"http://127.0.0.1:{port}/health", timeout=5).status
                if want is None or status == want:
                    return status
            except OSError:
                pass
            time.sleep(0.05)

    for startup_s in (3600, 0.5):
        proc, port = start(startup_s)
        try:
            if startup_s > 60:
                assert first_answer(proc, port) == 503  # loading
                continue
            first_answer(proc, port, want=200)
            body = request("POST", f"http://127.0.0.1:{port}/generate", {"text": PROBE}).json()
            assert body["text"] == "Paris"  # disaggregation_mode null: no bootstrap needed
            info = request("GET", f"http://127.0.0.1:{port}/model_info").json()
            assert info["served_model_name"] == "m" and info["disaggregation_mode"] == "null"
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out.decode()  # a stop while loading is clean too


# --- no processes: configuration --------------------------------------------------------------
def test_a_broken_config_json_is_refused_as_sglang_refuses_it(tmp_path):
    from pdnode.standin.config import ConfigError, server_settings_from_dict

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a JSON object"):
        server_settings_from_dict({"model_path": str(tmp_path)})
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ConfigError, match="is not a JSON object"):
        server_settings_from_dict({"model_path": str(tmp_path)})
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert server_settings_from_dict({"model_path": str(tmp_path)}).resolved["model_path"] == str(tmp_path)


def test_config_refuses_unknown_fields_and_bad_topology(tmp_path):
    from pdnode.standin.config import ConfigError, load_sim_settings, server_settings_from_dict

    with pytest.raises(ConfigError, match="unknown ServerArgs field"):
        server_settings_from_dict({"model_path": "m", "tp_sz": 4})
    with pytest.raises(ConfigError, match="multiple of attn_dp_size"):
        server_settings_from_dict({"model_path": "m", "tp_size": 1, "attn_dp_size": 4})
    with pytest.raises(ConfigError, match="api-key-file"):
        server_settings_from_dict({"model_path": "m", "api_key": "x"})
    with pytest.raises(ConfigError, match="api-key-file"):
        server_settings_from_dict({"model_path": "m", "admin_api_key": "x"})
    assert server_settings_from_dict({"model_path": "m", "watermark_key": "k"}).resolved["watermark_key"] == "<redacted>"
    s = server_settings_from_dict({"model_path": "/m", "tp_size": 4, "dp_size": 4, "enable_dp_attention": True,
                                   "disaggregation_mode": "decode", "mem_fraction_static": 0.8})
    assert (s.attn_dp_size, s.dp_size, s.served_model_name, s.bootstrap_port) == (4, 1, "/m", 8998)
    with pytest.raises(ConfigError, match="PDNODE_SIM_FAULTS"):
        load_sim_settings({"PDNODE_SIM_FAULTS": "error500,melt"})
    sim = load_sim_settings({"PDNODE_SIM_FAULTS": "slow:3, transfer_stall", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "7"})
    assert sim.faults == ("slow:3", "transfer_stall") and sim.waiting_timeout_s == 7


def test_standin_exits_2_on_a_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_path": "m", "no_such_field": 1}))
    proc = subprocess.run([sys.executable, "-m", "pdnode.standin", str(bad)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=60)
    assert proc.returncode == 2 and "no_such_field" in proc.stderr


def test_model_is_deterministic():
    from pdnode.standin import model

    a = model.generate("some prompt", 10)
    assert a == model.generate("some prompt", 10) and len(a.words) == 10
    assert model.generate(PROBE, 10).text == "Paris"
    assert model.generate(PROBE, 10, wrong=True).text != "Paris"
    assert model.generate(PROBE, 0).words == [] and model.generate(PROBE, 0).finish_reason["type"] == "length"
    assert model.count_tokens(PROBE) == 15 and len(model.tokenize(PROBE)) == 15
