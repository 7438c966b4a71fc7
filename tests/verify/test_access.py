"""Access-layer diagnoses: the pure functions, and each fault made to happen for real
against small local servers (an OpenAI-compatible endpoint that wants a key, a gateway
that answers errors inside a 200, a forwarding proxy, a port that refuses)."""

from __future__ import annotations

import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import chat_answer, fake_server, minimal_plan

from pdnode.verify import access as acc
from pdnode.verify.checks import FAIL, PASS, Ctx, check_access, check_proxy
from pdnode.verify.config import build_run

KEY = "sk-test-0123456789"


# --- pure functions ------------------------------------------------------------------
def test_proxy_selection_and_no_proxy():
    env = {"http_proxy": "http://proxy:3128", "HTTPS_PROXY": "http://sproxy:3128"}
    assert acc.proxy_for("http://10.0.0.5:8000/v1/chat/completions", env).variable == "http_proxy"
    assert acc.proxy_for("https://gw.example/v1", env).variable == "HTTPS_PROXY"
    assert acc.proxy_for("http://h:8000", {"ALL_PROXY": "socks5://s:1080"}).scheme == "socks5"
    assert acc.proxy_for("http://h:8000", {}) is None
    assert acc.proxy_for("http://10.0.0.5:8000", {**env, "no_proxy": "10.0.0.0/8"}) is None
    assert acc.proxy_for("http://node.lab.example:8000", {**env, "NO_PROXY": ".example"}) is None
    assert acc.proxy_for("http://node:8000", {**env, "no_proxy": "node:9000"}).variable == "http_proxy"
    assert acc.proxy_for("http://node:8000", {**env, "no_proxy": "*"}) is None
    assert acc.proxy_for("http://127.0.0.1:8000", {"HTTP_PROXY": "http://p:1", "no_proxy": "localhost"}) is not None


def test_proxy_diagnosis_names_variable_and_bypass():
    choice = acc.proxy_for("http://10.1.2.3:8000/v1/chat/completions", {"HTTP_PROXY": "http://u:pw@p:3128"})
    f = acc.diagnose_proxy("http://10.1.2.3:8000/v1/chat/completions", choice, 200, None, 403, None, "Access denied")
    assert "HTTP_PROXY=http://u:***@p:3128" in f.problem and "pw" not in f.problem
    assert "answered HTTP 403" in f.problem and "curl ignores upper-case" in f.problem
    assert "NO_PROXY=10.1.2.3" in f.hint
    assert acc.diagnose_proxy("http://h/", choice, 200, None, 200, None) is None  # a working proxy


def test_describe_header_never_shows_the_key():
    text = acc.describe_header(f"Bearer {KEY}")
    assert KEY not in text and "Bearer <key: 18 chars" in text
    assert acc.describe_header(None) == "no Authorization header"
    assert "Bearer Bearer" in acc.describe_header(f"Bearer Bearer {KEY}")


def test_key_file_shapes():
    assert acc.key_file_problems(KEY + "\n") == []
    assert "Windows line ending" in acc.key_file_problems(KEY + "\r\n")[0]
    assert "more than one newline" in acc.key_file_problems(KEY + "\n\n")[0]
    assert any("Bearer" in p for p in acc.key_file_problems(f"Bearer {KEY}\n"))
    assert acc.key_from_file_content(KEY + "\n") == KEY


def test_header_variants():
    assert acc.header_variants(KEY, KEY) == [("without the word 'Bearer'", f"Bearer {KEY}")]
    assert acc.header_variants(f"Bearer Bearer {KEY}", KEY)[0] == ("with 'Bearer' doubled", f"Bearer {KEY}")
    assert acc.header_variants(f"Bearer {KEY}", KEY) == []


def test_doubled_v1():
    assert acc.doubled_v1("http://h:8000/v1") == "http://h:8000"
    assert acc.doubled_v1("http://h:8000/v1/") == "http://h:8000"
    assert acc.doubled_v1("http://h:8000") is None
    f = acc.diagnose_url("http://h:8000/v1", 404, 200)
    assert "/v1/v1" in f.problem and "--base-url http://h:8000" in f.hint


def test_body_diagnoses():
    assert acc.diagnose_body(200, chat_answer("hi"), 4) is None
    assert "no 'choices'" in acc.diagnose_body(200, {"error": {"message": "quota"}}, 4).problem
    assert "quota" in acc.diagnose_body(200, {"error": {"message": "quota"}}, 4).problem
    assert "max_tokens was 0" in acc.diagnose_body(200, {"choices": []}, 0).hint
    assert "max_tokens was 0" in acc.diagnose_body(200, chat_answer("", 0, "length"), 0).problem
    assert acc.diagnose_body(500, None, 4) is None


# --- for real, against local servers --------------------------------------------------
def openai_server(key: str | None = KEY, mode: str = "ok"):
    def handler(req: BaseHTTPRequestHandler, body: dict | None) -> tuple[int, Any]:
        if req.path not in ("/v1/chat/completions", "/v1/models"):
            return 404, {"detail": "Not Found"}
        if key is not None and req.headers.get("Authorization") != f"Bearer {key}":
            return 401, {"error": "Unauthorized"}
        if req.path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "m"}]}
        if mode == "error200":
            return 200, {"error": {"message": "upstream model 'm' is overloaded", "code": 529}}
        n = (body or {}).get("max_tokens")
        if n == 0:
            return 200, chat_answer("", 0, "length")
        return 200, chat_answer("OK")
    return fake_server(handler)


def _check(base: str, tmp_path, key_content: str | None = KEY + "\n", env: dict | None = None, **kw: Any):
    key_file = None
    if key_content is not None:
        key_file = tmp_path / "key"
        key_file.write_text(key_content, newline="")
        key_file = str(key_file)
    run = build_run(minimal_plan(), base_url=base, api_key_file=key_file, env=env or {}, **kw)
    return Ctx(run)


def test_access_ok(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path))
    assert res.status == PASS, res
    assert KEY not in res.evidence


def test_wrong_key(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path, key_content="sk-wrong\n"))
    assert res.status == FAIL and "was rejected: not the key the endpoint expects" in res.evidence
    assert "sha256sum" in res.hint and "sk-wrong" not in res.evidence


def test_key_missing(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path, key_content=None))
    assert res.status == FAIL and "none was sent" in res.evidence and "--api-key-file" in res.hint


def test_bearer_missing(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path, auth_template="{key}"))
    assert res.status == FAIL and "without the word 'Bearer'" in res.evidence


def test_bearer_doubled_by_the_key_file(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path, key_content=f"Bearer {KEY}\n"))
    assert res.status == FAIL and "'Bearer' twice" in res.evidence


def test_trailing_newlines_in_key_file(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path, key_content=KEY + "\n\n"))
    assert res.status == FAIL
    assert "more than one newline" in res.evidence and "printf %s" in res.hint


def test_windows_line_ending_in_key_file(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path, key_content=KEY + "\r\n"))
    assert res.status == FAIL and "Windows line ending" in res.evidence


def test_200_without_choices(tmp_path):
    with openai_server(mode="error200") as base:
        res = check_access(_check(base, tmp_path))
    assert res.status == FAIL and "no 'choices'" in res.evidence and "overloaded" in res.evidence


def test_max_tokens_zero(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base, tmp_path, max_tokens=0))
    assert res.status == FAIL and "max_tokens was 0" in res.evidence + res.hint


def test_doubled_v1_for_real(tmp_path):
    with openai_server() as base:
        res = check_access(_check(base + "/v1", tmp_path))
    assert res.status == FAIL and "/v1/v1" in res.evidence
    assert f"{base}/v1/chat/completions answers HTTP 200" in res.evidence
    assert f"--base-url {base}" in res.hint


def test_unreachable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = check_access(_check(f"http://127.0.0.1:{port}", tmp_path))
    assert res.status == FAIL and "connection refused" in res.evidence


# --- proxies, for real ------------------------------------------------------------------
def refusing_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Proxy(BaseHTTPRequestHandler):
    """A tiny forwarding HTTP proxy (absolute-URI requests), or a denying one."""

    deny = False

    def _do(self) -> None:
        if self.deny:
            self.send_response(403)
            self.send_header("Content-Length", "13")
            self.end_headers()
            self.wfile.write(b"Access denied")
            return
        n = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(n) if n else None
        req = urllib.request.Request(self.path, data=data, method=self.command,
                                     headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            resp = opener.open(req, timeout=5)
        except urllib.error.HTTPError as exc:
            resp = exc
        body = resp.read()
        self.send_response(resp.status if hasattr(resp, "status") else resp.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _do

    def log_message(self, *args: Any) -> None:
        pass


def proxy_server(deny: bool) -> ThreadingHTTPServer:
    handler = type("P", (_Proxy,), {"deny": deny})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv


def test_proxy_variable_pointing_at_a_refusing_port(tmp_path):
    with openai_server() as base:
        env = {"http_proxy": f"http://127.0.0.1:{refusing_port()}"}
        res = check_proxy(_check(base, tmp_path, env=env))
    assert res.status == FAIL
    assert "http_proxy=" in res.evidence and "connection refused" in res.evidence
    assert "NO_PROXY=127.0.0.1" in res.hint


@pytest.mark.parametrize("deny", [False, True])
def test_proxy_that_forwards_or_denies(tmp_path, deny):
    srv = proxy_server(deny)
    try:
        with openai_server() as base:
            env = {"HTTP_PROXY": f"http://127.0.0.1:{srv.server_address[1]}"}
            res = check_proxy(_check(base, tmp_path, env=env))
    finally:
        srv.shutdown()
        srv.server_close()
    if deny:
        assert res.status == FAIL and "answered HTTP 403" in res.evidence and "Access denied" in res.evidence
    else:
        assert res.status == PASS and "carries requests" in res.evidence


def test_no_proxy_excludes_the_host(tmp_path):
    with openai_server() as base:
        env = {"http_proxy": f"http://127.0.0.1:{refusing_port()}", "no_proxy": "127.0.0.1"}
        res = check_proxy(_check(base, tmp_path, env=env))
    assert res.status == PASS and "none applies" in res.evidence
