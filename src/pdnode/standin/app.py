"""Start-up, readiness and shutdown of one stand-in process.

Order, as in SGLang: the HTTP server answers at once (/health 503 while "loading"); a
prefill starts its bootstrap server at once too (/route 503 "not fully registered");
then the "model load": Mooncake initialisation, KV pool registration, PDNODE_SIM_STARTUP_S;
then the prefill ranks register with PUT /route; then /health turns 200. SIGTERM or
SIGINT: /health turns 503, listeners close, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import aiohttp
from aiohttp import web

from . import VERSION
from .bootstrap import BootstrapServer, register_ranks
from .config import Settings
from .engine import Engine
from .faults import Faults
from .http_api import HttpApi
from .kv import DecodeKV, PrefillKV
from .metrics import Metrics, scheduler_labels
from .rendezvous import Leader, RendezvousError, run_follower
from .sessions import FailedSessions

log = logging.getLogger("standin")


def rank_registrations(settings: Settings, rank_ip: str, rank_port: int) -> list[dict[str, Any]]:
    """One PUT /route payload per prefill rank (SGLang's register_to_bootstrap)."""
    s = settings.server
    out = []
    for system_dp_rank in range(s.dp_size):
        for attn_dp_rank in range(s.attn_dp_size):
            for attn_tp_rank in range(s.attn_tp_size):
                for pp_rank in range(s.pp_size):
                    out.append({
                        "attn_tp_size": s.attn_tp_size, "attn_tp_rank": attn_tp_rank,
                        "attn_cp_size": 1, "attn_cp_rank": 0,
                        "attn_dp_size": s.attn_dp_size, "attn_dp_rank": attn_dp_rank,
                        "pp_size": s.pp_size, "pp_rank": pp_rank,
                        "system_dp_size": s.dp_size, "system_dp_rank": system_dp_rank,
                        "rank_ip": rank_ip, "rank_port": rank_port,
                        "page_size": s.page_size, "kv_cache_dtype": s.kv_cache_dtype,
                        "kv_layout": None, "dsv41_spec_layout": None,
                        "load_balance_method": s.load_balance_method,
                        "enable_dsa_cache_layer_split": False, "enable_kv_cache_sharding": False,
                        "prefill_http_port": s.port, "decode_allocation_policy": "early",
                    })
    return out


async def serve(settings: Settings, launch_command: str) -> int:
    s, sim = settings.server, settings.sim
    if s.nnodes > 1 and s.node_rank >= 1:
        assert s.dist_init is not None  # config.py requires it with nnodes > 1
        return await run_follower(s.host, s.port, *s.dist_init, s.nnodes, s.node_rank,
                                  s.dist_timeout_s, sim.startup_s, s.enable_metrics)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    faults = Faults(sim.faults, sim.slow_factor)
    metrics = Metrics(
        model_name=s.served_model_name, engine_type=s.engine_type,
        ranks=scheduler_labels(model_name=s.served_model_name, engine_type=s.engine_type, tp_size=s.tp_size,
                               attn_dp_size=s.attn_dp_size, dp_size=s.dp_size, ep_size=s.ep_size),
    )
    session = aiohttp.ClientSession()
    pool_bytes = sim.kv_pool_mb * 1024 * 1024
    prefill_kv = decode_kv = None
    if s.mode == "prefill":
        blacklist = FailedSessions(probe=sim.failed_session_probe, interval_s=sim.failed_session_probe_interval_s,
                                   max_interval_s=sim.failed_session_probe_max_interval_s,
                                   idle_timeout_s=sim.failed_session_idle_timeout_s,
                                   on_recovered=metrics.failed_session_recoveries.inc)
        prefill_kv = PrefillKV(host=s.advertise_host, pool_bytes=pool_bytes, session=session,
                               bootstrap_timeout_s=sim.bootstrap_timeout_s, shards=s.attn_tp_size,
                               failed_sessions=blacklist)
    elif s.mode == "decode":
        decode_kv = DecodeKV(host=s.advertise_host, pool_bytes=pool_bytes, session=session,
                             bootstrap_timeout_s=sim.bootstrap_timeout_s,
                             heartbeat_interval_s=sim.heartbeat_interval_s,
                             heartbeat_max_failure=sim.heartbeat_max_failure,
                             page_size=s.page_size, kv_cache_dtype=s.kv_cache_dtype)
    engine = Engine(settings, faults, metrics, prefill_kv=prefill_kv, decode_kv=decode_kv)
    api = HttpApi(settings, engine, faults, metrics, launch_command)
    runner = web.AppRunner(api.app, access_log=None, handler_cancellation=True, shutdown_timeout=5.0)
    await runner.setup()
    bootstrap: BootstrapServer | None = None
    leader = Leader(*s.dist_init, s.nnodes) if s.dist_init and s.nnodes > 1 else None
    tasks: list[asyncio.Task[Any]] = []
    try:
        try:
            await web.TCPSite(runner, host=s.host, port=s.port).start()
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", s.host, s.port, exc.strerror or exc)
            return 1
        log.info("stand-in %s (%s) HTTP on %s:%d, model %s served as %s, tp %d, dp %d, attn_dp %d, ep %d",
                 VERSION, s.mode, s.host, s.port, s.model_path, s.served_model_name,
                 s.tp_size, s.dp_size, s.attn_dp_size, s.ep_size)
        if s.mode != "null" and settings.sim.mooncake_start_error(s.transfer_backend):
            log.error("%s", settings.sim.mooncake_start_error(s.transfer_backend))
            return 1
        if s.mode != "null":
            log.info("KV hand-off over %s (the environment's choice for Mooncake); the bytes cross loopback TCP, "
                     "the time reported is simulated at %g GB/s", settings.sim.kv_path(s.transfer_backend),
                     settings.sim.kv_speed_gb_s(s.transfer_backend))
            # what Mooncake's CUDA build logs at this point, for the verify's kv.transport
            log.info("%s", settings.sim.mooncake_line(s.transfer_backend))
        if s.mode == "prefill":
            bootstrap = BootstrapServer(s.host, s.bootstrap_port)
            try:
                await bootstrap.start()
            except OSError as exc:
                log.error("cannot listen on bootstrap port %s:%d: %s", s.host, s.bootstrap_port, exc.strerror or exc)
                return 1

            async def on_faults(f: Faults) -> None:
                try:
                    await bootstrap.set_down(f.active("bootstrap_down"))
                except OSError as exc:
                    log.error("bootstrap server cannot listen again: %s", exc)

            faults.add_listener(on_faults)
            if faults.active("bootstrap_down"):
                await bootstrap.set_down(True)
        if leader is not None:
            try:
                await leader.start()
            except OSError as exc:
                log.error("cannot listen on dist_init_addr %s:%d: %s", leader.host, leader.port, exc.strerror or exc)
                return 1
        if faults.as_list():
            log.warning("faults active from the start: %s", ", ".join(faults.as_list()))

        # "model loading"
        load = asyncio.ensure_future(_load(settings, prefill_kv, decode_kv, session, leader))
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({load, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if load not in done:
            load.cancel()
            log.info("stopped while loading")
            return 0
        stopped.cancel()
        if not load.result():
            return 1
        engine.status = "Up"
        tasks.append(loop.create_task(_throughput(engine)))
        log.info("The server is fired up and ready to roll!")
        waits = {asyncio.ensure_future(stop.wait())}
        if leader is not None:
            waits.add(asyncio.ensure_future(leader.lost.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if leader is not None and leader.lost.is_set():
            return 1
        log.info("shutting down (signal received)")
        engine.status = "Exiting"
        return 0
    finally:
        engine.status = "Exiting"
        for task in tasks:
            task.cancel()
        await runner.cleanup()
        if bootstrap is not None:
            await bootstrap.close()
        if leader is not None:
            await leader.close()
        for kv in (prefill_kv, decode_kv):
            if kv is not None:
                await kv.close()
        await session.close()
        log.info("stopped")


async def _load(settings: Settings, prefill_kv: PrefillKV | None, decode_kv: DecodeKV | None,
                session: aiohttp.ClientSession, leader: Leader | None = None) -> bool:
    s, sim = settings.server, settings.sim
    if leader is not None:
        # SGLang's schedulers cannot finish loading before the whole NCCL world exists.
        try:
            await leader.wait_all(s.dist_timeout_s)
        except RendezvousError as exc:
            log.error("%s", exc)
            return False
    try:
        for kv in (prefill_kv, decode_kv):
            if kv is not None:
                await kv.start()
    except Exception as exc:  # Mooncake or the control listener
        log.error("KV transfer setup failed: %s", exc)
        return False
    if sim.startup_s:
        log.info("loading the model (simulated, %.1f s)", sim.startup_s)
        await asyncio.sleep(sim.startup_s)
    if prefill_kv is not None:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(s.host, s.host)
        url = f"http://{host}:{s.bootstrap_port}" if ":" not in host else f"http://[{host}]:{s.bootstrap_port}"
        payloads = rank_registrations(settings, s.advertise_host, prefill_kv.control.port)
        if not await register_ranks(session, url, payloads):
            log.error("prefill ranks are not registered: decode cannot bootstrap against this prefill")
    return True


async def _throughput(engine: Engine, interval_s: float = 2.0) -> None:
    while True:
        await asyncio.sleep(interval_s)
        engine.sample_throughput(interval_s)
