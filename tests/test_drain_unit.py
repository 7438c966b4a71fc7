"""pdnode.node.drain's decisions without a router (issue 46, item 2): what it takes out,
waits for, puts back and reconciles, against a router and engines faked in-process
(drain.http answered by World) on a fake clock (drain.time: every sleep advances it, so a
deadline is reached at once and exactly). tests/verify/test_drain.py runs the same code
against the real routers under load; these run in a second, for every mutant of
scripts/mutate --module drain.

The fakes answer as the routers do (docs/smg.md): sglang-router 0.3.2 drops a DELETEd
worker at once and lists no health, smg drops it seconds later and says is_healthy; an
engine's /metrics is SGLang 0.5.23's text (gauges per DP rank, HELP/TYPE comments), an
engine that is gone answers nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from pdnode.node import drain

ROUTER = "http://127.0.0.1:8000"
ADMIN = "adm-unit"
API = "sk-unit"
P0 = {"id": "prefill-0", "role": "prefill", "url": "http://127.0.0.1:30000", "bootstrap_port": 8998}
P1 = {"id": "prefill-1", "role": "prefill", "url": "http://127.0.0.1:30001", "bootstrap_port": 8999}
D0 = {"id": "decode-0", "role": "decode", "url": "http://127.0.0.1:30010"}
D1 = {"id": "decode-1", "role": "decode", "url": "http://127.0.0.1:30011"}
START = 1000.0
POLL = drain.POLL_S
IDLE = dict.fromkeys(drain.BUSY_GAUGES, 0.0)


class Clock:
    """drain.time: monotonic() is START plus what was slept; the rest is the real module."""

    def __init__(self) -> None:
        self.now = START
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds
        assert self.now < START + 10_000, "still waiting 10,000 s later: a loop that never ends"

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class Engine:
    """An engine's /health and /metrics: READS are the gauges of its n-th /metrics read (the
    last repeats; None: no answer, the engine is gone); ready from READY_AT s."""

    def __init__(self, reads: list[dict[str, float] | None] | None = None, ready_at: float = 0.0) -> None:
        self.reads = reads if reads is not None else [{}]
        self.ready_at = ready_at
        self.metrics_reads = 0
        self.health_reads = 0

    def metrics(self) -> dict[str, float] | None:
        gauges = self.reads[min(self.metrics_reads, len(self.reads) - 1)]
        self.metrics_reads += 1
        return gauges


def metrics_text(gauges: dict[str, float]) -> str:
    """SGLang's exposition of GAUGES (short names: running -> sglang:num_running_reqs), each
    split over two DP ranks as SGLang writes a value per rank."""
    lines = []
    for name in drain.BUSY_GAUGES:
        value = gauges.get(name.split(":", 1)[1].removeprefix("num_").removesuffix("_reqs"), 0.0)
        lines += [f"# HELP {name} The number of requests.", f"# TYPE {name} gauge",
                  f'{name}{{dp_rank="0",model_name="m"}} {value - value // 2}',
                  f'{name}{{dp_rank="1",model_name="m"}} {value // 2}']
    lines += ["# HELP sglang:num_used_tokens Tokens.", 'sglang:num_used_tokens{dp_rank="0"} 77.0', ""]
    return "\n".join(lines)


class World:
    """drain.http's view of one router (at ROUTER) and its engines: what was called, when."""

    def __init__(self, clock: Clock, listed: list[dict[str, Any]] = (), *, drop_after: float = 0.0,
                 healthy_after: float | None = 0.0, engines: dict[str, Engine] | None = None) -> None:
        self.clock = clock
        self.drop_after = drop_after  # seconds from a DELETE until the router no longer lists the worker
        self.healthy_after = healthy_after  # from a POST until listed healthy; None: lists no health (0.3.2)
        self.entries = [self._entry(w) for w in listed]
        self.engines = engines or {}
        self.router_status = 200  # 0: the router does not answer
        self.calls: list[tuple[float, str, str]] = []

    def _entry(self, worker: dict[str, Any], healthy_at: float = START) -> dict[str, Any]:
        return {"id": worker.get("id", worker["url"]), "url": worker["url"],
                "worker_type": worker.get("role", "regular"), "_gone_at": None, "_healthy_at": healthy_at}

    def listed(self) -> list[dict[str, Any]]:
        out = []
        for e in self.entries:
            if e["_gone_at"] is not None and self.clock.now >= e["_gone_at"]:
                continue
            shown = {k: v for k, v in e.items() if not k.startswith("_")}
            if self.healthy_after is not None:
                shown["is_healthy"] = self.clock.now >= e["_healthy_at"]
            out.append(shown)
        return out

    def http(self, method: str, url: str, key: str | None, body: Any = None) -> tuple[int, str]:
        self.calls.append((self.clock.now, method, url))
        assert sum(1 for t, _, _ in self.calls if t == self.clock.now) < 100, "polls without sleeping"
        if url.startswith(ROUTER):
            return self._router(method, url.removeprefix(ROUTER), key, body)
        base, _, path = url.rpartition("/")
        engine = self.engines.get(base)
        assert key == API, f"{url} called with {key!r}"
        if engine is None:
            return 0, "Connection refused"
        if path == "health":
            engine.health_reads += 1
            return (200, "") if self.clock.now >= engine.ready_at else (503, "starting")
        assert path == "metrics", url
        gauges = engine.metrics()
        return (0, "Connection refused") if gauges is None else (200, metrics_text(gauges))

    def _router(self, method: str, path: str, key: str | None, body: Any) -> tuple[int, str]:
        if self.router_status == 0:
            return 0, "Connection refused"
        if key != ADMIN:
            return 401, "unauthorized"
        if method == "GET" and path == "/workers":
            return 200, json.dumps({"workers": self.listed(), "total": len(self.listed())})
        if method == "DELETE" and path.startswith("/workers/"):
            wid = path.removeprefix("/workers/")
            entry = next((e for e in self.entries if e["id"] == wid and e["_gone_at"] is None), None)
            if entry is None:
                return 404, f"no worker {wid}"
            entry["_gone_at"] = self.clock.now + self.drop_after
            return 202, "accepted"
        if method == "POST" and path == "/workers":
            if any(w["url"] == body["url"] for w in self.listed()):
                return 409, "exists"
            self.entries.append({**self._entry({"url": body["url"], "role": body["worker_type"]},
                                               self.clock.now + (self.healthy_after or 0.0)), "_body": body})
            return 201, "created"
        raise AssertionError(f"{method} {path}")

    def router_calls(self, method: str) -> list[str]:
        return [url.removeprefix(ROUTER) for _, m, url in self.calls if m == method and url.startswith(ROUTER)]

    def posted(self) -> list[dict[str, Any]]:
        return [e["_body"] for e in self.entries if "_body" in e]


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(drain, "time", c)
    return c


def world(monkeypatch, clock: Clock, *args: Any, **kwargs: Any) -> World:
    w = World(clock, *args, **kwargs)
    monkeypatch.setattr(drain, "http", w.http)
    return w


def router() -> drain.Router:
    return drain.Router(ROUTER + "/", ADMIN)


def lines(capsys) -> list[str]:
    """What drain logged, without the time of day."""
    return [line.split("Z ", 1)[1] for line in capsys.readouterr().out.splitlines()]


# --- busy: the scheduler gauges from SGLang's /metrics ------------------------------------

def answering(monkeypatch, status: int, text: str) -> list[str]:
    seen: list[str] = []

    def http(method, url, key, body=None):
        seen.append(f"{method} {url} {key}")
        return status, text

    monkeypatch.setattr(drain, "http", http)
    return seen


def test_busy_sums_each_gauge_over_the_ranks_and_ignores_the_rest(monkeypatch):
    seen = answering(monkeypatch, 200, metrics_text({"running": 3, "queue": 1, "decode_transfer_queue": 5}))
    assert drain.busy({"url": "http://e:1/"}, API) == {
        **IDLE, "sglang:num_running_reqs": 3.0, "sglang:num_queue_reqs": 1.0,
        "sglang:num_decode_transfer_queue_reqs": 5.0}
    assert seen == [f"GET http://e:1/metrics {API}"]


def test_busy_reads_an_idle_engine_as_every_gauge_zero(monkeypatch):
    answering(monkeypatch, 200, metrics_text({}))
    assert drain.busy(P0, API) == IDLE
    answering(monkeypatch, 200, "")  # an engine exporting none of them holds nothing either
    assert drain.busy(P0, API) == IDLE


@pytest.mark.parametrize("status", [0, 401, 404, 500, 503])
def test_busy_is_none_when_metrics_does_not_answer_200(monkeypatch, status):
    answering(monkeypatch, status, metrics_text({"running": 2}))
    assert drain.busy(P0, API) is None


def test_busy_reads_unlabelled_gauges_a_label_with_a_space_and_skips_what_it_cannot_read(monkeypatch):
    text = "\n".join([
        "# a comment first",
        "sglang:num_running_reqs 2",
        "",
        "sglang:num_queue_reqs",  # no value
        "sglang:num_queue_reqs{dp_rank=\"0\"} lots",  # not a number
        "sglang:num_queue_reqs{dp_rank=\"1\"} 4",
        "sglang:num_prefill_inflight_queue_reqs{model_name=\"a b\"} 6",
        "sglang:num_running_reqs_total 100",  # another metric whose name starts alike
        "#sglang:num_running_reqs 50",
        "sglang:num_decode_prealloc_queue_reqs 1e1",
    ])
    answering(monkeypatch, 200, text)
    assert drain.busy(P0, API) == {**IDLE, "sglang:num_running_reqs": 2.0, "sglang:num_queue_reqs": 4.0,
                                   "sglang:num_prefill_inflight_queue_reqs": 6.0,
                                   "sglang:num_decode_prealloc_queue_reqs": 10.0}


def test_busy_counts_every_gauge_the_drain_waits_for():
    # SGLang 0.5.23's scheduler gauges of a request held: running, waiting, both PD hand-off queues each side
    assert set(drain.BUSY_GAUGES) == {
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs",
        "sglang:num_prefill_inflight_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
        "sglang:num_decode_transfer_queue_reqs"}


# --- differences: reconcile --check ---------------------------------------------------------

def test_differences_of_empty_lists_is_nothing_needed(capsys):
    assert drain.differences([], []) == {"unplanned": [], "missing": [], "needed": False}
    assert lines(capsys) == []


def test_differences_names_the_unplanned_sorted_once_and_the_missing_in_plan_order(capsys):
    listed = [{"url": "http://10.0.0.9:30000"}, {"url": P0["url"]}, {"url": "http://10.0.0.1:30000"},
              {"url": "http://10.0.0.9:30000"}]
    assert drain.differences(listed, [D1, P0, D0]) == {
        "unplanned": ["http://10.0.0.1:30000", "http://10.0.0.9:30000"], "missing": ["decode-1", "decode-0"],
        "needed": True}
    assert lines(capsys) == [
        "the router lists http://10.0.0.1:30000, which the plan does not have (reconcile takes it out)",
        "the router lists http://10.0.0.9:30000, which the plan does not have (reconcile takes it out)",
        "decode-1 is planned but not in the router's list (reconcile puts it back once its engine is ready)",
        "decode-0 is planned but not in the router's list (reconcile puts it back once its engine is ready)"]


def test_differences_needs_a_change_for_unplanned_alone_or_missing_alone():
    assert drain.differences([{"url": P0["url"]}, {"url": "http://x:1"}], [P0]) == \
        {"unplanned": ["http://x:1"], "missing": [], "needed": True}
    assert drain.differences([], [P0]) == {"unplanned": [], "missing": ["prefill-0"], "needed": True}
    assert drain.differences([{"url": P0["url"]}, {"url": P0["url"]}], [P0, P0]) == \
        {"unplanned": [], "missing": [], "needed": False}


# --- take_out: DELETE, then wait until the router lists none of them -------------------------

def test_take_out_deletes_each_listed_worker_at_once_and_waits_until_the_router_drops_them(monkeypatch, clock, capsys):
    w = world(monkeypatch, clock, [P0, D0, P1], drop_after=1.0)  # smg: listed a while after DELETE
    assert drain.take_out(router(), [D0, P0], START + 30) == ["decode-0", "prefill-0"]
    deletes = [(t, url) for t, m, url in w.calls if m == "DELETE"]
    assert deletes == [(START, "http://127.0.0.1:8000/workers/decode-0"),
                       (START, "http://127.0.0.1:8000/workers/prefill-0")]  # both before any wait
    assert [x["url"] for x in w.listed()] == [P1["url"]]
    assert clock.now == START + 1.0 and set(clock.sleeps) == {POLL}  # polled every POLL_S until gone
    assert lines(capsys) == [f"decode-0 left the router ({D0['url']}; gone from /workers after 1.0 s)",
                             f"prefill-0 left the router ({P0['url']}; gone from /workers after 1.0 s)"]


def test_take_out_of_workers_the_router_does_not_list_deletes_nothing(monkeypatch, clock, capsys):
    w = world(monkeypatch, clock, [P1])
    assert drain.take_out(router(), [P0, D0], START + 30) == []
    assert drain.take_out(router(), [], START + 30) == []
    assert w.router_calls("DELETE") == [] and clock.sleeps == []
    assert lines(capsys) == ["prefill-0 is not in the router's list: nothing to take out",
                             "decode-0 is not in the router's list: nothing to take out"]


def test_take_out_passes_over_a_worker_not_listed_and_takes_out_the_next(monkeypatch, clock):
    w = world(monkeypatch, clock, [D0])
    assert drain.take_out(router(), [P0, D0], START + 30) == ["decode-0"]
    assert w.router_calls("DELETE") == ["/workers/decode-0"]


def test_take_out_deletes_by_the_routers_id_and_answers_the_plans(monkeypatch, clock):
    # smg names a worker by its own id (a UUID), sglang-router 0.3.2 by its URL
    w = world(monkeypatch, clock, [{"id": "3f2a-uuid", "url": P0["url"]}], drop_after=0.5)
    assert drain.take_out(router(), [P0], START + 30) == ["prefill-0"]
    assert w.router_calls("DELETE") == ["/workers/3f2a-uuid"]


def test_take_out_refused_by_the_router_is_an_error(monkeypatch, clock):
    w = world(monkeypatch, clock, [P0])
    monkeypatch.setattr(w, "_router", lambda m, p, k, b: (200, json.dumps({"workers": [P0]})) if m == "GET"
                        else (500, "boom"))
    with pytest.raises(drain.DrainError, match="DELETE /workers/prefill-0 answered 500: boom"):
        drain.take_out(router(), [P0], START + 30)


def test_take_out_past_its_deadline_names_what_the_router_still_lists(monkeypatch, clock):
    world(monkeypatch, clock, [P0, D0, D1], drop_after=5.0)
    with pytest.raises(drain.DrainError, match=r"^prefill-0, decode-1: the router still lists it after DELETE$"):
        drain.take_out(router(), [P0, D1], START + 2.0)
    assert clock.now == START + 2.25  # the first poll past the deadline, not one before


def test_take_out_at_its_deadline_still_waits_and_counts_a_worker_gone_after_it(monkeypatch, clock, capsys):
    # polled at +0, +0.25, +0.5 (the deadline itself: still waiting), gone at +0.75
    world(monkeypatch, clock, [P0], drop_after=0.75)
    assert drain.take_out(router(), [P0], START + 0.5) == ["prefill-0"]
    assert lines(capsys) == [f"prefill-0 left the router ({P0['url']}; gone from /workers after 0.8 s)"]


def test_take_out_from_a_router_that_drops_at_once_waits_for_nothing(monkeypatch, clock):
    w = world(monkeypatch, clock, [P0, D0])  # sglang-router 0.3.2
    assert drain.take_out(router(), [P0, D0], START) == ["prefill-0", "decode-0"]
    assert clock.sleeps == [] and w.router_calls("GET").count("/workers") == 3  # a find each, one poll


def test_take_out_a_router_that_stops_answering_lists_nothing_more(monkeypatch, clock):
    w = world(monkeypatch, clock, [P0], drop_after=10.0)
    deletes = []
    real = w._router

    def stop_after_delete(method, path, key, body):
        answer = real(method, path, key, body)
        if method == "DELETE":
            deletes.append(path)
            w.router_status = 0  # the router stopped (its host's run went on)
        return answer

    monkeypatch.setattr(w, "_router", stop_after_delete)
    assert drain.take_out(router(), [P0], START + 30) == ["prefill-0"]
    assert deletes == ["/workers/prefill-0"]


def test_take_out_of_one_worker_named_twice_returns_it_as_often(monkeypatch, clock):
    # the plan never names a worker twice; against 0.3.2 the second find no longer lists it
    w = world(monkeypatch, clock, [P0])
    assert drain.take_out(router(), [P0, P0], START + 30) == ["prefill-0", "prefill-0"]
    assert w.router_calls("DELETE") == ["/workers/prefill-0"]


# --- wait_idle: the engine's gauges 0 twice in a row, or the deadline ----------------------

def test_wait_idle_returns_after_two_idle_reads_in_a_row(monkeypatch, clock, capsys):
    engine = Engine([{}])
    world(monkeypatch, clock, engines={P0["url"]: engine})
    drain.wait_idle(P0, API, START + 30)
    assert engine.metrics_reads == 2 and clock.sleeps == [POLL]
    assert lines(capsys) == ["prefill-0 drained: no request in flight or queued after 0.2 s"]


def test_wait_idle_starts_counting_again_after_a_busy_read(monkeypatch, clock, capsys):
    # idle, busy (a request queued after the first read), idle, idle: four reads
    engine = Engine([{}, {"prefill_bootstrap_queue": 1}, {}, {}, {"running": 9}])
    world(monkeypatch, clock, engines={P0["url"]: engine})
    drain.wait_idle(P0, API, START + 30)
    assert engine.metrics_reads == 4
    assert lines(capsys) == ["prefill-0 drained: no request in flight or queued after 0.8 s"]


def test_wait_idle_waits_while_any_gauge_holds_a_request(monkeypatch, clock):
    busy = [{"decode_transfer_queue": 1}, {"running": 2, "queue": 3}, {"decode_prealloc_queue": 0.5}]
    engine = Engine([*busy, {}, {}])
    world(monkeypatch, clock, engines={D0["url"]: engine})
    drain.wait_idle(D0, API, START + 30)
    assert engine.metrics_reads == 5 and clock.now == START + 4 * POLL


def test_wait_idle_of_an_engine_that_stops_answering_ends_at_once(monkeypatch, clock, capsys):
    # it was stopped (or died) while holding requests: nothing is in flight on it any more
    engine = Engine([{"running": 4}, None])
    world(monkeypatch, clock, engines={P0["url"]: engine})
    drain.wait_idle(P0, API, START + 30)
    assert engine.metrics_reads == 2 and clock.now == START + POLL
    assert lines(capsys) == ["prefill-0 answers no /metrics: not running, nothing in flight"]
    engine = Engine([None])
    world(monkeypatch, clock, engines={P0["url"]: engine})
    drain.wait_idle(P0, API, START)  # not even a first read answered: no wait, deadline or not
    assert engine.metrics_reads == 1


def test_wait_idle_past_its_deadline_stops_waiting_and_says_what_is_still_held(monkeypatch, clock, capsys):
    engine = Engine([{"running": 2, "decode_transfer_queue": 1}])
    world(monkeypatch, clock, engines={D0["url"]: engine})
    drain.wait_idle(D0, API, START + 0.5)
    # read at +0, +0.25, +0.5 (the deadline itself: still waiting), +0.75: past it
    assert engine.metrics_reads == 4 and clock.now == START + 0.75
    assert lines(capsys) == ["decode-0 drain timeout after 0.8 s, still holding: num_running_reqs 2, "
                             "num_decode_transfer_queue_reqs 1; stopping it anyway (pdnode_drain_timeout_s)"]


def test_wait_idle_an_idle_read_at_the_deadline_still_needs_its_second(monkeypatch, clock, capsys):
    engine = Engine([{"running": 1}, {"running": 1}, {}, {}])
    world(monkeypatch, clock, engines={P0["url"]: engine})
    drain.wait_idle(P0, API, START + 0.5)  # idle at +0.5 (the deadline), again at +0.75: drained
    assert engine.metrics_reads == 4
    assert lines(capsys) == ["prefill-0 drained: no request in flight or queued after 0.8 s"]


# --- put_back: POST once the engine is ready, then wait until listed healthy -----------------

def test_put_back_of_a_worker_listed_healthy_changes_nothing(monkeypatch, clock, capsys):
    engine = Engine()
    w = world(monkeypatch, clock, [P0], engines={P0["url"]: engine})
    assert drain.put_back(router(), P0, API, START + 30) is False
    assert w.router_calls("POST") == [] and engine.health_reads == 0
    assert lines(capsys) == ["prefill-0 is in the router's list already"]


def test_put_back_of_a_worker_listed_by_a_router_that_reports_no_health_changes_nothing(monkeypatch, clock):
    w = world(monkeypatch, clock, [P0], healthy_after=None, engines={P0["url"]: Engine()})  # sglang-router 0.3.2
    assert drain.put_back(router(), P0, API, START + 30) is False
    assert w.router_calls("POST") == []


def test_put_back_adds_a_ready_engine_and_waits_until_the_router_lists_it_healthy(monkeypatch, clock, capsys):
    w = world(monkeypatch, clock, [D0], healthy_after=1.0, engines={P0["url"]: Engine()})  # smg: health checks first
    assert drain.put_back(router(), P0, API, START + 30) is True
    assert w.posted() == [{"url": P0["url"], "worker_type": "prefill", "bootstrap_port": 8998, "api_key": API}]
    assert clock.now == START + 1.0
    assert lines(capsys) == [f"prefill-0 returned to the router ({P0['url']}; listed healthy after 1.0 s)"]


def test_put_back_into_a_router_that_reports_no_health_is_done_once_listed(monkeypatch, clock, capsys):
    w = world(monkeypatch, clock, [], healthy_after=None, engines={D0["url"]: Engine()})
    assert drain.put_back(router(), D0, API, START) is True
    assert w.posted() == [{"url": D0["url"], "worker_type": "decode", "api_key": API}] and clock.sleeps == []
    assert lines(capsys) == [f"decode-0 returned to the router ({D0['url']}; listed healthy after 0.0 s)"]


def test_put_back_waits_for_the_engines_health_before_adding_it(monkeypatch, clock):
    # a decode bound to a prefill starts after it: /health 503 at +0, +0.25, +0.5 (the deadline:
    # still waiting), 200 at +0.75; then the router lists it healthy at once, past the deadline
    engine = Engine(ready_at=START + 0.75)
    w = world(monkeypatch, clock, [], engines={D0["url"]: engine})
    assert drain.put_back(router(), D0, API, START + 0.5) is True
    assert engine.health_reads == 4
    assert [t for t, m, _ in w.calls if m == "POST"] == [START + 0.75]


def test_put_back_of_an_engine_that_never_gets_ready_adds_nothing(monkeypatch, clock):
    engine = Engine(ready_at=START + 60)
    w = world(monkeypatch, clock, [], engines={D0["url"]: engine})
    with pytest.raises(drain.DrainError, match=r"^decode-0: its /health did not answer 200 in time; not added to "
                                               r"the router$"):
        drain.put_back(router(), D0, API, START + 1.0)
    assert w.router_calls("POST") == [] and clock.now == START + 1.25
    w = world(monkeypatch, clock, [], engines={})  # an engine not running at all
    with pytest.raises(drain.DrainError, match="its /health did not answer 200 in time"):
        drain.put_back(router(), D0, API, clock.now + 1.0)


def test_put_back_of_a_worker_listed_unhealthy_waits_without_adding_it_again(monkeypatch, clock, capsys):
    w = world(monkeypatch, clock, [], engines={P0["url"]: Engine()})
    w.entries.append(w._entry(P0, healthy_at=START + 0.75))  # smg lists it, its health check not passed yet
    assert drain.put_back(router(), P0, API, START + 0.5) is True  # healthy at +0.75, past the deadline
    assert w.router_calls("POST") == []
    assert lines(capsys) == [f"prefill-0 returned to the router ({P0['url']}; listed healthy after 0.8 s)"]


def test_put_back_not_listed_healthy_by_the_deadline_is_an_error(monkeypatch, clock):
    w = world(monkeypatch, clock, [], healthy_after=600.0, engines={P0["url"]: Engine()})
    with pytest.raises(drain.DrainError, match=r"^prefill-0: not listed healthy by the router 2 s after "
                                               r"POST /workers$"):
        drain.put_back(router(), P0, API, START + 2.0)
    assert len(w.router_calls("POST")) == 1 and clock.now == START + 2.25


# --- take_out_unplanned: what the router lists that the plan lacks -------------------------

UNPLANNED = {"id": "9c1e-uuid", "url": "http://127.0.0.1:30020", "role": "decode"}


def test_take_out_unplanned_removes_what_the_plan_lacks_then_waits_until_it_is_idle(monkeypatch, clock, capsys):
    engine = Engine([{"running": 1}, {}, {}])
    planned = Engine([{"running": 5}])
    w = world(monkeypatch, clock, [P0, UNPLANNED, D0], drop_after=0.5,
              engines={UNPLANNED["url"]: engine, P0["url"]: planned, D0["url"]: planned})
    assert drain.take_out_unplanned(router(), [P0, D0, D1], API, START + 30) == [UNPLANNED["url"]]
    assert w.router_calls("DELETE") == ["/workers/9c1e-uuid"]
    assert [x["url"] for x in w.listed()] == [P0["url"], D0["url"]]
    assert engine.metrics_reads == 3 and planned.metrics_reads == 0
    first_read = next(t for t, _, url in w.calls if url.endswith("/metrics"))
    assert first_read == START + 0.5  # once the router no longer sends it anything
    assert lines(capsys) == [
        f"the router lists {UNPLANNED['url']}, which the plan does not have: taking it out",
        f"{UNPLANNED['url']} left the router ({UNPLANNED['url']}; gone from /workers after 0.5 s)",
        f"{UNPLANNED['url']} drained: no request in flight or queued after 0.5 s"]


def test_take_out_unplanned_of_a_stopped_instance_does_not_wait_for_it(monkeypatch, clock):
    # an interrupted run stopped it already: the router still lists it, its /metrics answers nothing
    w = world(monkeypatch, clock, [P0, UNPLANNED], engines={})
    assert drain.take_out_unplanned(router(), [P0], API, START + 30) == [UNPLANNED["url"]]
    assert clock.sleeps == [] and w.router_calls("DELETE") == ["/workers/9c1e-uuid"]


def test_take_out_unplanned_with_nothing_unplanned_or_no_router_does_nothing(monkeypatch, clock):
    w = world(monkeypatch, clock, [P0, D0])
    assert drain.take_out_unplanned(router(), [D0, P0, P1], API, START + 30) == []
    w.router_status = 0
    assert drain.take_out_unplanned(router(), [], API, START + 30) == []
    assert w.router_calls("DELETE") == [] and not any(url.endswith("/metrics") for _, _, url in w.calls)


def test_take_out_unplanned_takes_every_one_out_before_waiting_for_any(monkeypatch, clock):
    other = {"id": "77aa-uuid", "url": "http://127.0.0.1:30021", "role": "prefill"}
    w = world(monkeypatch, clock, [UNPLANNED, other], drop_after=0.25,
              engines={UNPLANNED["url"]: Engine([{"queue": 2}, {}, {}]), other["url"]: Engine([{}])})
    assert drain.take_out_unplanned(router(), [], API, START + 30) == [UNPLANNED["url"], other["url"]]
    order = [(m, url.rsplit("/", 1)[-1]) for _, m, url in w.calls if m == "DELETE" or url.endswith("/metrics")]
    assert order == [("DELETE", "9c1e-uuid"), ("DELETE", "77aa-uuid")] + [("GET", "metrics")] * 5


# --- run: out, in, out-unplanned, reconcile and its --check ------------------------------------

def spec(tmp_path, workers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    (tmp_path / "admin").write_text(ADMIN + "\n")
    (tmp_path / "api").write_text(API + "\n")
    return {"router": ROUTER, "admin_key_file": str(tmp_path / "admin"), "api_key_file": str(tmp_path / "api"),
            "timeout_s": 30, "workers": workers, **extra}


def test_out_takes_the_workers_out_then_waits_until_each_is_idle(monkeypatch, clock, tmp_path):
    p0, d0 = Engine([{"running": 1}, {}, {}]), Engine([{}])
    w = world(monkeypatch, clock, [P0, D0, P1], drop_after=0.25, engines={P0["url"]: p0, D0["url"]: d0})
    result = drain.run("out", spec(tmp_path, [P0, D0]))
    assert result == {"changed": True, "removed": ["prefill-0", "decode-0"], "added": [], "missing": [],
                      "unplanned": [], "seconds": 1.0}
    assert w.router_calls("DELETE") == ["/workers/prefill-0", "/workers/decode-0"]
    assert (p0.metrics_reads, d0.metrics_reads) == (3, 2)


def test_out_of_a_worker_the_router_no_longer_lists_still_waits_for_its_requests(monkeypatch, clock, tmp_path):
    # an interrupted drain took it out already: what it held may still be running
    p0 = Engine([{"running": 1}, {}, {}])
    world(monkeypatch, clock, [P1], engines={P0["url"]: p0})
    result = drain.run("out", spec(tmp_path, [P0]))
    assert result == {"changed": False, "removed": [], "added": [], "missing": [], "unplanned": [], "seconds": 0.5}
    assert p0.metrics_reads == 3


def test_out_waits_for_requests_until_the_default_timeout_of_300_s(monkeypatch, clock, tmp_path, capsys):
    world(monkeypatch, clock, [], engines={P0["url"]: Engine([{"running": 1}])})
    s = spec(tmp_path, [P0])
    del s["timeout_s"]
    monkeypatch.setattr(drain, "POLL_S", 1.0)
    assert drain.run("out", s)["seconds"] == 301.0  # read at +300 (the deadline) and +301
    assert lines(capsys)[-1].startswith("prefill-0 drain timeout after 301.0 s, still holding: num_running_reqs 1")


def test_in_adds_only_what_the_router_lacks(monkeypatch, clock, tmp_path):
    w = world(monkeypatch, clock, [P0], healthy_after=0.25, engines={P0["url"]: Engine(), D0["url"]: Engine()})
    result = drain.run("in", spec(tmp_path, [P0, D0]))
    assert result == {"changed": True, "removed": [], "added": ["decode-0"], "missing": [], "unplanned": [],
                      "seconds": 0.2}
    assert [b["url"] for b in w.posted()] == [D0["url"]]
    assert drain.run("in", spec(tmp_path, [P0, D0]))["changed"] is False


def test_out_unplanned_removes_only_what_the_plan_lacks(monkeypatch, clock, tmp_path):
    w = world(monkeypatch, clock, [P0, UNPLANNED], engines={UNPLANNED["url"]: Engine([None])})
    result = drain.run("out-unplanned", spec(tmp_path, [P0, D0]))
    assert result == {"changed": True, "removed": [UNPLANNED["url"]], "added": [], "missing": [], "unplanned": [],
                      "seconds": 0.0}
    assert w.router_calls("DELETE") == ["/workers/9c1e-uuid"] and w.router_calls("POST") == []


def test_reconcile_takes_out_the_unplanned_and_puts_back_the_planned_whose_engine_is_ready(
        monkeypatch, clock, tmp_path, capsys):
    engines = {P0["url"]: Engine(), D0["url"]: Engine(ready_at=START + 600), D1["url"]: Engine(),
               UNPLANNED["url"]: Engine([None])}
    w = world(monkeypatch, clock, [P0, UNPLANNED], drop_after=0.5, healthy_after=0.5, engines=engines)
    result = drain.run("reconcile", spec(tmp_path, [P0, D0, D1]))
    assert result == {"changed": True, "removed": [UNPLANNED["url"]], "added": ["decode-1"], "missing": ["decode-0"],
                      "unplanned": [UNPLANNED["url"]], "seconds": 1.0}
    assert sorted(x["url"] for x in w.listed()) == [P0["url"], D1["url"]]
    assert [b["url"] for b in w.posted()] == [D1["url"]]
    out = lines(capsys)
    assert "decode-0 is planned but not in the router's list, and its engine is not ready: left out" in out
    assert ("decode-1 is planned but not in the router's list (an interrupted change left it out): putting it back"
            in out)


def test_reconcile_that_only_adds_is_a_change_and_one_with_nothing_to_do_is_none(monkeypatch, clock, tmp_path):
    w = world(monkeypatch, clock, [P0], engines={P0["url"]: Engine(), D0["url"]: Engine()})
    result = drain.run("reconcile", spec(tmp_path, [P0, D0]))
    assert (result["changed"], result["removed"], result["added"]) == (True, [], ["decode-0"])
    result = drain.run("reconcile", spec(tmp_path, [P0, D0]))
    assert result == {"changed": False, "removed": [], "added": [], "missing": [], "unplanned": [], "seconds": 0.0}
    assert len(w.posted()) == 1


def test_reconcile_puts_back_each_missing_worker_after_one_that_is_listed(monkeypatch, clock, tmp_path):
    world(monkeypatch, clock, [P0, P1], engines={u: Engine() for u in (P0["url"], P1["url"], D0["url"], D1["url"])})
    assert drain.run("reconcile", spec(tmp_path, [P0, D0, P1, D1]))["added"] == ["decode-0", "decode-1"]


def test_reconcile_check_changes_nothing_and_says_what_reconcile_would_do(monkeypatch, clock, tmp_path):
    w = world(monkeypatch, clock, [P0, UNPLANNED], engines={D0["url"]: Engine()})
    # and what the router lists, with each worker's health (pdnode status reads it)
    assert drain.run("reconcile", spec(tmp_path, [P0, D0]), check=True) == {
        "changed": False, "removed": [], "added": [], "missing": ["decode-0"], "unplanned": [UNPLANNED["url"]],
        "needed": True, "listed": [{"url": P0["url"], "healthy": True}, {"url": UNPLANNED["url"], "healthy": True}]}
    w.entries = [w._entry(P0), w._entry(D0)]
    assert drain.run("reconcile", spec(tmp_path, [P0, D0]), check=True)["needed"] is False
    assert w.router_calls("DELETE") == w.router_calls("POST") == []


def test_a_router_that_does_not_answer_has_nothing_to_change(monkeypatch, clock, tmp_path, capsys):
    w = world(monkeypatch, clock, [P0], engines={P0["url"]: Engine([{"running": 1}])})
    w.router_status = 0
    empty = {"changed": False, "removed": [], "added": [], "missing": [], "unplanned": []}
    assert drain.run("out", spec(tmp_path, [P0])) == empty
    assert drain.run("in", spec(tmp_path, [P0])) == empty
    assert drain.run("reconcile", spec(tmp_path, [P0]), check=True) == {**empty, "needed": False}
    assert lines(capsys) == [f"the router at {ROUTER} does not answer: no worker to take out",
                             f"the router at {ROUTER} does not answer: no worker to add",
                             f"the router at {ROUTER} does not answer: no worker to add"]
    assert [url for _, _, url in w.calls] == [f"{ROUTER}/workers"] * 3  # not even the engines' /metrics


def test_no_admin_key_file_yet_means_no_router_has_run(monkeypatch, clock, tmp_path, capsys):
    w = world(monkeypatch, clock, [P0])
    s = {**spec(tmp_path, [P0]), "admin_key_file": str(tmp_path / "not-yet")}
    empty = {"changed": False, "removed": [], "added": [], "missing": [], "unplanned": []}
    assert drain.run("out", s) == empty
    assert drain.run("reconcile", s, check=True) == {**empty, "needed": False}
    assert w.calls == []
    assert lines(capsys)[0] == f"no {tmp_path / 'not-yet'} yet: the router has not run, no worker to out"


def test_a_router_without_an_admin_key_is_called_without_one(monkeypatch, clock, tmp_path):
    w = world(monkeypatch, clock, [P0])
    monkeypatch.setattr(w, "_router", lambda m, p, k, b: (200, '{"workers": []}') if k is None else (401, ""))
    s = {**spec(tmp_path, [P0]), "admin_key_file": None}
    assert drain.run("reconcile", s, check=True)["missing"] == ["prefill-0"]


def test_a_router_refusing_the_admin_key_restarts_with_it_later(monkeypatch, clock, tmp_path, capsys):
    w = world(monkeypatch, clock, [P0, UNPLANNED])
    s = {**spec(tmp_path, [P0]), "admin_key_file": str(tmp_path / "new-admin")}
    (tmp_path / "new-admin").write_text("a-newer-key")
    empty = {"changed": False, "removed": [], "added": [], "missing": [], "unplanned": []}
    assert drain.run("reconcile", s) == empty
    assert drain.run("reconcile", s, check=True) == {**empty, "needed": True}
    assert w.router_calls("DELETE") == []
    assert lines(capsys)[0] == (f"the router at {ROUTER} refuses {tmp_path / 'new-admin'}: it still runs with an "
                                "earlier admin key and restarts with this one in this run; no worker to reconcile")
