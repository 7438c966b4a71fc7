"""The one load generator (pdnode.node.loadgen): every failure form planted against it by
a local HTTP server, each counted failed with its kind; a correct stream and body counted
ok; the tally's counts (started, finished, the longest gap and request); the zero-drop
judgement, including a stalled request that only the bounds catch.

The answers are built with the stand-in's protocol (SGLang's shapes). Counts and lower
bounds only: a busy machine changes how long the tests take, not what they assert.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pdnode.node import loadgen
from pdnode.standin import protocol

Answer = Callable[[BaseHTTPRequestHandler, int, dict[str, Any]], None]


@contextlib.contextmanager
def server(answer: Answer) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(base URL, the request bodies seen) of a server answering its n-th POST (from 0)
    with ANSWER(handler, n, its JSON body)."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                n = len(seen)
                seen.append(body)
            answer(self, n, body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # a client gone before the answer (the timeout case) is the point, not an error

    srv = Server(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() waits a poll
    try:
        yield f"http://127.0.0.1:{srv.server_port}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def send(h: BaseHTTPRequestHandler, code: int, data: bytes, content_type: str = "application/json") -> None:
    h.send_response(code)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def chunk(text: str, finish: dict[str, Any] | None = None) -> bytes:
    return protocol.sse(protocol.completion_chunk(rid="r1", created=0, model="m", text=text, finish=finish))


LENGTH = {"type": "length", "length": 2}
GOOD_STREAM = chunk("Paris") + chunk(" is", LENGTH) + protocol.SSE_DONE
GOOD_BODY = json.dumps(protocol.completion_body(rid="r1", created=0, model="m", text="Paris is", finish=LENGTH,
                                                prompt_tokens=3, completion_tokens=2)).encode()
# SGLang's failure after admission (bootstrap, KV transfer) while streaming: 200, the
# error as a chunk, then [DONE].
KV_FAILED = protocol.sse(protocol.error_stream_openai("KV transfer failed: bootstrap timeout", 500))


def answer_with(code: int, data: bytes, content_type: str = "application/json") -> Answer:
    return lambda h, n, body: send(h, code, data, content_type)


def cut_body(h: BaseHTTPRequestHandler, n: int, body: dict[str, Any]) -> None:
    """A 200 promising more body than it sends, then the connection closed."""
    h.send_response(200)
    h.send_header("Content-Length", "1000")
    h.end_headers()
    h.wfile.write(GOOD_STREAM[:40])
    h.close_connection = True


def hang_up(h: BaseHTTPRequestHandler, n: int, body: dict[str, Any]) -> None:
    h.close_connection = True  # no answer at all


def stall(seconds: float, then: Answer) -> Answer:
    def answer(h: BaseHTTPRequestHandler, n: int, body: dict[str, Any]) -> None:
        time.sleep(seconds)
        then(h, n, body)

    return answer


SSE = "text/event-stream"
CASES = {  # id: (answer, stream, kind, status)
    "good stream": (answer_with(200, GOOD_STREAM, SSE), True, "", 200),
    "good body": (answer_with(200, GOOD_BODY), False, "", 200),
    "503": (answer_with(503, json.dumps(protocol.error_openai("no worker", 503)).encode()), False, "status", 503),
    "500 while streaming": (answer_with(500, b"{}"), True, "status", 500),
    "broken mid-body": (cut_body, True, "connection", 0),
    "hung up without an answer": (hang_up, False, "connection", 0),
    "no answer in time": (stall(3.0, answer_with(200, GOOD_BODY)), False, "timeout", 0),
    "error body": (answer_with(200, json.dumps(protocol.error_generate("KV transfer failed")).encode()), False,
                   "error-body", 200),
    "error body beside choices": (answer_with(200, json.dumps({**json.loads(GOOD_BODY), "error": "late"}).encode()),
                                  False, "error-body", 200),
    "error shape without choices": (answer_with(200, json.dumps(protocol.error_openai("x", 500)).encode()), False,
                                    "no-choices", 200),
    "empty choices": (answer_with(200, b'{"choices": []}'), False, "no-choices", 200),
    "body not JSON": (answer_with(200, b"<html>bad gateway</html>", "text/html"), False, "no-choices", 200),
    "error chunk then DONE": (answer_with(200, chunk("Paris") + KV_FAILED + protocol.SSE_DONE, SSE), True,
                              "error-chunk", 200),
    "only an error chunk then DONE": (answer_with(200, KV_FAILED + protocol.SSE_DONE, SSE), True, "error-chunk", 200),
    "chunk not JSON": (answer_with(200, b"data: {oops\n\n" + GOOD_STREAM, SSE), True, "bad-chunk", 200),
    "stream without finish_reason": (answer_with(200, chunk("Paris") + chunk(" is") + protocol.SSE_DONE, SSE), True,
                                     "no-finish", 200),
    "stream without content": (answer_with(200, chunk("") + chunk("", LENGTH) + protocol.SSE_DONE, SSE), True,
                               "no-content", 200),
    "stream without DONE": (answer_with(200, chunk("Paris") + chunk(" is", LENGTH), SSE), True, "no-done", 200),
    "DONE alone": (answer_with(200, protocol.SSE_DONE, SSE), True, "no-choices", 200),
}


# Answers that are empty in ways a truthy `choices` hides, each a failure of the same kind
# whether it comes as the body or as the one chunk of a stream (loadgen.served() judges
# both): id -> (the JSON object, kind).
EMPTY_ANSWERS = {
    "a choice with nothing in it": ({"choices": [{}]}, "no-finish"),
    "choices a string": ({"choices": "x"}, "no-choices"),
    "choices a list of strings": ({"choices": ["Paris"]}, "no-choices"),
    "empty text, no finish_reason": ({"choices": [{"index": 0, "text": ""}]}, "no-finish"),
    "empty text with a finish_reason": ({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
                                        "no-content"),
    "text without a finish_reason": ({"choices": [{"index": 0, "text": "Paris", "finish_reason": None}]},
                                     "no-finish"),
    "a good choice beside an error": ({"choices": [{"text": "Paris", "finish_reason": "length"}], "error": "late"},
                                      "error"),
}


@pytest.mark.parametrize("case", EMPTY_ANSWERS)
def test_an_empty_answer_fails_alike_streamed_or_not(case):
    doc, kind = EMPTY_ANSWERS[case]
    body_kind, _ = loadgen.judge(json.dumps(doc).encode(), stream=False)
    stream_kind, _ = loadgen.judge(protocol.sse(doc) + protocol.SSE_DONE, stream=True)
    if kind == "error":  # the one difference: which form carried the error
        assert (body_kind, stream_kind) == ("error-body", "error-chunk")
    else:
        assert body_kind == stream_kind == kind, (body_kind, stream_kind)


def test_a_good_answer_passes_alike_streamed_or_not():
    """What the empty answers lack, present: a text (completions' `text`, chat's
    `message.content` or a stream's `delta.content`) and a finish_reason."""
    for choice in ({"text": "Paris", "finish_reason": "length"},
                   {"message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"},
                   {"delta": {"content": "Paris"}, "finish_reason": "stop"}):
        doc = {"choices": [choice]}
        assert loadgen.judge(json.dumps(doc).encode(), stream=False) == ("", "")
        assert loadgen.judge(protocol.sse(doc) + protocol.SSE_DONE, stream=True) == ("", "")


@pytest.mark.parametrize("case", CASES)
def test_each_answer_is_judged_and_counted_with_its_kind(case):
    answer, stream, kind, status = CASES[case]
    tally = loadgen.Tally(time.monotonic())
    with server(answer) as (url, seen):
        tally.begin()
        out = loadgen.request(url + "/v1/completions", loadgen.completion("m", "p", 2, stream), timeout=1.0)
        tally.record(time.monotonic(), out)
    assert (out.kind, out.status) == (kind, status), out
    assert kind == "" or kind in loadgen.KINDS
    assert bool(seen[0].get("stream")) is stream and seen[0]["ignore_eos"] is True
    r = tally.result(time.monotonic())
    assert (r["requests_started"], r["requests"], r["codes"]) == (1, 1, {str(status): 1})
    assert (r["ok"], r["failed"], r["failures"]) == ((1, 0, {}) if kind == "" else (0, 1, {kind: 1}))


def test_a_refused_connection_is_a_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed on leaving: nothing listens there
    out = loadgen.request(f"http://127.0.0.1:{port}/v1/completions", loadgen.completion("m", "p", 2, False),
                          timeout=5.0)
    assert (out.kind, out.status) == ("connection", 0), out


def test_the_load_counts_each_failure_by_kind():
    """One client, the server's answers in order: two ok, then one of each 200 failure the
    old counting took for a success, a 503, then ok for ever."""
    script = [answer_with(200, GOOD_BODY)] * 2 + [
        answer_with(200, json.dumps(protocol.error_generate("KV transfer failed")).encode()),
        answer_with(200, json.dumps(protocol.error_openai("x", 500)).encode()),
        answer_with(503, b"{}"),
    ]

    def answer(h: BaseHTTPRequestHandler, n: int, body: dict[str, Any]) -> None:
        (script[n] if n < len(script) else script[0])(h, n, body)

    with server(answer) as (url, seen), loadgen.Load(url, "m", timeout=30) as load:
        wait_finished(load, len(script) + 3)
    r = load.result
    assert r["requests_started"] == r["requests"] == len(seen)
    assert r["failures"] == {"error-body": 1, "no-choices": 1, "status": 1}
    assert (r["failed"], r["ok"]) == (3, len(seen) - 3)
    assert r["codes"] == {"200": len(seen) - 1, "503": 1}
    assert [f["kind"] for f in r["first_failures"]] == ["error-body", "no-choices", "status"]


def test_the_streaming_loops_fail_on_an_error_chunk():
    """--stream: every second client streams; each stream answered with SGLang's error
    chunk and [DONE] fails, each body succeeds."""
    def answer(h: BaseHTTPRequestHandler, n: int, body: dict[str, Any]) -> None:
        if body.get("stream"):
            send(h, 200, chunk("Paris") + KV_FAILED + protocol.SSE_DONE, SSE)
        else:
            send(h, 200, GOOD_BODY)

    with server(answer) as (url, seen), loadgen.Load(url, "m", clients=2, stream=True, timeout=30) as load:
        wait_finished(load, 8)
    r = load.result
    streams = sum(1 for b in seen if b.get("stream"))
    assert streams >= 1 and len(seen) - streams >= 1
    assert r["requests"] == len(seen) and r["failures"] == {"error-chunk": streams}
    assert r["ok"] == len(seen) - streams


def wait_finished(load: loadgen.Load, n: int) -> None:
    end = time.monotonic() + 120  # a second on a quiet machine
    while load.finished < n:
        assert load.running() and time.monotonic() < end, load.finished
        time.sleep(0.02)


# --- the tally --------------------------------------------------------------------------

OK = loadgen.Outcome(200, "")


def fail(status: int, kind: str = "status", detail: str = "") -> loadgen.Outcome:
    return loadgen.Outcome(status, kind, detail)


def test_tally_longest_gap_spans_failures_between_two_successes():
    t = loadgen.Tally(100.0)
    for when, outcome in ((100.1, OK), (100.2, OK), (100.3, fail(0, "connection", "refused")), (100.9, fail(502)),
                          (101.5, OK), (101.6, OK)):
        t.record(when, outcome)
    r = t.result(101.7)
    assert (r["requests"], r["ok"], r["failed"]) == (6, 4, 2)
    assert r["codes"] == {"0": 1, "200": 4, "502": 1}
    assert r["failures"] == {"connection": 1, "status": 1}
    assert r["longest_gap_s"] == pytest.approx(1.3)  # 100.2 -> 101.5
    assert r["longest_gap_at_s"] == pytest.approx(0.2)
    assert [(f["code"], f["kind"]) for f in r["first_failures"]] == [(0, "connection"), (502, "status")]
    assert r["outages"] == [{"at_s": 0.2, "at": 0.2, "length_s": 1.3, "failed": 2}]


def test_tally_a_200_carrying_an_error_is_no_success():
    t = loadgen.Tally(0.0)
    t.record(0.1, OK)
    t.record(2.0, fail(200, "error-chunk"))
    r = t.result(2.1)
    assert (r["ok"], r["failed"], r["codes"], r["failures"]) == (1, 1, {"200": 2}, {"error-chunk": 1})
    assert r["longest_gap_s"] == pytest.approx(2.0)  # 0.1 -> the stop: the error closed nothing


def test_tally_lists_each_outage_with_its_wall_clock_time():
    t = loadgen.Tally(10.0, wall=1000.0)
    for when, outcome in ((10.1, OK), (10.2, fail(503)), (12.1, OK), (12.2, OK), (12.7, OK), (15.0, OK)):
        t.record(when, outcome)
    r = t.result(15.1)
    assert r["started_at"] == 1000.0
    assert r["outages"] == [{"at_s": 0.1, "at": 1000.1, "length_s": 2.0, "failed": 1},
                            {"at_s": 2.7, "at": 1002.7, "length_s": 2.3, "failed": 0}]


def test_tally_the_start_and_the_stop_are_edges_of_a_gap():
    t = loadgen.Tally(0.0)
    t.record(3.0, OK)
    assert t.result(3.5)["longest_gap_s"] == pytest.approx(3.0)  # start -> the first success
    t = loadgen.Tally(0.0)
    t.record(0.1, OK)
    t.record(0.2, fail(503))
    r = t.result(5.0)
    assert r["longest_gap_s"] == pytest.approx(4.9) and r["failed"] == 1  # the last success -> the stop
    assert loadgen.Tally(0.0).result(7.0)["longest_gap_s"] == pytest.approx(7.0)  # never a success


def test_tally_a_slow_answer_is_a_gap_and_a_long_request_without_failures():
    # A router that holds requests while it restarts fails none, but nothing answers.
    t = loadgen.Tally(0.0)
    for when, took in ((0.1, 0.1), (0.2, 0.1), (3.2, 3.0), (3.3, 0.1)):
        t.record(when, OK, took)
    r = t.result(3.4)
    assert r["failed"] == 0
    assert r["longest_gap_s"] == pytest.approx(3.0)
    assert r["longest_request_s"] == pytest.approx(3.0)


def test_tally_keeps_only_the_first_failures():
    t = loadgen.Tally(0.0)
    for i in range(50):
        t.record(i * 0.1, fail(500, "status", "x" * 500))
    r = t.result(5.0)
    assert len(r["first_failures"]) == loadgen.MAX_SAMPLES
    assert len(r["first_failures"][0]["error"]) == loadgen.DETAIL_CHARS


def test_tally_counts_requests_started_and_finished():
    t = loadgen.Tally(0.0)
    for _ in range(3):
        t.begin()
    t.record(0.5, OK, 0.5)
    t.record(0.6, OK, 0.6)
    r = t.result(1.0)
    assert (r["requests_started"], r["requests"]) == (3, 2)


# --- the zero-drop judgement ------------------------------------------------------------

def tally_result(n_ok: int, *, began: int | None = None, failed: tuple[str, ...] = (),
                 change_at: float | None = 0.55) -> dict[str, Any]:
    """N_OK successes 0.1 s apart (0.05 s each), then FAILED's kinds, stopped 0.1 s after;
    the change under load at CHANGE_AT (by default after the first five)."""
    t = loadgen.Tally(0.0, change_at=change_at)
    for i in range(n_ok):
        t.begin()
        t.record(0.1 * (i + 1), OK, 0.05)
    for kind in failed:
        t.begin()
        t.record(0.1 * n_ok + 0.01, fail(200, kind))
    for _ in range((began or 0) - n_ok - len(failed)):
        t.begin()
    return t.result(0.1 * (n_ok + 1))


def problems(result: dict[str, Any]) -> list[str]:
    return loadgen.zero_drop_problems(result, min_requests=20, max_gap_s=1.0, max_request_s=1.0)


def test_zero_drop_passes_enough_load_without_a_failure():
    assert problems(tally_result(30)) == []


def test_zero_drop_names_each_problem_with_its_counts():
    r = tally_result(30, failed=("error-chunk", "error-chunk", "no-done"))
    assert problems(r) == [f"3 of 33 requests failed (error-chunk 2, no-done 1); the first: {r['first_failures'][:3]}"]
    assert problems(tally_result(30, began=32)) == ["2 of 32 requests started never finished"]
    assert problems(tally_result(10)) == [
        "only 10 requests finished in 1.1 s; at least 20 must, for the run to prove anything"]


def bound_why(r: dict[str, Any], floor: float) -> str:
    return (f"(the larger of {floor} s and 10 x the {r['pace']['median_request_s']} s a request took before "
            f"the change)")


def test_a_request_stalled_past_the_bound_fails_the_gap_and_request_bounds():
    """One client; the change begins after its fifth success; the server holds a request
    after it 2 s, then answers it correctly: nothing failed, but the run is no zero-drop
    proof under a 1 s bound (its requests before took milliseconds)."""
    def answer(h: BaseHTTPRequestHandler, n: int, body: dict[str, Any]) -> None:
        if n == 8:
            time.sleep(2.0)
        send(h, 200, GOOD_BODY)

    with server(answer) as (url, _), loadgen.Load(url, "m", timeout=30) as load:
        wait_finished(load, 5)
        load.mark_change()
        wait_finished(load, 10)
    r = load.result
    assert r["failed"] == 0 and r["requests"] >= 10 and r["pace"]["requests_before"] >= 5
    assert r["longest_gap_s"] >= 2.0 and r["longest_request_s"] >= 2.0
    found = loadgen.zero_drop_problems(r, min_requests=5, max_gap_s=1.0, max_request_s=1.0)
    assert found == [
        f"{r['longest_gap_s']} s without a success (from {r['longest_gap_at_s']} s into the load), over the bound "
        f"of 1 s {bound_why(r, 1.0)}",
        f"a request took {r['longest_request_s']} s, over the bound of 1 s {bound_why(r, 1.0)}"]


def test_the_stall_bounds_grow_with_the_pace_before_the_change():
    """A load whose requests took 0.5 s before the change (a busy machine) may have a 3 s
    stretch without a success: under 10 x its pace; at 0.05 s a request, 3 s is a stall."""
    def run(took: float) -> dict[str, Any]:
        t = loadgen.Tally(0.0, change_at=5.0)
        for i in range(10):
            t.begin()
            t.record(0.5 * (i + 1), OK, took)
        t.begin()
        t.record(8.0, OK, 3.0)  # 3 s after the last success
        return t.result(8.0)

    slow, fast = run(0.5), run(0.05)
    assert slow["pace"] == {"change_at_s": 5.0, "requests_before": 10, "median_request_s": 0.5}
    assert loadgen.zero_drop_problems(slow, min_requests=5, max_gap_s=1.0, max_request_s=1.0) == []
    assert loadgen.zero_drop_problems(fast, min_requests=5, max_gap_s=1.0, max_request_s=1.0) == [
        f"3.0 s without a success (from 5.0 s into the load), over the bound of 1 s {bound_why(fast, 1.0)}",
        f"a request took 3.0 s, over the bound of 1 s {bound_why(fast, 1.0)}"]


def test_a_run_without_its_pace_before_the_change_proves_nothing():
    assert problems(tally_result(30, change_at=None)) == [
        "the load was not told when the change began (Load(change_after=...), mark_change(), or the probe's "
        "--change-after): its pace before the change is unknown"]
    assert problems(tally_result(30, change_at=0.35)) == [
        "only 3 requests succeeded before the change (0.35 s into the load); at least 5 must, to know the "
        "load's pace"]
    # failures do not set the pace; a Load's change_after places the change on its clock
    load = loadgen.Load("http://127.0.0.1:9", "m", change_after=2.0)
    assert load.tally.change_at == pytest.approx(load.tally.started + 2.0)


def test_with_several_clients_a_stalled_request_fails_the_request_bound():
    """Two clients: while one request is held 2 s the other loop keeps succeeding, so the
    gap may stay short; the request bound still catches the stall."""
    def answer(h: BaseHTTPRequestHandler, n: int, body: dict[str, Any]) -> None:
        if n == 9:
            time.sleep(2.0)
        send(h, 200, GOOD_BODY)

    with server(answer) as (url, _), loadgen.Load(url, "m", clients=2, timeout=30) as load:
        wait_finished(load, 5)
        load.mark_change()
        wait_finished(load, 14)
    r = load.result
    assert r["failed"] == 0 and r["longest_request_s"] >= 2.0
    found = loadgen.zero_drop_problems(r, min_requests=5, max_gap_s=10.0, max_request_s=1.0)
    assert found == [f"a request took {r['longest_request_s']} s, over the bound of 1 s {bound_why(r, 1.0)}"]


# --- what the mutants of scripts/mutate found unguarded (issue 46, item 2) ---------------

def test_a_stream_without_a_space_after_data_is_read_alike():
    """SSE allows `data:{...}` as well as `data: {...}`: both streams are one success."""
    chunk = {"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}
    for sep in (b"data:", b"data: "):
        body = sep + json.dumps(chunk).encode() + b"\n\n" + sep + b"[DONE]\n\n"
        assert loadgen.judge(body, stream=True) == ("", ""), body


def test_a_choice_that_is_no_object_is_passed_over_not_the_end_of_the_choices():
    answer = {"choices": ["junk", 3, {"index": 0, "text": "hi", "finish_reason": "stop"}]}
    assert loadgen.served([answer], "error-body", "") == ("", "")
    assert loadgen.served([{"choices": ["junk"]}], "error-body", "d") == ("no-choices", "d")


def test_tally_reports_times_to_the_millisecond():
    t = loadgen.Tally(0.0)
    t.record(2.34567, OK, 1.23456)
    t.record(10.0, OK, 0.5)
    r = t.result(10.5)
    assert r["longest_gap_s"] == round(10.0 - 2.34567, 3) == 7.654
    assert r["longest_gap_at_s"] == 2.346
    assert r["longest_request_s"] == 1.235


def test_tally_a_success_recorded_without_its_duration_took_no_time():
    t = loadgen.Tally(0.0, change_at=1.0)
    for i in range(5):
        t.record(0.1 * (i + 1), OK)
    r = t.result(1.5)
    assert r["pace"]["requests_before"] == 5 and r["pace"]["median_request_s"] == 0.0
    assert r["longest_request_s"] == 0.0


def test_tally_keeps_at_most_its_pace_samples():
    t = loadgen.Tally(0.0, change_at=1e9)
    for i in range(loadgen.MAX_PACE_SAMPLES + 50):
        t.record(i * 1e-3, OK, 0.01)
    assert t.result(1e4)["pace"]["requests_before"] == loadgen.MAX_PACE_SAMPLES


def test_zero_drop_a_stretch_or_a_request_at_its_bound_is_no_stall():
    r = tally_result(30)
    at_bound = {**r, "longest_gap_s": 1.0, "longest_request_s": 1.0}
    assert problems(at_bound) == []
    assert len(problems({**r, "longest_gap_s": 1.001, "longest_request_s": 1.001})) == 2


def test_tally_times_count_from_the_loads_start():
    t = loadgen.Tally(100.0, wall=5000.12345)
    t.record(100.54321, fail(503))
    r = t.result(101.23456)
    assert r["duration_s"] == 1.235 and r["started_at"] == 5000.123
    assert [f["t_s"] for f in r["first_failures"]] == [0.543]


def test_a_stream_that_ends_without_a_finish_is_shown_by_its_end():
    """The detail of a stream judged at [DONE] is the stream's tail, where it stopped."""
    chunk = b"data: " + json.dumps({"choices": [{"index": 0, "text": "word "}]}).encode() + b"\n\n"
    body = chunk * 20 + b"data: [DONE]\n\n"
    assert len(body) > 2 * loadgen.DETAIL_CHARS
    assert loadgen.judge(body, stream=True) == ("no-finish", body.decode()[-loadgen.DETAIL_CHARS:])


def test_a_body_or_a_cut_stream_that_is_no_answer_names_what_it_was():
    assert loadgen.judge(b"[1, 2]", stream=False) == ("no-choices", "not a JSON object: [1, 2]")
    chunk = b"data: " + json.dumps({"choices": [{"index": 0, "text": "word "}]}).encode() + b"\n\n"
    cut = chunk * 20
    assert loadgen.judge(cut, stream=True) == ("no-done", cut.decode()[-loadgen.DETAIL_CHARS:])


def test_zero_drop_counts_and_bounds_at_their_edges():
    assert problems(tally_result(20)) == []  # exactly the floor of requests is enough
    r = tally_result(30, failed=("no-done", "no-finish", "status", "connection"))
    assert problems(r)[0].endswith(f"the first: {r['first_failures'][:3]}"), problems(r)
    # the pace unknown: the bound is the floor alone, however small
    unknown = {**tally_result(30, change_at=None), "longest_gap_s": 0.8}
    found = loadgen.zero_drop_problems(unknown, min_requests=20, max_gap_s=0.5, max_request_s=0.5)
    assert any("over the bound of 0.5 s (the pace before the change unknown: 0.5 s)" in p for p in found), found
