"""The one load generator: completions through the router, every answer judged.

Used by the upgrade's probe (upgrade_probe.py, also the load of scripts/measure-drain and
of the molecule scenarios' changes under load) and by the zero-drop tests in process
(tests/verify/test_drain.py). Stdlib only, Python >= 3.9, no import of the rest of
pdnode: it is copied to hosts beside upgrade_probe.py and run by their python3.

A request succeeds only when the answer is HTTP 200 and its JSON objects (the body
without streaming; streaming: the SSE `data:` chunks up to `data: [DONE]`, each a JSON
object) pass one judge, served(), whatever the form: none carries `error`, a choice has
text (`text`, `delta.content` or `message.content`) and a choice has a `finish_reason`.
A truthy `choices` is not an answer: `{"choices": [{}]}` has neither.
Ending with `[DONE]` is not enough: SGLang (and the stand-in) answers a bootstrap or KV
transfer failure after admission with HTTP 200, an SSE chunk carrying `error`, then
`[DONE]`. Every other answer is a failure of one kind (KINDS).

The tally counts, it does not rate: requests started and finished, ok and failed (per
kind and per HTTP status), the longest stretch without a success (the load's start and
stop count as edges: a load that never succeeds has one gap, its whole length) and the
longest single request, and the load's pace before the change it watches (the median
time of the requests that succeeded before the change began). zero_drop_problems() judges
a run that must lose nothing, with stall bounds that grow with that pace: on a busy
machine every request is slower, and a stall is a stretch far longer than the same load
took before the change, not a constant.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, NamedTuple

# Why a request failed (the `failures` counts of a result, `kind` of each sample).
KINDS = {
    "status": "an HTTP status other than 200 (`codes` says which)",
    "connection": "refused, reset or broken before the whole answer arrived",
    "timeout": "no answer, or a stalled one, within the request's timeout",
    "error-body": "a non-stream body carrying `error`",
    "no-choices": "a body that is not a JSON object, or an answer without any choice (an object in a list `choices`)",
    "error-chunk": "a stream chunk carrying `error` (SGLang's failure after admission)",
    "bad-chunk": "a stream `data:` line that is not a JSON object",
    "no-done": "a stream without `data: [DONE]` (cut)",
    "no-finish": "an answer whose choices have no `finish_reason`",
    "no-content": "an answer whose choices have no text",
}
MAX_SAMPLES = 10  # failures kept with their detail: the first ones
MAX_OUTAGES = 20
# A stretch without a success this long is listed as an outage (normal spacing is ~0.1 s).
OUTAGE_MIN_S = 1.0
DETAIL_CHARS = 400  # enough for SGLang's KVTransferError line with its reason
# The stall bounds of a zero-drop run: the larger of the caller's floor and this many times
# the load's median request before the change; that median needs this many successes.
PACE_FACTOR = 10.0
MIN_PACE_REQUESTS = 5
MAX_PACE_SAMPLES = 10000
# Python 3.9 (a host's python3) still has socket.timeout apart from TimeoutError.
TIMEOUTS = (TimeoutError, socket.timeout)


class Outcome(NamedTuple):
    status: int  # the HTTP status; 0: no answer
    kind: str  # "" for a success, else a key of KINDS
    detail: str = ""


def _snippet(data: Any, tail: bool = False) -> str:
    """The start of DATA (where an error's message is), or its end (where a stream stopped)."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    return text[-DETAIL_CHARS:] if tail else text[:DETAIL_CHARS]


def judge(body: bytes, stream: bool) -> tuple[str, str]:
    """(kind, detail) of a 200's body: kind "" when it is a success. Each form is only
    unpacked here into its JSON objects; served() judges them, the same for both."""
    if not stream:
        try:
            doc = json.loads(body)
        except ValueError:
            return "no-choices", "not JSON: " + _snippet(body)
        if not isinstance(doc, dict):
            return "no-choices", "not a JSON object: " + _snippet(body)
        return served([doc], "error-body", _snippet(body))
    chunks: list[dict[str, Any]] = []
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue  # SSE comments, blank separators, other fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return served(chunks, "error-chunk", _snippet(body, tail=True))
        try:
            chunk = json.loads(payload)
        except ValueError:
            return "bad-chunk", _snippet(payload)
        if not isinstance(chunk, dict):
            return "bad-chunk", _snippet(payload)
        chunks.append(chunk)
    # cut before [DONE]; an error it carried is still the better diagnosis
    kind, detail = served(chunks, "error-chunk", "")
    return (kind, detail) if kind == "error-chunk" else ("no-done", _snippet(body, tail=True))


def served(docs: list[dict[str, Any]], error_kind: str, detail: str) -> tuple[str, str]:
    """The one judge of an answer, streamed (DOCS: its chunks) or not (DOCS: the body):
    ("", "") when no object carries `error`, a choice has text and a choice has a
    `finish_reason`; else the first missing thing's kind (ERROR_KIND for an error) and
    DETAIL (an error's own text instead). A choice is an object in a list `choices`:
    `{"choices": "x"}` or `[{}]` is no answer, nor is a choice with empty text."""
    seen = content = finish = False
    for doc in docs:
        if doc.get("error") is not None:
            return error_kind, _snippet(json.dumps(doc["error"]))
        choices = doc.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            seen = True
            delta, message = choice.get("delta"), choice.get("message")
            content = content or bool(choice.get("text")) or any(
                isinstance(part, dict) and bool(part.get("content")) for part in (delta, message))
            finish = finish or bool(choice.get("finish_reason"))
    if not seen:
        return "no-choices", detail
    if not finish:
        return "no-finish", detail
    if not content:
        return "no-content", detail
    return "", ""


def completion(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """The body of one /v1/completions request. ignore_eos: every answer has max_tokens
    tokens, so a stream always has text to carry and each request does the same work."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True}
    if stream:
        body["stream"] = True
    return body


def request(url: str, body: dict[str, Any], key: str = "", timeout: float = 60.0) -> Outcome:
    """POST BODY to URL (http or https: the callers' URLs) and judge the answer."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only
            status, data = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read()
        except (OSError, http.client.HTTPException):
            text = b""
        return Outcome(exc.code, "status", f"HTTP {exc.code} {exc.reason}: {_snippet(text)}")
    except urllib.error.URLError as exc:  # before the answer: refused, unreachable, connect timeout
        kind = "timeout" if isinstance(exc.reason, TIMEOUTS) else "connection"
        return Outcome(0, kind, f"{type(exc.reason).__name__}: {exc.reason}")
    except TIMEOUTS as exc:
        return Outcome(0, "timeout", f"{type(exc).__name__}: {exc}")
    except (OSError, http.client.HTTPException) as exc:  # reset, or cut mid-body (IncompleteRead)
        return Outcome(0, "connection", f"{type(exc).__name__}: {exc}")
    if status != 200:
        return Outcome(status, "status", f"HTTP {status}: {_snippet(data)}")
    kind, detail = judge(data, bool(body.get("stream")))
    return Outcome(status, kind, detail)


class Tally:
    """Requests as they start and end; what the result says about them. Thread-safe."""

    def __init__(self, started: float, wall: float = 0.0, change_at: float | None = None) -> None:
        self.started = started  # monotonic seconds at the load's start
        # monotonic seconds at which the change under load began (mark_change); the
        # successes that end before it give the load's pace
        self.change_at = change_at
        self._before: list[tuple[float, float]] = []  # (ended, took) of successes until the change
        self.wall = wall  # epoch seconds at `started`: places outages beside other logs
        self.requests_started = 0
        self.requests = 0  # finished: ok + failed
        self.ok = 0
        self.codes: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.samples: list[dict[str, Any]] = []
        self.outages: list[dict[str, Any]] = []
        self.longest_request = 0.0
        self._failed_since_ok = 0
        self._last_ok = started
        self._gap = (0.0, started)  # (length, start) of the longest stretch without a success
        self._lock = threading.Lock()

    def begin(self) -> None:
        with self._lock:
            self.requests_started += 1

    def mark_change(self, at: float) -> None:
        """The change under load begins at AT (monotonic): what ended before is the pace."""
        with self._lock:
            if self.change_at is None:
                self.change_at = at

    def record(self, ended: float, outcome: Outcome, took: float = 0.0) -> None:
        with self._lock:
            self.requests += 1
            self.codes[str(outcome.status)] = self.codes.get(str(outcome.status), 0) + 1
            self.longest_request = max(self.longest_request, took)
            if not outcome.kind:
                self.ok += 1
                if (self.change_at is None or ended <= self.change_at) and len(self._before) < MAX_PACE_SAMPLES:
                    self._before.append((ended, took))
                self._close_gap(ended)
                # max: loops record in about, not exactly, the order their requests ended
                self._last_ok = max(self._last_ok, ended)
                self._failed_since_ok = 0
                return
            self._failed_since_ok += 1
            self.failures[outcome.kind] = self.failures.get(outcome.kind, 0) + 1
            if len(self.samples) < MAX_SAMPLES:
                self.samples.append({"t_s": round(ended - self.started, 3), "code": outcome.status,
                                     "kind": outcome.kind, "error": outcome.detail[:DETAIL_CHARS]})

    def _pace(self) -> dict[str, Any]:
        """The successes before the change: how many, and their median seconds."""
        change = self.change_at
        took = sorted(t for ended, t in self._before if change is not None and ended <= change)
        median = None
        if took:
            mid = len(took) // 2
            median = took[mid] if len(took) % 2 else (took[mid - 1] + took[mid]) / 2
        return {"change_at_s": None if change is None else round(change - self.started, 3),
                "requests_before": len(took), "median_request_s": None if median is None else round(median, 4)}

    def _close_gap(self, now: float) -> None:
        length = now - self._last_ok
        if length >= OUTAGE_MIN_S and len(self.outages) < MAX_OUTAGES:
            self.outages.append({"at_s": round(self._last_ok - self.started, 3),
                                 "at": round(self.wall + self._last_ok - self.started, 3),
                                 "length_s": round(length, 3), "failed": self._failed_since_ok})
        if length > self._gap[0]:
            self._gap = (length, self._last_ok)

    def result(self, stopped: float) -> dict[str, Any]:
        """The counts, the stop closing the last stretch without a success."""
        with self._lock:
            self._close_gap(stopped)
            return {
                "duration_s": round(stopped - self.started, 3), "started_at": round(self.wall, 3),
                "requests_started": self.requests_started, "requests": self.requests, "ok": self.ok,
                "failed": self.requests - self.ok, "failures": dict(sorted(self.failures.items())),
                "codes": dict(sorted(self.codes.items())), "longest_gap_s": round(self._gap[0], 3),
                "longest_gap_at_s": round(self._gap[1] - self.started, 3),
                "longest_request_s": round(self.longest_request, 3), "outages": list(self.outages),
                "pace": self._pace(),
                "first_failures": list(self.samples),
            }


class Load:
    """CLIENTS loops through BASE_URL's /v1/completions, each starting its next request
    INTERVAL seconds after its last one started (at once when that took longer); with
    STREAM every second loop streams. Runs from start() (or `with`) to stop(), which waits
    for the requests in flight and returns the result (also kept as .result). The change
    it watches begins CHANGE_AFTER seconds after its creation, or at mark_change()."""

    def __init__(self, base_url: str, model: str, key: str = "", *, clients: int = 1, stream: bool = False,
                 interval: float = 0.0, timeout: float = 60.0, max_tokens: int = 4,
                 prompt: str = "pdnode load", change_after: float | None = None) -> None:
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model, self.key, self.timeout = model, key, timeout
        self.interval, self.max_tokens, self.prompt = interval, max_tokens, prompt
        # The load's clock starts here (the first edge of a gap): create it, then start it.
        now = time.monotonic()
        self.tally = Tally(now, time.time(), None if change_after is None else now + change_after)
        self.result: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(stream and k % 2 == 1,), daemon=True)
                         for k in range(max(clients, 1))]

    def _loop(self, stream: bool) -> None:
        body = completion(self.model, self.prompt, self.max_tokens, stream)
        while not self._stop.is_set():
            began = time.monotonic()
            self.tally.begin()
            outcome = request(self.url, body, self.key, self.timeout)
            ended = time.monotonic()
            self.tally.record(ended, outcome, ended - began)
            self._stop.wait(max(0.0, self.interval - (ended - began)))  # -1 would wait for ever

    def mark_change(self) -> None:
        """The change under load begins now (the requests ended so far give the pace)."""
        self.tally.mark_change(time.monotonic())

    @property
    def finished(self) -> int:
        return self.tally.requests

    def running(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sending; wait for the requests in flight (each ends by its timeout, unless
        a server trickles bytes: one still running after that is left, started but not
        finished); the result."""
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)
        self.result = self.tally.result(time.monotonic())
        return self.result

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def zero_drop_problems(result: dict[str, Any], *, min_requests: int, max_gap_s: float,
                       max_request_s: float, pace_factor: float = PACE_FACTOR) -> list[str]:
    """What a run that must lose no request got wrong, one line each with its counts:
    a failed request; a request started but never finished; fewer than MIN_REQUESTS
    finished (too little load to prove anything); fewer than MIN_PACE_REQUESTS successes
    before the change (its pace unknown); a stretch without a success, or a request (with
    several clients one request held for a minute leaves no gap between the others'
    successes), longer than its bound. A bound is the larger of MAX_GAP_S (MAX_REQUEST_S)
    and PACE_FACTOR times the median request before the change: on a busy machine the same
    load is slower throughout, and only a stretch far beyond its own pace is a stall."""
    problems = []
    if result["failed"]:
        kinds = ", ".join(f"{k} {n}" for k, n in result["failures"].items())
        problems.append(f"{result['failed']} of {result['requests']} requests failed ({kinds}); "
                        f"the first: {result['first_failures'][:3]}")
    unfinished = result["requests_started"] - result["requests"]
    if unfinished:
        problems.append(f"{unfinished} of {result['requests_started']} requests started never finished")
    if result["requests"] < min_requests:
        problems.append(f"only {result['requests']} requests finished in {result['duration_s']} s; "
                        f"at least {min_requests} must, for the run to prove anything")
    pace = result.get("pace") or {}
    median = pace.get("median_request_s")
    if pace.get("change_at_s") is None:
        problems.append("the load was not told when the change began (Load(change_after=...), mark_change(), "
                        "or the probe's --change-after): its pace before the change is unknown")
    elif pace.get("requests_before", 0) < MIN_PACE_REQUESTS or median is None:
        problems.append(f"only {pace.get('requests_before', 0)} requests succeeded before the change "
                        f"({pace['change_at_s']} s into the load); at least {MIN_PACE_REQUESTS} must, "
                        f"to know the load's pace")
    scaled = pace_factor * median if median is not None else 0.0
    why = (f"the larger of {{floor}} s and {pace_factor:g} x the {median} s a request took before the change"
           if median is not None else "the pace before the change unknown: {floor} s")
    gap_bound, request_bound = max(max_gap_s, scaled), max(max_request_s, scaled)
    if result["longest_gap_s"] > gap_bound:
        problems.append(f"{result['longest_gap_s']} s without a success (from {result['longest_gap_at_s']} s "
                        f"into the load), over the bound of {gap_bound:.3g} s ({why.format(floor=max_gap_s)})")
    if result["longest_request_s"] > request_bound:
        problems.append(f"a request took {result['longest_request_s']} s, over the bound of {request_bound:.3g} s "
                        f"({why.format(floor=max_request_s)})")
    return problems
