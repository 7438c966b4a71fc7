"""completion and correctness: chat completions through the router (plain and streaming),
and the reference prompt's answer."""

from __future__ import annotations

import json
from typing import Any

from . import access as acc
from .base import FAIL, PASS, RUNBOOK, Ctx, Result, chat_body, fmt, fold_stream, make_prompt
from .checks_router import circuit_hint
from .http import Response, request, stream_sse


def error_hint(resp: Response, ctx: Ctx) -> str:
    text = resp.text.lower()
    if resp.status is None and resp.error_kind == "timeout":
        return (f"no answer in {ctx.limit():.0f} s: PD requests hang when decode cannot reach the bootstrap server or "
                "the KV cache never arrives (see bootstrap and disaggregation); " + RUNBOOK + "#completion")
    # the same condition in each router package: sglang-router 0.3.2's code, smg's
    if "server_selection_failed" in text or "no_available_workers" in text:
        return "the router has no healthy worker pair: see router"
    if "waitingforinput" in text or "transfer" in text:
        return ("the KV cache did not reach decode (SGLANG_DISAGGREGATION_WAITING_TIMEOUT expired or the transfer "
                "failed): check the transfer backend (Mooncake devices, MC_TCP_BIND_ADDRESS, firewalled dynamic ports); "
                "see disaggregation")
    if "bootstrap" in text or "handshake" in text:
        return "decode could not bootstrap with a prefill: see bootstrap.*; check the prefills' bootstrap ports and host"
    units = ", ".join(i.unit or i.id for i in ctx.t.instances)
    return f"read the error above and the engines' logs (journalctl -u UNIT -n 100 for {units})"


def check_completion(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    header = ctx.client_header()
    hdrs = {"Authorization": header} if header else {}
    prompt = make_prompt(ctx.s.prompt_words)
    if "completion_before" not in ctx.snaps:
        ctx.snapshot("completion_before")
    problems: list[str] = []
    hint = ""
    m: dict[str, Any] = {"prompt_words": ctx.s.prompt_words, "max_tokens": ctx.s.max_tokens}
    ctx.measurements["completion"] = m
    # non-streaming
    resp = request("POST", url, body=chat_body(ctx, prompt, ctx.s.max_tokens), headers=hdrs, timeout_s=ctx.limit())
    ctx.mark(url, resp)
    parts = []
    if not resp.ok:
        problems.append(f"non-streaming: {resp.short()}")
        hint = error_hint(resp, ctx)
    else:
        data = resp.json() or {}
        finding = acc.diagnose_body(200, data, ctx.s.max_tokens)
        choice = (data.get("choices") or [{}])[0] if isinstance(data, dict) else {}
        usage = data.get("usage") or {} if isinstance(data, dict) else {}
        finish = choice.get("finish_reason")
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        m["non_streaming"] = {"latency_s": round(resp.elapsed_s, 4), "finish_reason": finish,
                              "prompt_tokens": pt, "completion_tokens": ct}
        if finding:
            problems.append(f"non-streaming: {finding.problem}")
            hint = finding.hint
        if finish not in ("stop", "length"):
            problems.append(f"non-streaming: finish_reason {finish!r}")
        if not (isinstance(pt, int) and pt > 0 and isinstance(ct, int) and 0 < ct <= max(ctx.s.max_tokens, 1)):
            problems.append(f"non-streaming: usage prompt_tokens {pt}, completion_tokens {ct} "
                            f"(max_tokens {ctx.s.max_tokens})")
        parts.append(f"non-streaming {resp.elapsed_s:.2f} s, {pt} prompt + {ct} completion tokens, finish {finish}")
    # streaming (not tried when the plain request already failed: it would fail the same way, slowly)
    tried = resp.ok
    if not tried:
        parts.append("streaming not tried")
    else:
        sresp, events = stream_sse(url, body=chat_body(ctx, prompt, ctx.s.max_tokens, stream=True), headers=hdrs,
                                   timeout_s=ctx.limit())
        ctx.mark(url, sresp)
    if not tried:
        pass
    elif not sresp.ok:
        problems.append(f"streaming: {sresp.short()}")
        hint = hint or error_hint(sresp, ctx)
    else:
        text, finish, usage, ttft, errors = fold_stream(events)
        m["streaming"] = {"ttft_s": None if ttft is None else round(ttft, 4), "latency_s": round(sresp.elapsed_s, 4),
                          "chunks": len(events), "finish_reason": finish,
                          "completion_tokens": (usage or {}).get("completion_tokens")}
        if errors:
            problems.append(f"streaming: error chunk {errors[0]}")
            hint = hint or error_hint(Response(url, 500, json.dumps(errors[0]).encode()), ctx)
        elif not text:
            problems.append(f"streaming: no content in {len(events)} chunks")
        if not errors and finish not in ("stop", "length"):
            problems.append(f"streaming: finish_reason {finish!r}")
        if not events or events[-1].data != "[DONE]":
            problems.append("streaming: no [DONE] at the end")
        parts.append(f"streaming first token {fmt(ttft, 's')}, {len(events)} chunks, finish {finish}")
    ctx.wait_settled(ctx.snaps["completion_before"], 3)
    ctx.snapshot("completion_after")
    if problems:
        circuit = circuit_hint(ctx)
        if circuit:
            hint = circuit + (f"; {hint}" if hint and "no healthy worker pair" not in hint else "")
        return Result(FAIL, "; ".join(problems), hint or f"{RUNBOOK}#completion")
    if ctx.circuits:
        parts.append(f"served although the router's circuit breaker was not closed for {', '.join(ctx.circuits)} "
                     "at the router check (it let these requests through)")
    return Result(PASS, f"{ctx.s.prompt_words}-word prompt: " + "; ".join(parts))


def check_correctness(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    header = ctx.client_header()
    body = chat_body(ctx, ctx.s.reference_prompt, max(ctx.s.max_tokens, 8))
    resp = request("POST", url, body=body, headers={"Authorization": header} if header else {},
                   timeout_s=ctx.limit())
    if not resp.ok:
        return Result(FAIL, f"reference probe: {resp.short()}", error_hint(resp, ctx))
    data = resp.json() or {}
    try:
        answer = data["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        return Result(FAIL, f"reference probe: no answer in {acc._clip(data)}", "see access")
    want = ctx.s.reference_answer
    ctx.measurements["correctness"] = {"prompt": ctx.s.reference_prompt, "expected": want, "answer": answer[:200]}
    if want.lower() not in answer.lower():
        return Result(FAIL, f"{ctx.s.reference_prompt!r} -> {answer[:120]!r} (expected to contain {want!r})",
                      "HTTP 200 with a wrong answer: prefill and decode disagree on the KV layout (e.g. attention "
                      "TP/DP mismatch with few KV heads) or the wrong model is loaded; compare with one server "
                      f"without disaggregation; {RUNBOOK}#correctness")
    return Result(PASS, f"{ctx.s.reference_prompt!r} -> {answer[:80]!r} (contains {want!r})")
