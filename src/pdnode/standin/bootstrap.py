"""The prefill bootstrap server and the rank registration client.

A port of SGLang 0.5.23's CommonKVBootstrapServer (disaggregation/common/conn.py): aiohttp
on the prefill's --host and disaggregation_bootstrap_port, no authentication.
    GET  /health            "OK"
    PUT  /route             a prefill rank registers (attn tp/cp/dp rank, rank_ip, rank_port, ...)
    GET  /route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1
                            200 the prefill's parallel info once every rank registered,
                            503 "Prefill server not fully registered yet (N workers registered)."
    GET  /route?prefill_dp_rank=D&prefill_cp_rank=C&target_tp_rank=T&target_pp_rank=P
                            200 {"rank_ip", "rank_port"} of that rank
    POST /register_dp_rank, /query_dp_ranks   room -> prefill DP rank bookkeeping
The `bootstrap_down` fault closes the listener (clients get connection refused) and
reopens it when the fault is cleared; registrations survive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

log = logging.getLogger("standin.bootstrap")


class BootstrapServer:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._lock = asyncio.Lock()
        self.attn_tp_size: int | None = None
        self.attn_cp_size: int | None = None
        self.dp_size: int | None = None
        self.pp_size: int | None = None
        self.page_size: int | None = None
        self.kv_cache_dtype: str | None = None
        self.follow_bootstrap_room: bool | None = None
        self.prefill_http_port: int | None = None
        self.decode_allocation_policy = "early"
        self.table: dict[int, dict[int, dict[int, dict[int, dict[str, Any]]]]] = {}
        self.room_to_dp_rank: dict[int, dict[str, float]] = {}
        self.registered = 0

    # --- lifecycle -------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/route", self._handle_route)
        app.router.add_post("/register_dp_rank", self._handle_register_dp_rank)
        app.router.add_post("/query_dp_ranks", self._handle_query_dp_ranks)
        app.router.add_get("/health", self._handle_health)
        return app

    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self._make_app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, host=self.host, port=self.port).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("bootstrap server listening on %s:%d", self.host, self.port)

    async def stop_listening(self, level: int = logging.WARNING) -> None:
        """Close the listener and every open connection, as if the process had died."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            log.log(level, "bootstrap server stopped listening on %s:%d", self.host, self.port)

    async def close(self) -> None:
        await self.stop_listening(logging.INFO)

    async def set_down(self, down: bool) -> None:
        if down:
            await self.stop_listening()
        else:
            await self.start()

    # --- state -----------------------------------------------------------------------
    def is_ready(self) -> bool:
        if None in (self.attn_tp_size, self.attn_cp_size, self.pp_size, self.dp_size):
            return False
        expected = self.dp_size * self.attn_cp_size * self.attn_tp_size * self.pp_size
        return self.registered >= expected

    # --- handlers --------------------------------------------------------------------
    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", status=200)

    async def _handle_route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            return await self._handle_route_put(request)
        if request.method == "GET":
            return await self._handle_route_get(request)
        return web.Response(text="Method not allowed", status=405, content_type="application/json")

    async def _handle_route_put(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            attn_tp_size = int(data["attn_tp_size"])
            attn_tp_rank = int(data["attn_tp_rank"])
            attn_cp_size = int(data["attn_cp_size"])
            attn_cp_rank = int(data["attn_cp_rank"])
            attn_dp_size = int(data["attn_dp_size"])
            attn_dp_rank = int(data["attn_dp_rank"])
            pp_size = int(data["pp_size"])
            pp_rank = int(data["pp_rank"])
            system_dp_size = int(data["system_dp_size"])
            system_dp_rank = int(data["system_dp_rank"])
            rank_ip = str(data["rank_ip"])
            rank_port = int(data["rank_port"])
            page_size = data.get("page_size")
            kv_cache_dtype = data.get("kv_cache_dtype")
        except (KeyError, TypeError, ValueError) as exc:
            return web.Response(text=f"Bad registration: {exc!r}", status=400)
        policy = data.get("decode_allocation_policy", "early")
        if self.registered and self.decode_allocation_policy != policy:
            return web.Response(text="Inconsistent prefill allocation policies", status=400)
        self.decode_allocation_policy = policy
        if self.attn_tp_size is None:
            self.attn_tp_size = attn_tp_size
        if self.attn_cp_size is None:
            self.attn_cp_size = attn_cp_size
        if self.dp_size is None:
            self.dp_size = attn_dp_size if system_dp_size == 1 else system_dp_size
        if self.pp_size is None:
            self.pp_size = pp_size
        if self.page_size is None and page_size is not None:
            self.page_size = int(page_size)
        if self.kv_cache_dtype is None and kv_cache_dtype is not None:
            self.kv_cache_dtype = str(kv_cache_dtype)
        if self.prefill_http_port is None and data.get("prefill_http_port") is not None:
            self.prefill_http_port = int(data["prefill_http_port"])
        if self.follow_bootstrap_room is None:
            method = data.get("load_balance_method", "follow_bootstrap_room")
            self.follow_bootstrap_room = method == "follow_bootstrap_room"
        dp_group = attn_dp_rank if system_dp_size == 1 else system_dp_rank
        async with self._lock:
            self.table.setdefault(dp_group, {}).setdefault(attn_cp_rank, {}).setdefault(attn_tp_rank, {})[
                pp_rank
            ] = {"rank_ip": rank_ip, "rank_port": rank_port}
            self.registered += 1
        expected = (self.dp_size or 1) * (self.attn_cp_size or 1) * (self.attn_tp_size or 1) * (self.pp_size or 1)
        log.info(
            "register prefill bootstrap: DP%d CP%d TP%d PP%d rank %s:%d (%d/%d registered)",
            dp_group, attn_cp_rank, attn_tp_rank, pp_rank, rank_ip, rank_port, self.registered, expected,
        )
        return web.Response(text="OK", status=200)

    async def _handle_route_get(self, request: web.Request) -> web.Response:
        q = request.query
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(q.get(k) for k in keys):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        try:
            dp, cp, tp, pp = (int(q[k]) for k in keys)
        except ValueError:
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        if not self.is_ready():
            return web.Response(
                text=f"Prefill server not fully registered yet ({self.registered} workers registered).",
                status=503,
            )
        if (dp, cp, tp, pp) == (-1, -1, -1, -1):
            payload = {
                "attn_tp_size": self.attn_tp_size,
                "attn_cp_size": self.attn_cp_size,
                "dp_size": self.dp_size,
                "pp_size": self.pp_size,
                "page_size": self.page_size,
                "kv_cache_dtype": self.kv_cache_dtype,
                "follow_bootstrap_room": True if self.follow_bootstrap_room is None else self.follow_bootstrap_room,
                "enable_dsa_cache_layer_split": False,
                "decode_allocation_policy": self.decode_allocation_policy,
                "enable_kv_cache_sharding": False,
                "prefill_http_port": self.prefill_http_port,
                "target_tp_rank": None,
                "target_tp_ranks": None,
                "target_cp_ranks": None,
                "target_pp_ranks": None,
                "required_dst_info_num": None,
                "required_prefill_response_num": None,
            }
            return web.json_response(payload)
        async with self._lock:
            try:
                info = self.table[dp][cp][tp][pp]
            except KeyError:
                return web.Response(
                    text=f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}",
                    status=404,
                )
        return web.json_response(dict(info))

    async def _handle_register_dp_rank(self, request: web.Request) -> web.Response:
        data = await request.json()
        async with self._lock:
            self.room_to_dp_rank[int(data["bootstrap_room"])] = {
                "dp_rank": int(data["dp_rank"]),
                "timestamp": time.time(),
            }
        return web.Response(text="OK", status=200)

    async def _handle_query_dp_ranks(self, request: web.Request) -> web.Response:
        data = await request.json()
        result = {}
        async with self._lock:
            for room in data.get("bootstrap_rooms", []):
                entry = self.room_to_dp_rank.get(int(room))
                if entry is not None:
                    result[str(int(room))] = entry["dp_rank"]
        return web.json_response(result)


async def register_ranks(
    session: aiohttp.ClientSession, bootstrap_url: str, payloads: list[dict[str, Any]]
) -> bool:
    """PUT every rank's registration, with SGLang's retry schedule (5 tries, backoff)."""
    ok = True
    for payload in payloads:
        for attempt in range(5):
            try:
                async with session.put(f"{bootstrap_url}/route", json=payload, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        break
                    log.warning("prefill register attempt %d/5 failed: status %d", attempt + 1, resp.status)
            except (TimeoutError, aiohttp.ClientError) as exc:
                log.warning("prefill register attempt %d/5 failed: %s", attempt + 1, exc)
            if attempt < 4:
                await asyncio.sleep(min(1.0 * 2**attempt, 30.0))
        else:
            log.error("prefill instance failed to register to bootstrap server after 5 retries")
            ok = False
    return ok
