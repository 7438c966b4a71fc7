"""SGLang's HTTP surface on --host:--port (aiohttp).

Routes: /health /health_generate /ready, /model_info /server_info (+ the deprecated
/get_model_info /get_server_info), /v1/models, POST /generate, /v1/chat/completions,
/v1/completions (stream and non-stream), /metrics (only with enable_metrics), and the
stand-in's /sim/faults, /sim/requests and /sim/ranks. With an API key every route but /health*, /ready* and /metrics
needs `Authorization: Bearer KEY` (401 {"error": "Unauthorized"} otherwise), as in
sglang/srt/utils/auth.py. Unknown routes answer FastAPI's {"detail": "Not Found"}.

Errors: admission errors (400 context length / missing bootstrap room, 500 error500,
503 while loading) are HTTP errors on every route, streaming or not; a failure after
admission (bootstrap or KV transfer failure) is an HTTP error without streaming and an
SSE error chunk followed by [DONE] with streaming, like SGLang.
"""

from __future__ import annotations

import collections
import json
import logging
import secrets
import time
from typing import Any
from collections.abc import Awaitable, Callable

from aiohttp import web

from . import VERSION, model, protocol
from .config import Settings, model_identity
from .engine import Engine, EngineError, GenRequest
from .faults import FaultError, Faults
from .metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("standin.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(Exception):
    pass


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=lambda o: json.dumps(o, ensure_ascii=False))


def _int_field(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{key} must be a non-negative integer, got {value!r}")
    return value


def _bootstrap(body: dict[str, Any]) -> dict[str, Any]:
    room = body.get("bootstrap_room")
    port = body.get("bootstrap_port")
    if room is not None and (isinstance(room, bool) or not isinstance(room, int)):
        raise BadRequest(f"bootstrap_room must be an integer, got {room!r}")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise BadRequest(f"bootstrap_port must be an integer, got {port!r}")
    host = body.get("bootstrap_host")
    return {"bootstrap_host": host if isinstance(host, str) else None, "bootstrap_port": port, "bootstrap_room": room}


class HttpApi:
    def __init__(self, settings: Settings, engine: Engine, faults: Faults, metrics: Metrics, launch_command: str) -> None:
        self.server = settings.server
        self.sim = settings.sim
        self.engine = engine
        self.faults = faults
        self.metrics = metrics
        self.launch_command = launch_command
        self.startup_time = time.time()
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=256)
        self.model_type, self.architectures = model_identity(self.server.model_path)
        self.app = web.Application(middlewares=[self._errors, self._auth], client_max_size=512 * 1024 * 1024)
        r = self.app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/ready", self.ready)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.get_model_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.get_server_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model_card)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/metrics", self.metrics_route)
        r.add_get("/sim/faults", self.get_faults)
        r.add_post("/sim/faults", self.post_faults)
        r.add_get("/sim/requests", self.get_requests)
        r.add_get("/sim/ranks", self.get_ranks)

    # --- middlewares -----------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.server.api_key
        path = request.path
        if key and request.method != "OPTIONS" and not path.startswith(("/health", "/ready", "/metrics")):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), key.encode()):
                return _json({"error": "Unauthorized"}, 401)
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return _json({"detail": "Not Found"}, 404)
        except web.HTTPMethodNotAllowed:
            return _json({"detail": "Method Not Allowed"}, 405)

    # --- health and info -------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.engine.status != "Up":
            return web.Response(status=503)
        ok = await self.engine.health_generate()
        return web.Response(status=200 if ok else 503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.engine.status == "Up" else 503)

    def _model_info(self) -> dict[str, Any]:
        s = self.server
        return {
            "model_path": s.model_path,
            "served_model_name": s.served_model_name,
            "tokenizer_path": s.resolved.get("tokenizer_path", s.model_path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": protocol.WEIGHT_VERSION,
            "load_format": s.resolved.get("load_format", "auto"),
            "reasoning_parser": s.resolved.get("reasoning_parser"),
            "tool_call_parser": s.resolved.get("tool_call_parser"),
            "disaggregation_mode": s.mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model_type,
            "architectures": self.architectures,
        }

    async def model_info(self, request: web.Request) -> web.Response:
        return _json(self._model_info())

    async def get_model_info(self, request: web.Request) -> web.Response:
        log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                    "Please use '/model_info' instead.")
        return await self.model_info(request)

    def _server_info(self) -> dict[str, Any]:
        s = self.server
        e = self.engine
        info = dict(s.resolved)
        info.update(
            launch_command=self.launch_command,
            max_total_num_tokens=self.sim.max_total_num_tokens,
            max_req_input_len=s.context_length - 1,
            model_type=self.model_type,
            architectures=self.architectures,
            startup_time=self.startup_time,
            internal_states=[
                {
                    "dp_rank": i,
                    "last_gen_throughput": e.last_gen_throughput[i],
                    "num_running_reqs": rank.running,
                    "num_queue_reqs": rank.queue,
                }
                for i, rank in enumerate(e.ranks)
            ],
            version=VERSION,
            frontend="python",
            pdnode_standin={
                "faults": self.faults.as_list(),
                "prefill_ms_per_token": self.sim.prefill_ms_per_token,
                "decode_ms_per_token": self.sim.decode_ms_per_token,
                "decode_ms_per_request": self.sim.decode_ms_per_request,
                "max_running_per_rank": self.engine.rank_model.max_running,
                "chunked_prefill_size": self.server.chunked_prefill_size,
                "kv_bytes_per_token": self.sim.kv_bytes_per_token,
                "kv_transfer": "mooncake tcp P2PHANDSHAKE",
            },
        )
        return info

    async def server_info(self, request: web.Request) -> web.Response:
        return _json(self._server_info())

    async def get_server_info(self, request: web.Request) -> web.Response:
        log.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                    "Please use '/server_info' instead.")
        return await self.server_info(request)

    async def models(self, request: web.Request) -> web.Response:
        return _json(protocol.models_body(
            served_model_name=self.server.served_model_name, model_path=self.server.model_path,
            created=int(self.startup_time), max_model_len=self.server.context_length,
        ))

    async def model_card(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.server.served_model_name:
            return _json(protocol.error_openai(f"The model '{name}' does not exist", 404, "invalid_request_error"), 404)
        body = protocol.models_body(
            served_model_name=self.server.served_model_name, model_path=self.server.model_path,
            created=int(self.startup_time), max_model_len=self.server.context_length,
        )
        return _json(body["data"][0])

    async def metrics_route(self, request: web.Request) -> web.Response:
        if not self.server.enable_metrics or self.faults.active("no_metrics"):
            return _json({"detail": "Not Found"}, 404)
        return web.Response(body=self.metrics.render(self.faults.renames), headers={"Content-Type": CONTENT_TYPE})

    # --- faults ----------------------------------------------------------------------
    def _loopback(self, request: web.Request) -> bool:
        return request.remote in ("127.0.0.1", "::1") or (request.remote or "").startswith("127.")

    async def get_faults(self, request: web.Request) -> web.Response:
        if not self._loopback(request):
            return _json({"error": "Forbidden"}, 403)
        return _json({"faults": self.faults.as_list()})

    async def get_requests(self, request: web.Request) -> web.Response:
        """The last 256 generation requests this process answered (oldest first)."""
        if not self._loopback(request):
            return _json({"error": "Forbidden"}, 403)
        return _json({"requests": list(self.recent)})

    async def get_ranks(self, request: web.Request) -> web.Response:
        """What each scheduler rank simulated (scheduler.RankStats): passes, simulated
        seconds, the largest decode batch, the last passes."""
        if not self._loopback(request):
            return _json({"error": "Forbidden"}, 403)
        return _json({"ranks": [s.stats.as_dict() for s in self.engine.schedulers]})

    async def post_faults(self, request: web.Request) -> web.Response:
        if not self._loopback(request):
            return _json({"error": "Forbidden"}, 403)
        try:
            body = await request.json()
            specs = body["faults"]
            if not isinstance(specs, list):
                raise FaultError("faults must be a list of strings")
            active = await self.faults.replace(specs)
        except (ValueError, KeyError, TypeError, FaultError) as exc:
            return _json({"error": f'expected {{"faults": [NAME[:ARG], ...]}}: {exc}'}, 400)
        log.warning("faults set to %s", active or "none")
        return _json({"faults": active})

    # --- generation ------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as exc:
            raise BadRequest(f"Invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("The request body must be a JSON object")
        return body

    def _error(self, exc: EngineError | BadRequest, native: bool) -> web.Response:
        if isinstance(exc, BadRequest):
            return _json(protocol.error_openai(str(exc), 400), 400)
        if exc.status == 400 and native:
            return _json(protocol.error_generate(exc.message), 400)
        return _json(protocol.error_openai(exc.message, exc.status), exc.status)

    def _log(self, route: str, req: GenRequest | None, status: int, completion_tokens: int, t0: float,
             sim_s: float | None = None) -> None:
        """One line per request: its simulated time (what a GPU would have taken, the
        engine's own report) when it produced tokens, and the host's wall time beside it."""
        if req is None:
            log.info("%s %d (rejected before admission)", route, status)
            return
        wall_ms = (time.monotonic() - t0) * 1000
        self.recent.append({
            "route": route, "rid": req.rid, "bootstrap_room": req.bootstrap_room, "status": status,
            "prompt_tokens": req.prompt_tokens, "completion_tokens": completion_tokens, "stream": req.stream,
            "ms": None if sim_s is None else round(sim_s * 1000, 3), "wall_ms": round(wall_ms, 3),
        })
        took = "no tokens" if sim_s is None else f"{sim_s * 1000:.1f}ms simulated"
        log.info("%s %d rid=%s room=%s prompt_tokens=%d completion_tokens=%d stream=%s %s (wall %.1fms)",
                 route, status, req.rid, req.bootstrap_room, req.prompt_tokens, completion_tokens,
                 req.stream, took, wall_ms)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        req: GenRequest | None = None
        try:
            body = await self._body(request)
            text, ids = body.get("text"), body.get("input_ids")
            if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
                raise BadRequest("Batch requests are not supported by the stand-in engine")
            if isinstance(text, str):
                question, prompt_tokens = text, model.count_tokens(text)
            elif isinstance(ids, list) and all(isinstance(i, int) for i in ids):
                question, prompt_tokens = " ".join(map(str, ids)), len(ids)
            else:
                raise BadRequest("Either text or input_ids should be provided.")
            sp = body.get("sampling_params") or {}
            if not isinstance(sp, dict):
                raise BadRequest("sampling_params must be an object")
            max_new = _int_field(sp, "max_new_tokens")
            req = GenRequest(
                question=question, prompt_tokens=prompt_tokens,
                max_new_tokens=128 if max_new is None and "max_new_tokens" not in sp else max_new,
                stream=bool(body.get("stream", False)), ignore_eos=bool(sp.get("ignore_eos", False)),
                rid=str(body["rid"]) if isinstance(body.get("rid"), str) else "", **_bootstrap(body),
            )
            self.engine.check_request(req)
        except (BadRequest, EngineError) as exc:
            self._log("/generate", req, getattr(exc, "status", 400), 0, t0)
            return self._error(exc, native=True)

        def chunk(text: str, ids: list[int], ev: Any, e2e: float | None) -> dict[str, Any]:
            return protocol.generate_body(
                rid=req.rid, text=text, output_ids=ids, finish=ev.finish, prompt_tokens=req.prompt_tokens,
                completion_tokens=ev.completion_tokens, e2e_latency=e2e,
            )

        if not req.stream:
            text, ids, last = "", [], None
            try:
                async for ev in self.engine.generate(req):
                    text += ev.piece
                    if ev.completion_tokens:
                        ids.append(ev.token_id)
                    last = ev
            except EngineError as exc:
                self._log("/generate", req, exc.status, 0, t0)
                return self._error(exc, native=True)
            self._log("/generate", req, 200, last.completion_tokens, t0, last.sim_s)
            return _json(chunk(text, ids, last, last.sim_s))

        resp = await self._sse(request)
        text, ids, n, sim_s = "", [], 0, None
        try:
            async for ev in self.engine.generate(req):
                text += ev.piece
                if ev.completion_tokens:
                    ids.append(ev.token_id)
                n, sim_s = ev.completion_tokens, ev.sim_s
                await resp.write(protocol.sse(chunk(text, ids, ev, ev.sim_s if ev.finish else None)))
        except EngineError as exc:
            await resp.write(protocol.sse(protocol.error_stream_generate(exc.message, exc.status)))
        await resp.write(protocol.SSE_DONE)
        await resp.write_eof()
        self._log("/generate", req, 200, n, t0, sim_s)
        return resp

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        return resp

    def _openai_common(self, body: dict[str, Any], question: str, prompt_tokens: int, max_new: int | None) -> GenRequest:
        n = body.get("n", 1)
        if n not in (None, 1):
            raise BadRequest("n > 1 is not supported by the stand-in engine")
        return GenRequest(
            question=question, prompt_tokens=prompt_tokens, max_new_tokens=max_new,
            stream=bool(body.get("stream", False)), ignore_eos=bool(body.get("ignore_eos", False)),
            rid=str(body["rid"]) if isinstance(body.get("rid"), str) else "", **_bootstrap(body),
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        created = int(time.time())
        req: GenRequest | None = None
        try:
            body = await self._body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise BadRequest("messages must be a non-empty list of message objects")
            max_new = _int_field(body, "max_completion_tokens")
            if max_new is None:
                max_new = _int_field(body, "max_tokens")
            prompt = model.apply_chat_template(messages)
            req = self._openai_common(body, model.last_user_text(messages), model.count_tokens(prompt), max_new)
            self.engine.check_request(req)
        except (BadRequest, EngineError) as exc:
            self._log("/v1/chat/completions", req, getattr(exc, "status", 400), 0, t0)
            return self._error(exc, native=False)
        name = body.get("model") or self.server.served_model_name
        rid = req.rid

        if not req.stream:
            try:
                text, last = await self._collect("/v1/chat/completions", req, t0)
            except EngineError as exc:
                return self._error(exc, native=False)
            return _json(protocol.chat_body(
                rid=rid, created=created, model=name, text=text, finish=last.finish,
                prompt_tokens=req.prompt_tokens, completion_tokens=last.completion_tokens,
            ))

        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        resp = await self._sse(request)
        n, finish, first, sim_s = 0, None, True, None
        try:
            async for ev in self.engine.generate(req):
                if first:
                    first = False
                    await resp.write(protocol.sse(protocol.chat_chunk(rid=rid, created=created, model=name, role="assistant", content="")))
                if ev.piece:
                    await resp.write(protocol.sse(protocol.chat_chunk(rid=rid, created=created, model=name, content=ev.piece)))
                n, finish, sim_s = ev.completion_tokens, ev.finish, ev.sim_s
            await resp.write(protocol.sse(protocol.chat_chunk(rid=rid, created=created, model=name, finish=finish)))
            if include_usage:
                await resp.write(protocol.sse(protocol.chat_usage_chunk(
                    rid=rid, created=created, model=name, prompt_tokens=req.prompt_tokens, completion_tokens=n)))
        except EngineError as exc:
            await resp.write(protocol.sse(protocol.error_stream_openai(exc.message, exc.status)))
        await resp.write(protocol.SSE_DONE)
        await resp.write_eof()
        self._log("/v1/chat/completions", req, 200, n, t0, sim_s)
        return resp

    async def _collect(self, route: str, req: GenRequest, t0: float) -> tuple[str, Any]:
        """A whole non-streaming generation: (text, last event); logs the outcome, and
        re-raises an EngineError for the caller to answer in its route's error format."""
        text, last = "", None
        try:
            async for ev in self.engine.generate(req):
                text += ev.piece
                last = ev
        except EngineError as exc:
            self._log(route, req, exc.status, 0, t0)
            raise
        self._log(route, req, 200, last.completion_tokens, t0, last.sim_s)
        return text, last

    async def completions(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        created = int(time.time())
        req: GenRequest | None = None
        try:
            body = await self._body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, str):
                question, prompt_tokens = prompt, model.count_tokens(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
                question, prompt_tokens = " ".join(map(str, prompt)), len(prompt)
            else:
                raise BadRequest("prompt must be a string or a list of token ids (batches are not supported)")
            max_new = _int_field(body, "max_tokens")
            if max_new is None and "max_tokens" not in body:
                max_new = 16
            req = self._openai_common(body, question, prompt_tokens, max_new)
            self.engine.check_request(req)
        except (BadRequest, EngineError) as exc:
            self._log("/v1/completions", req, getattr(exc, "status", 400), 0, t0)
            return self._error(exc, native=False)
        name = body.get("model") or self.server.served_model_name
        rid = req.rid
        echo = prompt if (body.get("echo") and isinstance(prompt, str)) else ""

        if not req.stream:
            try:
                text, last = await self._collect("/v1/completions", req, t0)
            except EngineError as exc:
                return self._error(exc, native=False)
            return _json(protocol.completion_body(
                rid=rid, created=created, model=name, text=echo + text, finish=last.finish,
                prompt_tokens=req.prompt_tokens, completion_tokens=last.completion_tokens,
            ))

        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        resp = await self._sse(request)
        n, first, sim_s = 0, True, None
        try:
            async for ev in self.engine.generate(req):
                piece = (echo + ev.piece) if first else ev.piece
                first = False
                n, sim_s = ev.completion_tokens, ev.sim_s
                await resp.write(protocol.sse(protocol.completion_chunk(
                    rid=rid, created=created, model=name, text=piece, finish=ev.finish)))
            if include_usage:
                chunk = protocol.completion_chunk(rid=rid, created=created, model=name, text="", finish=None,
                                                  usage_obj=protocol.usage(req.prompt_tokens, n))
                chunk["choices"] = []
                await resp.write(protocol.sse(chunk))
        except EngineError as exc:
            await resp.write(protocol.sse(protocol.error_stream_openai(exc.message, exc.status)))
        await resp.write(protocol.SSE_DONE)
        await resp.write_eof()
        self._log("/v1/completions", req, 200, n, t0, sim_s)
        return resp
