"""The request pipeline of one role, with SGLang's queues, timings and failure messages.

prefill: bootstrap queue (wait for decode's transfer info of this bootstrap_room) ->
         waiting queue (a running slot and KV pool space) -> forward (the rank's
         prefill passes, scheduler.py) -> inflight queue (Mooncake write to decode, status) ->
         answers with the first token, finish_reason length(0), like a real prefill.
decode:  prealloc queue (bootstrap: prefill info and rank endpoint; KV pool space; send
         transfer info) -> transfer queue (wait for the KV, up to
         SGLANG_DISAGGREGATION_WAITING_TIMEOUT) -> the rank's queue while its batch is full
         -> running (one token per decode step of the rank, scheduler.py; the first one
         comes with the KV).
unified: waiting queue -> forward -> running (disaggregation_mode null), both on the
         rank's one scheduler.
Counters follow SGLang: both sides count prompt tokens and requests when a request
finishes; prefill counts one generated token per request (the token its forward pass
produced), decode counts them all; TTFT and ITL are observed only where tokens stream
(decode/unified), the KV transfer metrics on the prefill, bootstrap timings on both.

Latencies are simulated GPU time, not the CPU's clock (scheduler.py): a request's TTFT
is its prefill's time on the prefill rank's timeline (queue and passes) plus the KV
hand-off at the path's speed, both sent to decode with the KV's status, plus its wait for
a place in the decode batch; each later token comes one decode step of the timeline
after the one before. The handshakes between the engines (bootstrap, transfer info) are
host work and add nothing. So a busy machine reports what an idle one does; only the
bootstrap and allocation timings, which SGLang spends on the host, stay wall-clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from dataclasses import dataclass
from collections.abc import AsyncIterator

from . import model
from .config import Settings
from .faults import Faults
from .kv import BootstrapError, DecodeKV, KVError, PrefillKV, TransferInfo
from .metrics import Metrics
from .scheduler import DecodeSlot, RankModel, RankScheduler

log = logging.getLogger("standin.engine")

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's health-check bootstrap host: no KV moves
DEFERRED_RELEASE_S = 10.0  # how long decode keeps the KV slot of a request it gave up on


class EngineError(Exception):
    """A request failed; status and message are what SGLang would answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class GenRequest:
    question: str  # what the model answers: the last user message, or the prompt
    prompt_tokens: int
    max_new_tokens: int | None
    stream: bool = False
    ignore_eos: bool = False
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    rid: str = ""

    def __post_init__(self) -> None:
        if not self.rid:
            self.rid = uuid.uuid4().hex


@dataclass
class TokenEvent:
    piece: str  # the text this token adds
    token_id: int
    completion_tokens: int  # tokens so far, this one included
    finish: dict | None  # SGLang's finish_reason on the last event
    sim_s: float = 0.0  # simulated seconds from the request's arrival to this token


@dataclass
class _Rank:
    running: int = 0
    queue: int = 0
    pd_queue_a: int = 0  # prefill bootstrap / decode prealloc
    pd_queue_b: int = 0  # prefill inflight / decode transfer
    generated: int = 0  # tokens since the last throughput sample


class Engine:
    def __init__(self, settings: Settings, faults: Faults, metrics: Metrics,
                 prefill_kv: PrefillKV | None = None, decode_kv: DecodeKV | None = None) -> None:
        self.server = settings.server
        self.sim = settings.sim
        # The KV path the engine's environment selects (logged with every hand-off)
        self.kv_path = settings.sim.kv_path(settings.server.transfer_backend)
        self.kv_gb_s = settings.sim.kv_speed_gb_s(settings.server.transfer_backend)
        self.faults = faults
        self.metrics = metrics
        self.prefill_kv = prefill_kv
        self.decode_kv = decode_kv
        self.mode = self.server.mode
        self.ranks = [_Rank() for _ in metrics.ranks]
        self._rr = itertools.cycle(range(len(self.ranks)))
        # SGLang splits max_running_requests over the attention-DP ranks; unset, the
        # stand-in's per-rank default stands for what a rank's KV memory would hold.
        srv = self.server
        per_rank = (max(1, srv.max_running_requests // srv.attn_dp_size) if srv.max_running_requests
                    else self.sim.max_running_per_rank)
        self.rank_model = RankModel(
            prefill_s_per_token=self.sim.prefill_ms_per_token / 1000.0 / srv.rank_gpus,
            chunk_tokens=srv.chunked_prefill_size,
            step_base_s=self.sim.decode_ms_per_token / 1000.0,
            step_per_request_s=self.sim.decode_ms_per_request / 1000.0,
            max_running=per_rank,
        )
        self.schedulers = [RankScheduler(self.rank_model, lambda: self.faults.latency_factor)
                           for _ in self.ranks]
        self._slots = asyncio.Semaphore(srv.max_running_requests or per_rank * len(self.ranks))
        self.status = "Starting"  # Starting | Up | Exiting
        self.last_gen_throughput = [0.0] * len(self.ranks)
        self._used_tokens = 0
        self._tasks: set[asyncio.Task[None]] = set()

    # --- helpers ---------------------------------------------------------------------
    def _background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _sleep_s(self, ms: float) -> float:
        return ms * self.faults.latency_factor / 1000.0

    def kv_bytes(self, prompt_tokens: int) -> int:
        return max(prompt_tokens, 1) * self.sim.kv_bytes_per_token

    def _gauges(self, r: int) -> None:
        rank = self.ranks[r]
        m = self.metrics
        m.set_gauge(r, "num_running_reqs", rank.running)
        m.set_gauge(r, "num_queue_reqs", rank.queue)
        if self.mode == "prefill":
            m.set_gauge(r, "num_prefill_bootstrap_queue_reqs", rank.pd_queue_a)
            m.set_gauge(r, "num_prefill_inflight_queue_reqs", rank.pd_queue_b)
        elif self.mode == "decode":
            m.set_gauge(r, "num_decode_prealloc_queue_reqs", rank.pd_queue_a)
            m.set_gauge(r, "num_decode_transfer_queue_reqs", rank.pd_queue_b)
        m.set_gauge(r, "token_usage", self._used_tokens / self.sim.max_total_num_tokens)

    def sample_throughput(self, interval_s: float) -> None:
        for r, rank in enumerate(self.ranks):
            self.last_gen_throughput[r] = rank.generated / interval_s
            rank.generated = 0
            self.metrics.set_gauge(r, "gen_throughput", self.last_gen_throughput[r])
            self._gauges(r)

    def check_request(self, req: GenRequest) -> None:
        """Admission checks that answer 400 before anything runs."""
        if self.status != "Up":
            raise EngineError(503, "The server is not ready yet (still loading the model).")
        total = req.prompt_tokens + (req.max_new_tokens or 0)
        if total > self.server.context_length:
            raise EngineError(
                400,
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.server.context_length} tokens. You requested a total of {total} tokens: "
                f"{req.prompt_tokens} tokens from the input messages and {req.max_new_tokens or 0} "
                f"tokens for the completion. Please reduce the number of tokens in the input "
                f"messages or the completion to fit within the limit.",
            )
        if self.mode != "null" and req.bootstrap_room is None:
            raise EngineError(
                400,
                f"Invalid request: Disaggregated request received without bootstrap room id. req.rid={req.rid!r}",
            )
        if self.faults.active("error500"):
            if self.mode == "prefill" and self.prefill_kv is not None and req.bootstrap_room is not None:
                self.prefill_kv.fail_room(req.bootstrap_room, "prefill failed (injected fault error500)")
            raise EngineError(500, "Internal server error (injected fault error500)")

    def completion_for(self, req: GenRequest) -> model.Completion:
        limit = max(self.server.context_length - req.prompt_tokens, 0)
        return model.generate(
            req.question, req.max_new_tokens, wrong=self.faults.active("wrong_output"),
            ignore_eos=req.ignore_eos, limit=limit,
        )

    # --- entry point -----------------------------------------------------------------
    async def generate(self, req: GenRequest) -> AsyncIterator[TokenEvent]:
        """Token events of one admitted request (call check_request first); EngineError
        before the first event on failure."""
        completion = self.completion_for(req)
        t0 = time.monotonic()
        produced = 0
        sim_s: float | None = None  # of the last event; a request that failed before one has none
        finished = False
        try:
            if self.mode == "prefill":
                gen = self._prefill(req, completion, t0)
            elif self.mode == "decode":
                gen = self._decode(req, completion, t0)
            else:
                gen = self._unified(req, completion, t0)
            async for ev in gen:
                produced = ev.completion_tokens
                sim_s = ev.sim_s
                yield ev
            finished = True
        except EngineError:
            finished = True
            raise
        finally:
            if not finished:  # the client went away (cancellation / generator closed)
                self.metrics.observe_aborted()
                log.info("request %s (room %s) aborted by the client", req.rid, req.bootstrap_room)
            # a failure is not GPU work: it reports the time the client waited
            self.metrics.observe_finished(
                prompt_tokens=req.prompt_tokens, generation_tokens=produced,
                e2e_s=sim_s if sim_s is not None else time.monotonic() - t0, stream=req.stream,
            )

    # --- prefill ---------------------------------------------------------------------
    async def _prefill(self, req: GenRequest, completion: model.Completion, t0: float) -> AsyncIterator[TokenEvent]:
        kv = self.prefill_kv
        assert kv is not None and req.bootstrap_room is not None
        room = req.bootstrap_room
        dp_groups = len(self.ranks)
        r = room % dp_groups if self.server.load_balance_method == "follow_bootstrap_room" else next(self._rr)
        rank = self.ranks[r]
        fake = req.bootstrap_host == FAKE_BOOTSTRAP_HOST
        state = None if fake else kv.open(room)
        nbytes = self.kv_bytes(req.prompt_tokens)
        failure: str | None = "aborted"
        offset: int | None = None
        info: TransferInfo | None = None
        try:
            # bootstrap queue: wait for decode's transfer info for this room
            rank.pd_queue_a += 1
            self._gauges(r)
            try:
                if state is not None:
                    info = await kv.wait_transfer_info(state, room)
            except BootstrapError as exc:
                self.metrics.inc(r, "num_bootstrap_failed_reqs")
                failure = str(exc)
                log.error("prefill bootstrap failed for req %s room %d: %s", req.rid, room, exc)
                raise EngineError(500, f"Prefill bootstrap failed for request rank=0 req.rid={req.rid!r} "
                                       f"req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): {exc}") from None
            finally:
                rank.pd_queue_a -= 1
            bootstrap_done = time.monotonic()
            # waiting queue: a running slot and pool space
            rank.queue += 1
            self._gauges(r)
            try:
                await self._slots.acquire()
                try:
                    offset = await kv.pool.alloc(nbytes)
                except BaseException as exc:
                    self._slots.release()
                    if isinstance(exc, KVError):
                        raise EngineError(400, str(exc)) from None
                    raise
            finally:
                rank.queue -= 1
            wait_entry = time.monotonic()
            self._used_tokens += req.prompt_tokens
            try:
                rank.running += 1
                self._gauges(r)
                try:
                    timing = await self.schedulers[r].prefill(req.prompt_tokens)
                    self.metrics.observe_queue_time(r, timing.queued_s)
                    kv.pool.stamp(offset, nbytes, room)
                finally:
                    rank.running -= 1
                transfer_s = self._transfer_s(nbytes)
                sim_s = timing.total_s + (transfer_s if info is not None else 0.0)
                # inflight queue: the KV goes to decode
                transfer_entry = time.monotonic()
                rank.pd_queue_b += 1
                self._gauges(r)
                try:
                    if info is not None:
                        if self.faults.active("transfer_stall"):
                            await self._stall(state, room, r)
                        if state is not None and state.aborted.is_set():
                            # decode gave up on this room: its slot may belong to another request now
                            self.metrics.inc(r, "num_transfer_failed_reqs")
                            failure = "aborted by decode"
                            raise EngineError(500, f"Prefill transfer aborted for request rank=0 req.rid={req.rid!r} "
                                                   f"req.bootstrap_room={room}: decode aborted the request")
                        try:
                            await kv.transfer(info, offset, nbytes, fail=self.faults.active("transfer_fail"))
                            await self._pace_handoff(transfer_entry, transfer_s)
                        except KVError as exc:
                            self.metrics.inc(r, "num_transfer_failed_reqs")
                            failure = str(exc)
                            raise EngineError(500, f"Prefill transfer failed for request rank=0 req.rid={req.rid!r} "
                                                   f"req.bootstrap_room={room} with exception "
                                                   f"KVTransferError(bootstrap_room={room}): {exc}") from None
                        await kv.notify(info, ok=True, sim_s=sim_s)
                finally:
                    rank.pd_queue_b -= 1
            finally:
                self._slots.release()
                self._used_tokens -= req.prompt_tokens
                kv.pool.release(offset, nbytes)
                self._gauges(r)
            if info is not None:
                total_mb = nbytes / (1024 * 1024)
                speed = (total_mb / 1024) / transfer_s if transfer_s > 0 else 0.0
                self.metrics.observe_kv_transfer(r, latency_ms=transfer_s * 1000, total_mb=total_mb, speed_gb_s=speed)
                self.metrics.observe_kv_bootstrap(
                    r, bootstrap_ms=(bootstrap_done - t0) * 1000, alloc_ms=(wait_entry - bootstrap_done) * 1000
                )
                log.info("prefill req %s room %d: %d prompt tokens, KV %.3f MB to %s over %s in %.2f ms (%.3f GB/s)",
                         req.rid, room, req.prompt_tokens, total_mb, info.session_id, self.kv_path,
                         transfer_s * 1000, speed)
            failure = None
        finally:
            if state is not None:
                kv.close_room(room, failure)
        prefill_finish = {"type": "length", "length": 0}
        if completion.words:
            yield TokenEvent(completion.pieces[0], completion.token_ids[0], 1, prefill_finish, sim_s)
        else:
            yield TokenEvent("", 0, 0, prefill_finish, sim_s)

    async def _stall(self, state, room: int, r: int) -> None:
        """transfer_stall: never send; fail when decode gives up (or after its timeout)."""
        log.warning("transfer_stall: holding the KV of room %d", room)
        try:
            await asyncio.wait_for(state.aborted.wait(), self.sim.waiting_timeout_s + self.sim.bootstrap_timeout_s)
        except TimeoutError:
            pass
        self.metrics.inc(r, "num_transfer_failed_reqs")
        raise EngineError(500, f"Prefill transfer failed for request rank=0 req.bootstrap_room={room} "
                               f"with exception KVTransferError(bootstrap_room={room}): KV transfer stalled (injected fault transfer_stall)")

    # --- decode ----------------------------------------------------------------------
    async def _decode(self, req: GenRequest, completion: model.Completion, t0: float) -> AsyncIterator[TokenEvent]:
        kv = self.decode_kv
        assert kv is not None and req.bootstrap_room is not None
        room = req.bootstrap_room
        r = next(self._rr)
        rank = self.ranks[r]
        fake = req.bootstrap_host == FAKE_BOOTSTRAP_HOST
        nbytes = self.kv_bytes(req.prompt_tokens)
        offset: int | None = None
        endpoint: tuple[str, int] | None = None
        reserved = 0
        delivered = False
        kv_s = 0.0  # the prefill's simulated seconds until this request's KV arrived
        try:
            # prealloc queue: bootstrap, allocate, send our transfer info
            rank.pd_queue_a += 1
            self._gauges(r)
            try:
                if not fake:
                    try:
                        endpoint = await kv.bootstrap(req.bootstrap_host, req.bootstrap_port, room)
                    except BootstrapError as exc:
                        self.metrics.inc(r, "num_bootstrap_failed_reqs")
                        msg = (f"Decode handshake failed for request rank=0 decode_req.req.rid={req.rid!r} "
                               f"decode_req.req.bootstrap_room={room} with exception "
                               f"KVTransferError(bootstrap_room={room}): {exc}")
                        log.error(msg)
                        raise EngineError(500, msg) from None
                bootstrap_done = time.monotonic()
                try:
                    offset = await kv.pool.alloc(nbytes)
                except KVError as exc:
                    raise EngineError(400, str(exc)) from None
                kv.pool.clear(offset, nbytes)
                self._used_tokens += req.prompt_tokens
                reserved = req.prompt_tokens
                fut = None
                if not fake:
                    fut = kv.expect(room)
                    try:
                        await kv.send_transfer_info(endpoint, room, offset, nbytes)
                    except BootstrapError as exc:
                        self.metrics.inc(r, "num_bootstrap_failed_reqs")
                        raise EngineError(500, f"Decode handshake failed for request rank=0 "
                                               f"decode_req.req.rid={req.rid!r} decode_req.req.bootstrap_room={room} "
                                               f"with exception KVTransferError(bootstrap_room={room}): {exc}") from None
            finally:
                rank.pd_queue_a -= 1
            transfer_entry = time.monotonic()
            self.metrics.observe_kv_bootstrap(
                r, bootstrap_ms=(bootstrap_done - t0) * 1000, alloc_ms=(transfer_entry - bootstrap_done) * 1000
            )
            # transfer queue: wait for the KV
            rank.pd_queue_b += 1
            self._gauges(r)
            try:
                if fut is not None:
                    try:
                        status = await asyncio.wait_for(fut, self.sim.waiting_timeout_s)
                    except TimeoutError:
                        await kv.abort(endpoint, room)
                        self._transfer_failed(r, req, f"Request {room} timed out after "
                                              f"{time.monotonic() - transfer_entry:.1f}s in KVPoll.WaitingForInput")
                    if status.get("status") != "success":
                        self._transfer_failed(r, req, str(status.get("reason") or "Failed due to an unknown reason from another rank"))
                    if not kv.pool.check(offset, nbytes, room):
                        self.metrics.inc(r, "num_transfer_failed_reqs")
                        raise EngineError(500, f"KV checksum mismatch for request {req.rid} room {room}")
                    delivered = True
                    kv_s = float(status.get("sim_s") or 0.0)
            finally:
                rank.pd_queue_b -= 1
                kv.forget(room)
            # running: generate (after waiting in the rank's queue while its batch is full)
            slot = await self._join(r, len(completion.words))
            try:
                async for ev in self._emit(req, completion, kv_s, r, slot):
                    self._used_tokens += 1
                    reserved += 1
                    yield ev
            finally:
                self.schedulers[r].leave(slot)
                rank.running -= 1
        finally:
            kv.forget(room)
            self._used_tokens -= reserved
            if not delivered and not fake and endpoint is not None and offset is not None:
                # Gave up before the KV arrived: tell the prefill (SGLang's abort notification)
                # and hold the slot a while, since a write may still be in flight (SGLang's
                # deferred KV release).
                self._background(kv.abort(endpoint, room))
                asyncio.get_running_loop().call_later(DEFERRED_RELEASE_S, kv.pool.release, offset, nbytes)
            elif offset is not None:
                kv.pool.release(offset, nbytes)
            self._gauges(r)

    def _transfer_s(self, nbytes: int) -> float:
        """The hand-off's simulated seconds: its bytes at the path's speed (PDNODE_SIM_KV_GB_S,
        the plan's for its path). This is what the KV metrics and TTFT report; the bytes
        really cross loopback TCP through Mooncake, and that time is the host's, not the
        link's."""
        return nbytes / (self.kv_gb_s * 1e9)

    async def _pace_handoff(self, started: float, transfer_s: float) -> None:
        """On the wall clock too, a hand-off takes at least its simulated time (loopback is
        faster than a TCP link between hosts), so the stand-in's pace models the slower
        paths; when the real copy took longer (a busy machine), nothing is added."""
        remaining = transfer_s - (time.monotonic() - started)
        if remaining > 0:
            await asyncio.sleep(remaining)

    def _transfer_failed(self, r: int, req: GenRequest, reason: str) -> None:
        self.metrics.inc(r, "num_transfer_failed_reqs")
        msg = (f"Decode transfer failed for request rank=0 decode_req.req.rid={req.rid!r} "
               f"decode_req.req.bootstrap_room={req.bootstrap_room} with exception "
               f"KVTransferError(bootstrap_room={req.bootstrap_room}): {reason}")
        log.error(msg)
        raise EngineError(500, msg)

    # --- unified ---------------------------------------------------------------------
    async def _unified(self, req: GenRequest, completion: model.Completion, t0: float) -> AsyncIterator[TokenEvent]:
        r = next(self._rr)
        rank = self.ranks[r]
        rank.queue += 1
        self._gauges(r)
        try:
            await self._slots.acquire()
        finally:
            rank.queue -= 1
        self._used_tokens += req.prompt_tokens
        try:
            rank.running += 1
            self._gauges(r)
            try:
                timing = await self.schedulers[r].prefill(req.prompt_tokens)
                self.metrics.observe_queue_time(r, timing.queued_s)
            finally:
                rank.running -= 1
            slot = await self._join(r, len(completion.words))
            try:
                async for ev in self._emit(req, completion, timing.total_s, r, slot):
                    yield ev
            finally:
                self.schedulers[r].leave(slot)
                rank.running -= 1
        finally:
            self._used_tokens -= req.prompt_tokens
            self._slots.release()
            self._gauges(r)

    async def _join(self, r: int, words: int) -> DecodeSlot:
        """A place in rank r's decode batch (counted in num_queue_reqs while it waits);
        returns counted in num_running_reqs."""
        rank = self.ranks[r]
        rank.queue += 1
        self._gauges(r)
        try:
            slot = await self.schedulers[r].join(max(words - 1, 0))
        finally:
            rank.queue -= 1
        rank.running += 1
        self._gauges(r)
        return slot

    async def _emit(self, req: GenRequest, completion: model.Completion, before_s: float, r: int,
                    slot: DecodeSlot) -> AsyncIterator[TokenEvent]:
        """The request's tokens as the rank's timeline makes them: the first when it joins
        the batch, `before_s` (its simulated time before it asked to join) plus its wait
        for a place; each next one at the end of the decode step that made it."""
        n = len(completion.words)
        at = slot.admitted
        sim_s = before_s + (at - slot.arrival)
        for i in range(n):
            if i:
                step_end = await slot.tokens.get()  # the rank's next decode step
                self.metrics.observe_itl(step_end - at)
                sim_s += step_end - at
                at = step_end
            else:
                self.metrics.observe_ttft(sim_s, req.stream)
            self.ranks[r].generated += 1
            yield TokenEvent(completion.pieces[i], completion.token_ids[i], i + 1,
                             completion.finish_reason if i == n - 1 else None, sim_s)
        if n == 0:
            yield TokenEvent("", 0, 0, completion.finish_reason, sim_s)

    async def health_generate(self) -> bool:
        """SGLang's /health_generate: a 1-token generation with a fake bootstrap host."""
        if self.status != "Up":
            return False
        await asyncio.sleep(self._sleep_s(self.sim.prefill_ms_per_token))
        return True
