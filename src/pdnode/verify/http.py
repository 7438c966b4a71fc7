"""Bounded HTTP for the verifier (standard library only).

Every request has a per-request time limit that covers the whole exchange (connect,
headers and body, streams included), never only one socket read. The node's own checks
go DIRECT (no proxy variables): they judge the node, not this shell's environment. The
access check reproduces what a client in this environment does and passes an explicit
proxy; see access.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterator

from .text import printable


@dataclass
class Response:
    url: str
    status: int | None  # None: no HTTP answer (see error)
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # connection-level failure, one line
    error_kind: str | None = None  # refused | timeout | dns | reset | tls | header | other
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def reached(self) -> bool:
        """The server answered at the HTTP level (any status)."""
        return self.status is not None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        try:
            return json.loads(self.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None

    def short(self, limit: int = 240) -> str:
        """One line describing the answer: 'HTTP 503: {...}' or the connection error."""
        if self.status is None:
            return printable(self.error or "no answer")
        body = printable(self.text.strip(), limit)
        return f"HTTP {self.status}" + (f": {body}" if body else " (empty body)")


class Deadline:
    """Overall bound of a run; per-request limits are cut to what is left."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.end = time.monotonic() + total_s

    def left(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return self.left() <= 0


def _kind(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, socket.gaierror):
        return "dns"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)):
        return "reset"
    if isinstance(exc, ssl.SSLError):
        return "tls"
    if isinstance(exc, ValueError) and "header" in str(exc).lower():
        return "header"
    if isinstance(exc, urllib.error.URLError):
        return _kind(exc.reason) if isinstance(exc.reason, BaseException) else "other"
    if isinstance(exc, OSError) and exc.errno in (111, 61):
        return "refused"
    return "other"


def _describe(exc: BaseException) -> str:
    inner = exc.reason if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException) else exc
    kind = _kind(exc)
    if kind == "timeout":
        return "timed out"
    if kind == "refused":
        return "connection refused"
    if kind == "dns":
        return f"cannot resolve host ({inner})"
    return f"{type(inner).__name__}: {inner}"


def opener(proxy: str | None = None) -> urllib.request.OpenerDirector:
    """Direct opener (proxy None) or one that sends everything through ``proxy``."""
    handlers: list[Any] = [urllib.request.ProxyHandler({"http": proxy, "https": proxy} if proxy else {})]
    return urllib.request.build_opener(*handlers)


_DIRECT = opener()


def request(method: str, url: str, *, body: Any = None, headers: dict[str, str] | None = None,
            timeout_s: float = 10.0, proxy: str | None = None, max_bytes: int = 4 << 20) -> Response:
    """One bounded request; never raises for network or HTTP errors."""
    data = None
    hdrs = {"Accept": "*/*", "User-Agent": "pdnode-verify/1"}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    t0 = time.monotonic()
    end = t0 + max(timeout_s, 0.05)
    try:
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)  # noqa: S310 - http(s) URLs from the plan
        op = opener(proxy) if proxy else _DIRECT
        try:
            resp = op.open(req, timeout=max(timeout_s, 0.05))
        except urllib.error.HTTPError as exc:
            resp = exc
        with resp:
            chunks = []
            size = 0
            while True:
                _tighten(resp, end)
                chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size >= max_bytes:
                    break
            return Response(url=url, status=resp.status if hasattr(resp, "status") else resp.code,
                            body=b"".join(chunks), headers={k.lower(): v for k, v in resp.headers.items()},
                            elapsed_s=time.monotonic() - t0)
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        return Response(url=url, status=None, error=_describe(exc), error_kind=_kind(exc),
                        elapsed_s=time.monotonic() - t0)


@dataclass
class StreamEvent:
    t: float  # seconds since the request was sent
    data: Any  # the decoded JSON of one SSE data line, or "[DONE]"


def stream_sse(url: str, *, body: Any, headers: dict[str, str] | None = None,
               timeout_s: float = 10.0, proxy: str | None = None) -> tuple[Response, list[StreamEvent]]:
    """POST a streaming request; collect SSE events with their arrival times."""
    hdrs = {"Accept": "text/event-stream", "Content-Type": "application/json", "User-Agent": "pdnode-verify/1"}
    hdrs.update(headers or {})
    t0 = time.monotonic()
    end = t0 + max(timeout_s, 0.05)
    events: list[StreamEvent] = []
    try:
        req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST", headers=hdrs)  # noqa: S310 - http(s) URLs from the plan
        op = opener(proxy) if proxy else _DIRECT
        try:
            resp = op.open(req, timeout=max(timeout_s, 0.05))
        except urllib.error.HTTPError as exc:
            with exc:
                return Response(url=url, status=exc.code, body=exc.read(1 << 20),
                                headers={k.lower(): v for k, v in exc.headers.items()},
                                elapsed_s=time.monotonic() - t0), events
        with resp:
            raw = bytearray()
            for line in _lines(resp, end):
                raw += line + b"\n"
                text = line.decode("utf-8", "replace").strip()
                if not text.startswith("data:"):
                    continue
                payload = text[len("data:"):].strip()
                now = time.monotonic() - t0
                if payload == "[DONE]":
                    events.append(StreamEvent(now, "[DONE]"))
                    break
                try:
                    events.append(StreamEvent(now, json.loads(payload)))
                except ValueError:
                    events.append(StreamEvent(now, payload))
            return Response(url=url, status=resp.status, body=bytes(raw[-65536:]),
                            headers={k.lower(): v for k, v in resp.headers.items()},
                            elapsed_s=time.monotonic() - t0), events
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        return Response(url=url, status=None, error=_describe(exc), error_kind=_kind(exc),
                        elapsed_s=time.monotonic() - t0), events


def _tighten(resp: Any, end: float) -> None:
    """Cut the socket's timeout to what is left of the request's time (best effort)."""
    left = end - time.monotonic()
    if left <= 0:
        raise TimeoutError
    try:
        resp.fp.raw._sock.settimeout(left)  # http.client's socket under the buffered reader
    except AttributeError:
        pass


def _lines(resp: Any, end: float) -> Iterator[bytes]:
    while True:
        _tighten(resp, end)
        line = resp.readline(1 << 20)
        if not line:
            return
        yield line.rstrip(b"\r\n")


def port_open(host: str, port: int, timeout_s: float = 2.0) -> str | None:
    """None when something accepts TCP connections on host:port, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return _describe(exc)
