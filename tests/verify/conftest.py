"""Shared helpers of the verification tests: fixtures paths, a minimal plan, fake servers."""

from __future__ import annotations

import json
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pytest

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
for p in (HERE, HERE.parent / "standin"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def minimal_plan(router_port: int = 1, **settings: Any) -> dict[str, Any]:
    """The parts of Plan.as_dict() the verifier reads: prefill-0 (port 2, bootstrap 3),
    decode-0 (port 4), the router on ROUTER_PORT (metrics on 5)."""
    from nodeplan import contract_plan

    return contract_plan(router_port, **settings)


Handler = Callable[[BaseHTTPRequestHandler, dict | None], tuple[int, Any]]


@contextmanager
def fake_server(handler: Handler) -> Iterator[str]:
    """A local HTTP server: handler(request, json body) -> (status, body). Yields its root URL."""

    class H(BaseHTTPRequestHandler):
        def _do(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            status, out = handler(self, body)
            data = out if isinstance(out, bytes) else (out.encode() if isinstance(out, str) else json.dumps(out).encode())
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _do

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def chat_answer(content: str, completion_tokens: int = 3, finish: str = "stop") -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens, "total_tokens": 5 + completion_tokens}}


def chat_reply(body: dict | None, content: str, completion_tokens: int) -> tuple[int, Any]:
    """A fake router's 200 to a chat request: one SSE chunk and [DONE] when BODY asks for a stream."""
    if (body or {}).get("stream"):
        chunk = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens}}
        return 200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    return 200, chat_answer(content, completion_tokens)


@pytest.fixture
def data_text() -> Callable[[str], str]:
    return lambda name: (DATA / name).read_text()
