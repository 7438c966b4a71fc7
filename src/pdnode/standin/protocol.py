"""Response bodies in SGLang 0.5.23's shapes (native /generate and the OpenAI routes).

Pure functions over plain data, shaped after sglang/srt/entrypoints/openai/protocol.py,
sse_utils.py and tokenizer_manager's meta_info.
"""

from __future__ import annotations

import json
from typing import Any

WEIGHT_VERSION = "default"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def matched_stop(finish: dict[str, Any] | None) -> Any:
    if finish and finish.get("type") == "stop":
        return finish.get("matched")
    return None


def openai_finish(finish: dict[str, Any] | None) -> str | None:
    return None if finish is None else str(finish["type"])


# --- errors ---------------------------------------------------------------------------
def error_generate(message: str) -> dict[str, Any]:
    """/generate's ValueError body (400s)."""
    return {"error": {"message": message}}


def error_openai(message: str, status: int, err_type: str | None = None) -> dict[str, Any]:
    """SGLang's ErrorResponse (OpenAI routes; and HTTPException, i.e. 5xx aborts, everywhere)."""
    if err_type is None:
        err_type = "BadRequestError" if status == 400 else str(status)
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def error_stream_generate(message: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": status, "retryable": False}}


def error_stream_openai(message: str, status: int) -> dict[str, Any]:
    name = {400: "BAD_REQUEST", 500: "INTERNAL_SERVER_ERROR", 503: "SERVICE_UNAVAILABLE"}.get(status, str(status))
    return {"error": error_openai(message, status, name)}


# --- /generate ------------------------------------------------------------------------
def generate_body(*, rid: str, text: str, output_ids: list[int], finish: dict[str, Any] | None,
                  prompt_tokens: int, completion_tokens: int, e2e_latency: float | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "weight_version": WEIGHT_VERSION,
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
    }
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}


# --- /v1/chat/completions ---------------------------------------------------------------
def chat_body(*, rid: str, created: int, model: str, text: str, finish: dict[str, Any] | None,
              prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "reasoning_content": None},
            "logprobs": None,
            "finish_reason": openai_finish(finish),
            "matched_stop": matched_stop(finish),
        }],
        "usage": usage(prompt_tokens, completion_tokens),
        "metadata": {"weight_version": WEIGHT_VERSION},
    }


def chat_chunk(*, rid: str, created: int, model: str, role: str | None = None, content: str | None = None,
               finish: dict[str, Any] | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"reasoning_content": None}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": openai_finish(finish),
            "matched_stop": matched_stop(finish),
        }],
    }


def chat_usage_chunk(*, rid: str, created: int, model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


# --- /v1/completions --------------------------------------------------------------------
def completion_body(*, rid: str, created: int, model: str, text: str, finish: dict[str, Any] | None,
                    prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": openai_finish(finish),
            "matched_stop": matched_stop(finish),
        }],
        "usage": usage(prompt_tokens, completion_tokens),
        "metadata": {"weight_version": WEIGHT_VERSION},
    }


def completion_chunk(*, rid: str, created: int, model: str, text: str, finish: dict[str, Any] | None,
                     usage_obj: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": openai_finish(finish),
            "matched_stop": matched_stop(finish),
        }],
        "usage": usage_obj,
    }


# --- info routes ------------------------------------------------------------------------
def models_body(*, served_model_name: str, model_path: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{
            "id": served_model_name,
            "object": "model",
            "created": created,
            "owned_by": "sglang",
            "root": model_path,
            "parent": None,
            "max_model_len": max_model_len,
        }],
    }
