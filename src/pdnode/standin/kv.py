"""KV cache hand-off: pools, the real Mooncake transfer engine, and the P<->D control channel.

The shape follows SGLang's Mooncake backend (disaggregation/mooncake/conn.py):
1. Each side owns a KV pool (an anonymous mapping) registered with its Mooncake
   TransferEngine, initialised as TransferEngine().initialize(ip, "P2PHANDSHAKE", "tcp", "");
   its session id is "ip:rpc_port".
2. Each prefill rank registers rank_ip/rank_port with the bootstrap server (PUT /route).
   Here one process plays every rank, so all ranks share one control endpoint: a small
   aiohttp listener on the advertised host and a kernel-chosen port (real SGLang: ZMQ).
3. Decode, per request: GET /route (-1s) for the prefill's parallel info (cached per
   bootstrap address, dropped after failed heartbeats), GET /route for the target rank's
   endpoint, once per endpoint POST /kv/register (KVArgsRegisterInfo: session id and pool
   base pointer), then POST /kv/transfer_info (TransferInfo: room, endpoint, dst_port,
   session id, destination offset and length).
4. Prefill, after its forward pass, writes the request's KV from its pool into decode's
   pool (one slice per prefill attention-TP rank), then POSTs /kv/status {room, status:
   success} to decode's control endpoint. Failures send status failed; decode's timeout
   sends POST /kv/abort to the prefill. SGLang writes with batch_transfer_sync_write, whose
   thread spins on the transfer's status until it ends: on a GPU host's many cores that is
   free, on a shared 2-core test machine every spinning thread takes CPU from the threads
   that move the bytes and from the event loop (the stand-ins' /health went silent for a
   minute beside two CPU burners). The stand-in submits each slice with
   transfer_submit_write and polls transfer_check_status between asyncio sleeps instead:
   the same Mooncake transport and bytes, without the spin.
The bytes carry the room id at both ends so decode can check it received this request's
KV (SGLang's KV checksum path).
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import logging
import mmap
import os
import struct
import time
from typing import Any

import aiohttp
from aiohttp import web

from .sessions import FailedSessions, dead_session_reason

log = logging.getLogger("standin.kv")

_ALIGN = 64
# Polling a submitted write: the first check after POLL_MIN_S, backing off to POLL_MAX_S
# (a loopback slice takes about a millisecond); the deadline is Mooncake's own for a
# synchronous write: MC_TRANSFER_TIMEOUT seconds (30, at least 5) plus a second per GiB.
POLL_MIN_S, POLL_MAX_S = 0.0005, 0.01
_SUBMIT_FAILED = (-1, 2**64 - 1)  # transfer_submit_write's -1, as a signed or an unsigned batch id
_HEADER = struct.Struct("<QQ")  # room, nbytes (at the start and at the end of the slot)


class KVError(Exception):
    """A hand-off failure; str() is SGLang's failure reason."""


class BootstrapError(KVError):
    pass


class TransferError(KVError):
    pass


# --- the pool ---------------------------------------------------------------------------
class KVPool:
    """A registered byte pool with a first-fit allocator; waits when full."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._map = mmap.mmap(-1, size)
        self._buf = (ctypes.c_char * size).from_buffer(self._map)
        self.base = ctypes.addressof(self._buf)
        self._free: list[tuple[int, int]] = [(0, size)]
        self.used = 0
        self._changed = asyncio.Event()

    @staticmethod
    def slot_size(nbytes: int) -> int:
        nbytes = max(nbytes, 2 * _HEADER.size)
        return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN

    def _try_alloc(self, size: int) -> int | None:
        for i, (off, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[i]
                else:
                    self._free[i] = (off + size, length - size)
                self.used += size
                return off
        return None

    async def alloc(self, nbytes: int) -> int:
        size = self.slot_size(nbytes)
        if size > self.size:
            raise KVError(f"KV pool too small: {nbytes} bytes requested, pool has {self.size}")
        while True:
            off = self._try_alloc(size)
            if off is not None:
                return off
            self._changed.clear()
            await self._changed.wait()

    def release(self, offset: int, nbytes: int) -> None:
        size = self.slot_size(nbytes)
        self.used -= size
        free = self._free
        free.append((offset, size))
        free.sort()
        merged: list[tuple[int, int]] = []
        for off, length in free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((off, length))
        self._free = merged
        self._changed.set()

    def stamp(self, offset: int, nbytes: int, room: int) -> None:
        """Fill a slot the way prefill's forward pass would: recognisable bytes."""
        size = self.slot_size(nbytes)
        ctypes.memset(self.base + offset, room & 0xFF, size)
        header = _HEADER.pack(room & 0xFFFFFFFFFFFFFFFF, nbytes)
        ctypes.memmove(self.base + offset, header, _HEADER.size)
        ctypes.memmove(self.base + offset + size - _HEADER.size, header, _HEADER.size)

    def clear(self, offset: int, nbytes: int) -> None:
        size = self.slot_size(nbytes)
        ctypes.memset(self.base + offset, 0, _HEADER.size)
        ctypes.memset(self.base + offset + size - _HEADER.size, 0, _HEADER.size)

    def check(self, offset: int, nbytes: int, room: int) -> bool:
        size = self.slot_size(nbytes)
        expect = _HEADER.pack(room & 0xFFFFFFFFFFFFFFFF, nbytes)
        head = ctypes.string_at(self.base + offset, _HEADER.size)
        tail = ctypes.string_at(self.base + offset + size - _HEADER.size, _HEADER.size)
        return head == expect and tail == expect


# --- the transfer engine ----------------------------------------------------------------
class MooncakeEngine:
    def __init__(self, host: str) -> None:
        from mooncake.engine import TransferEngine  # imported late: needs libibverbs

        # The simulated host's transport was judged from the environment (config.py); this
        # process's own Mooncake moves the bytes over loopback TCP on a host without NICs,
        # where the plan's MC_FORCE_HCA (RDMA path) would make it refuse to start.
        os.environ.pop("MC_FORCE_HCA", None)
        self._te = TransferEngine()
        rc = self._te.initialize(host, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"Mooncake TransferEngine.initialize({host!r}, P2PHANDSHAKE, tcp) returned {rc}")
        self.session_id = f"{host}:{self._te.get_rpc_port()}"

    def register(self, pool: KVPool) -> None:
        rc = self._te.register_memory(pool.base, pool.size)
        if rc != 0:
            raise RuntimeError(f"Mooncake register_memory of {pool.size} bytes returned {rc}")

    async def write(self, session_id: str, srcs: list[int], dsts: list[int], lens: list[int]) -> int:
        """0 when every slice arrived, -1 when one failed or the deadline passed (like
        batch_transfer_sync_write, without its spinning thread: see the module's docstring)."""
        te = self._te
        deadline = time.monotonic() + transfer_timeout_s() + sum(lens) / 2**30
        pending = []
        for src, dst, n in zip(srcs, dsts, lens):
            # in a thread: the first write to a session opens it (a handshake over the network)
            batch = await asyncio.to_thread(te.transfer_submit_write, session_id, src, dst, n)
            if batch in _SUBMIT_FAILED:
                return -1
            pending.append(batch)
        wait = POLL_MIN_S
        while pending:
            await asyncio.sleep(wait)
            wait = min(wait * 2, POLL_MAX_S)
            still = []
            for batch in pending:
                status = te.transfer_check_status(batch)  # 1 done, 0 running, -1 failed, -2 timed out
                if status < 0:
                    return -1
                if status == 0:
                    still.append(batch)
            pending = still
            if pending and time.monotonic() > deadline:
                return -1
        return 0


def transfer_timeout_s() -> float:
    """Mooncake's timeout of a synchronous write (transfer_engine_py.cpp): MC_TRANSFER_TIMEOUT
    seconds, at least 5; 30 when unset."""
    try:
        return float(max(5, int(os.environ.get("MC_TRANSFER_TIMEOUT", "30"))))
    except ValueError:
        return 30.0


@dataclasses.dataclass
class TransferInfo:
    room: int
    endpoint: str
    dst_port: int
    session_id: str
    dst_offset: int
    dst_len: int


@dataclasses.dataclass
class _Room:
    info: asyncio.Future[TransferInfo]
    aborted: asyncio.Event
    created: float
    owned: bool = False
    failed: str | None = None


async def _post(session: aiohttp.ClientSession, url: str, payload: dict[str, Any], timeout: float = 5.0) -> int:
    async with session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        await resp.read()
        return resp.status


class _ControlServer:
    def __init__(self, host: str, routes: list[web.RouteDef]) -> None:
        self.host = host
        self.app = web.Application()
        self.app.add_routes(routes)
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=self.host, port=0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# --- prefill side -----------------------------------------------------------------------
class PrefillKV:
    def __init__(self, *, host: str, pool_bytes: int, session: aiohttp.ClientSession,
                 bootstrap_timeout_s: float, shards: int, failed_sessions: FailedSessions) -> None:
        self.host = host
        self.failed_sessions = failed_sessions
        self.session = session
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.shards = max(shards, 1)
        self.pool = KVPool(pool_bytes)
        self.engine: MooncakeEngine | None = None
        self.decode_kv_args: dict[str, dict[str, Any]] = {}
        self.rooms: dict[int, _Room] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.control = _ControlServer(host, [
            web.post("/kv/register", self._h_register),
            web.post("/kv/transfer_info", self._h_transfer_info),
            web.post("/kv/abort", self._h_abort),
        ])

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        self.engine = await asyncio.to_thread(MooncakeEngine, self.host)
        self.engine.register(self.pool)
        await self.control.start()
        self.failed_sessions.start()
        log.info("prefill KV: mooncake session %s, pool %d MiB, control endpoint %s:%d",
                 self.engine.session_id, self.pool.size >> 20, self.host, self.control.port)

    async def close(self) -> None:
        await self.failed_sessions.close()
        await self.control.close()

    def _room(self, room: int) -> _Room:
        now = time.monotonic()
        stale = [r for r, s in self.rooms.items() if not s.owned and now - s.created > self.bootstrap_timeout_s + 60]
        for r in stale:
            del self.rooms[r]
        state = self.rooms.get(room)
        if state is None:
            state = _Room(asyncio.get_running_loop().create_future(), asyncio.Event(), now)
            self.rooms[room] = state
        return state

    # control endpoint handlers
    async def _h_register(self, request: web.Request) -> web.Response:
        data = await request.json()
        self.decode_kv_args[str(data["mooncake_session_id"])] = data
        log.info("decode KV args registered: session %s", data["mooncake_session_id"])
        return web.Response(text="OK")

    async def _h_transfer_info(self, request: web.Request) -> web.Response:
        data = await request.json()
        info = TransferInfo(
            room=int(data["room"]), endpoint=str(data["endpoint"]), dst_port=int(data["dst_port"]),
            session_id=str(data["mooncake_session_id"]), dst_offset=int(data["dst_offset"]),
            dst_len=int(data["dst_len"]),
        )
        if info.session_id not in self.decode_kv_args:
            return web.Response(text=f"unknown mooncake session {info.session_id}", status=400)
        state = self._room(info.room)
        if state.info.done():
            return web.Response(text=f"room {info.room} already has a receiver", status=409)
        state.info.set_result(info)
        if state.failed is not None:
            # A late receiver of a failed room is told at once (SGLang keeps a tombstone).
            self._background(self.notify(info, ok=False, reason=state.failed))
        return web.Response(text="OK")

    async def _h_abort(self, request: web.Request) -> web.Response:
        data = await request.json()
        state = self._room(int(data["room"]))
        state.failed = state.failed or "aborted by decode"
        state.aborted.set()
        return web.Response(text="OK")

    # engine API
    def open(self, room: int) -> _Room:
        state = self._room(room)
        state.owned = True
        return state

    def close_room(self, room: int, failure: str | None = None) -> None:
        state = self.rooms.get(room)
        if state is None:
            return
        if failure is None:
            del self.rooms[room]
            return
        state.owned = False
        state.created = time.monotonic()
        state.failed = state.failed or failure
        if state.info.done():
            self._background(self.notify(state.info.result(), ok=False, reason=state.failed))

    def fail_room(self, room: int, reason: str) -> None:
        """Fail a room this prefill will not serve (tombstone for a late decode)."""
        state = self._room(room)
        state.owned = True
        self.close_room(room, reason)

    async def wait_transfer_info(self, state: _Room, room: int) -> TransferInfo:
        start = time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(state.info), self.bootstrap_timeout_s)
        except TimeoutError:
            raise BootstrapError(
                f"Request {room} timed out after {time.monotonic() - start:.1f}s in KVPoll.Bootstrapping"
            ) from None

    async def transfer(self, info: TransferInfo, src_offset: int, nbytes: int, fail: bool = False) -> float:
        """Write the slot into decode's pool; returns seconds spent in Mooncake. ``fail``:
        Mooncake's write returns -1 (the fault transfer_fail)."""
        assert self.engine is not None
        if info.dst_len != nbytes:
            raise TransferError(
                f"KV size mismatch for room {info.room}: decode reserved {info.dst_len} bytes, prefill has {nbytes}"
            )
        kv_args = self.decode_kv_args[info.session_id]
        dst_base = int(kv_args["dst_kv_ptr"]) + info.dst_offset
        size = KVPool.slot_size(nbytes)
        step = (size // self.shards + _ALIGN - 1) // _ALIGN * _ALIGN or size
        srcs, dsts, lens = [], [], []
        off = 0
        while off < size:
            n = min(step, size - off)
            srcs.append(self.pool.base + src_offset + off)
            dsts.append(dst_base + off)
            lens.append(n)
            off += n
        if self.failed_sessions.refuses(info.session_id):
            raise TransferError(dead_session_reason(info.session_id))
        t0 = time.perf_counter()
        rc = -1 if fail else await self.engine.write(info.session_id, srcs, dsts, lens)
        dt = time.perf_counter() - t0
        if rc != 0:
            # one failure blacklists the session (SGLang: "if the session fails once, mark it as failed")
            self.failed_sessions.mark_failed(info.session_id)
            raise TransferError(f"Mooncake write to {info.session_id} returned {rc}"
                                + (" (injected fault transfer_fail)" if fail else ""))
        return dt

    async def notify(self, info: TransferInfo, ok: bool, reason: str | None = None, sim_s: float | None = None) -> None:
        """Tell decode how the hand-off ended; with the prefill's simulated seconds for the
        request (queue, passes, transfer), which decode's TTFT adds to its own."""
        url = f"http://{info.endpoint}:{info.dst_port}/kv/status"
        payload = {"room": info.room, "status": "success" if ok else "failed", "reason": reason, "sim_s": sim_s}
        try:
            status = await _post(self.session, url, payload)
            if status != 200:
                log.warning("KV status for room %d: decode answered %d", info.room, status)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("KV status for room %d not delivered to %s: %s", info.room, url, exc)


# --- decode side ------------------------------------------------------------------------
@dataclasses.dataclass
class PrefillInfo:
    parallel: dict[str, Any]
    ranks: dict[tuple[int, int, int, int], tuple[str, int]]
    failures: int = 0


class DecodeKV:
    def __init__(self, *, host: str, pool_bytes: int, session: aiohttp.ClientSession,
                 bootstrap_timeout_s: float, heartbeat_interval_s: float, heartbeat_max_failure: int,
                 page_size: int, kv_cache_dtype: str) -> None:
        self.host = host
        self.session = session
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_max_failure = heartbeat_max_failure
        self.page_size = page_size
        self.kv_cache_dtype = kv_cache_dtype
        self.pool = KVPool(pool_bytes)
        self.engine: MooncakeEngine | None = None
        self.prefills: dict[str, PrefillInfo] = {}
        self.registered_endpoints: set[tuple[str, int]] = set()
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self.control = _ControlServer(host, [web.post("/kv/status", self._h_status)])

    async def start(self) -> None:
        self.engine = await asyncio.to_thread(MooncakeEngine, self.host)
        self.engine.register(self.pool)
        await self.control.start()
        self._heartbeat = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        log.info("decode KV: mooncake session %s, pool %d MiB, control endpoint %s:%d",
                 self.engine.session_id, self.pool.size >> 20, self.host, self.control.port)

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.control.close()

    async def _h_status(self, request: web.Request) -> web.Response:
        data = await request.json()
        fut = self.waiting.get(int(data["room"]))
        if fut is None or fut.done():
            return web.Response(text="unknown room", status=404)
        fut.set_result(data)
        return web.Response(text="OK")

    async def _get(self, url: str) -> tuple[int, Any]:
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                return 200, await resp.json(content_type=None)
            return resp.status, await resp.text()

    async def _ensure_prefill_info(self, addr: str, deadline: float) -> PrefillInfo:
        """Parallel info of the prefill at `addr`, retried until the bootstrap timeout."""
        last = ""
        while True:
            info = self.prefills.get(addr)
            if info is not None:
                return info
            try:
                status, body = await self._get(
                    f"http://{addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
                )
                if status == 200:
                    if body.get("page_size") is not None and int(body["page_size"]) != self.page_size:
                        raise BootstrapError(
                            f"Page size mismatch: prefill server has page_size={body['page_size']}, "
                            f"but decode server has page_size={self.page_size}."
                        )
                    info = PrefillInfo(parallel=body, ranks={})
                    self.prefills[addr] = info
                    log.info("prefill parallel info for %s: %s", addr, body)
                    return info
                last = f"{status}, {body}"
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
                last = str(exc) or type(exc).__name__
            if time.monotonic() >= deadline:
                raise BootstrapError(f"Failed to get prefill server info from {addr}: {last}")
            await asyncio.sleep(0.5)

    async def bootstrap(self, host: str | None, port: int | None, room: int) -> tuple[str, int]:
        """The prefill rank endpoint that serves `room`, with this decode registered there."""
        if not host or port is None:
            raise BootstrapError(f"Request {room} has no bootstrap address (bootstrap_host={host!r}, bootstrap_port={port!r})")
        addr = f"{host}:{port}"
        info = await self._ensure_prefill_info(addr, time.monotonic() + self.bootstrap_timeout_s)
        par = info.parallel
        dp_rank = room % int(par["dp_size"]) if par.get("follow_bootstrap_room", True) else 0
        key = (dp_rank, 0, 0, 0)
        endpoint = info.ranks.get(key)
        if endpoint is None:
            try:
                status, body = await self._get(
                    f"http://{addr}/route?prefill_dp_rank={dp_rank}&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                status, body = 0, str(exc)
            if status != 200:
                self.prefills.pop(addr, None)
                raise BootstrapError(
                    f"Could not fetch bootstrap info for: prefill_dp_rank: {dp_rank} prefill_cp_rank: 0 "
                    f"target_tp_rank: 0 and target_pp_rank 0 ({status} {body})"
                )
            endpoint = (str(body["rank_ip"]), int(body["rank_port"]))
            info.ranks[key] = endpoint
        if endpoint not in self.registered_endpoints:
            assert self.engine is not None
            payload = {
                "room": "None", "endpoint": self.host, "dst_port": self.control.port,
                "mooncake_session_id": self.engine.session_id, "dst_kv_ptr": self.pool.base,
                "dst_kv_len": self.pool.size, "dst_tp_rank": 0, "dst_attn_tp_size": 1,
            }
            try:
                status = await _post(self.session, f"http://{endpoint[0]}:{endpoint[1]}/kv/register", payload)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                status = 0
                log.warning("KV args registration at %s:%d failed: %s", *endpoint, exc)
            if status != 200:
                info.ranks.pop(key, None)
                raise BootstrapError(f"Failed to register KV args with prefill rank {endpoint[0]}:{endpoint[1]}")
            self.registered_endpoints.add(endpoint)
        return endpoint

    def expect(self, room: int) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[room] = fut
        return fut

    def forget(self, room: int) -> None:
        self.waiting.pop(room, None)

    async def send_transfer_info(self, endpoint: tuple[str, int], room: int, offset: int, nbytes: int) -> None:
        assert self.engine is not None
        payload = {
            "room": room, "endpoint": self.host, "dst_port": self.control.port,
            "mooncake_session_id": self.engine.session_id, "dst_offset": offset, "dst_len": nbytes,
            "required_dst_info_num": 1,
        }
        try:
            status = await _post(self.session, f"http://{endpoint[0]}:{endpoint[1]}/kv/transfer_info", payload)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise BootstrapError(f"Failed to send transfer info for room {room} to {endpoint[0]}:{endpoint[1]}: {exc}") from None
        if status == 400:
            # The prefill lost our registration (restarted): register again next time.
            self.registered_endpoints.discard(endpoint)
        if status != 200:
            raise BootstrapError(f"Prefill rank {endpoint[0]}:{endpoint[1]} refused transfer info for room {room} ({status})")

    async def abort(self, endpoint: tuple[str, int] | None, room: int) -> None:
        if endpoint is None:
            return
        try:
            await _post(self.session, f"http://{endpoint[0]}:{endpoint[1]}/kv/abort", {"room": room}, timeout=2.0)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.debug("abort notification for room %d not delivered: %s", room, exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            for addr, info in list(self.prefills.items()):
                try:
                    async with self.session.get(f"http://{addr}/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        ok = resp.status == 200
                except (TimeoutError, aiohttp.ClientError, OSError):
                    ok = False
                if ok:
                    info.failures = 0
                    continue
                info.failures += 1
                if info.failures >= self.heartbeat_max_failure:
                    log.error("prefill bootstrap %s failed %d heartbeats: marking it dead", addr, info.failures)
                    self.prefills.pop(addr, None)
                    for endpoint in info.ranks.values():
                        self.registered_endpoints.discard(endpoint)
