"""proxy and access: what a client of the node meets on the way to the OpenAI endpoint
(proxy variables, the URL, the API key, the answer's shape); diagnoses in access.py."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from . import access as acc
from .base import FAIL, PASS, Ctx, Result, chat_body, conn_hint
from .http import Response, request


def check_proxy(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    env = ctx.run.env
    choice = acc.proxy_for(url, env)
    host = urlsplit(url).hostname or ""
    set_vars = acc.proxy_variables_set(env)
    if choice is None:
        if set_vars:
            return Result(PASS, f"proxy variables set ({', '.join(set_vars)}) but none applies to {host}")
        return Result(PASS, f"no proxy variable set: clients here connect to {host} directly")
    if choice.scheme.startswith("socks"):
        return Result(PASS, f"{choice.shown()} applies to {host} (SOCKS: not tested by this verifier; curl and "
                            "httpx send requests through it)", acc.bypass_hint(host, choice))
    probe = acc.join(ctx.t.base_url, "/v1/models")
    hdr = ctx.node_headers()
    direct = request("GET", probe, headers=hdr, timeout_s=min(5.0, ctx.limit()))
    via = request("GET", probe, headers=hdr, timeout_s=min(5.0, ctx.limit()), proxy=choice.url)
    finding = acc.diagnose_proxy(url, choice, direct.status, direct.error, via.status, via.error, via.text)
    if finding:
        return Result(FAIL, finding.problem, finding.hint)
    return Result(PASS, f"{choice.shown()} carries requests for {host}; through it GET /v1/models -> "
                        f"{via.short(80)} (directly: HTTP {direct.status})", acc.bypass_hint(host, choice))


def _client_post(ctx: Ctx, url: str, body: Any, header: str | None) -> Response:
    headers = {"Authorization": header} if header is not None else {}
    resp = request("POST", url, body=body, headers=headers, timeout_s=ctx.limit())
    ctx.mark(url, resp)
    return resp


def check_access(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    sent = ctx.client_header()
    body = chat_body(ctx, "Reply with the word OK.", ctx.s.max_tokens)
    # The disaggregation proof covers every request the verifier sends, this one included
    # (a failing probe can already trip the router's circuit breaker).
    ctx.snapshot("completion_before")
    resp = _client_post(ctx, url, body, sent)
    what = f"POST {url} with {acc.describe_header(sent)}"
    if resp.error_kind == "header":
        f = acc.diagnose_header_error(resp.error or "", sent, ctx.run.api_key_file, ctx.key_raw)
        return Result(FAIL, f.problem, f.hint)
    if not resp.reached:
        return Result(FAIL, f"{what}: {resp.short()}", conn_hint(resp, "the endpoint", ctx, "router"))
    if resp.status == 404:
        fixed = acc.doubled_v1(ctx.t.base_url)
        corrected = None
        if fixed is not None:
            corrected = _client_post(ctx, acc.join(fixed, acc.CHAT_PATH), body, sent).status
        f = acc.diagnose_url(ctx.t.base_url, 404, corrected)
        assert f is not None
        return Result(FAIL, f.problem, f.hint)
    if resp.status in (401, 403):
        fixed_by = None
        for label, variant in acc.header_variants(sent, ctx.key):
            if _client_post(ctx, url, body, variant).status not in (401, 403):
                fixed_by = label
                break
        f = acc.diagnose_auth(resp.status, sent, ctx.run.api_key_file, ctx.key_raw, fixed_by, resp.text)
        return Result(FAIL, f.problem, f.hint)
    if resp.status == 400 and ctx.s.max_tokens <= 0:
        return Result(FAIL, f"{what}: {resp.short()}: max_tokens was {ctx.s.max_tokens}",
                      "max_tokens 0 asks for no tokens (the router refuses it, servers answer empty content); "
                      "send max_tokens >= 1 (pdnode_verify_max_tokens, --max-tokens)")
    finding = acc.diagnose_body(resp.status, resp.json() if resp.ok else None, ctx.s.max_tokens)
    if resp.ok and resp.json() is None:
        finding = acc.diagnose_body(200, resp.text, ctx.s.max_tokens)
    if finding:
        return Result(FAIL, f"{what}: {finding.problem}", finding.hint)
    if resp.ok:
        data = resp.json()
        usage = data.get("usage") or {}
        return Result(PASS, f"{what}: HTTP 200, {usage.get('completion_tokens', '?')} tokens in {resp.elapsed_s:.2f} s")
    return Result(PASS, f"{what}: key and URL accepted; the server answered {resp.short(120)} "
                        "(generation is judged by the completion check)")
