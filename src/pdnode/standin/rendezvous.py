"""One instance over several hosts (SGLang --nnodes / --node-rank / --dist-init-addr).

Real SGLang 0.5.23 (docs/multi-host.md): node rank 0 hosts torch's TCPStore on
dist_init_addr and every rank joins it; no rank finishes loading before all have joined,
and a rank that dies takes the others with it (NCCL error, watchdog). Rank 0 serves the
API; a rank >= 1 serves only a dummy /health on its host:port once its schedulers are up,
ignores SIGTERM (it waits for rank 0's shutdown broadcast) and exits when rank 0 stops.

The stand-in keeps that contract with one TCP connection per non-zero rank to rank 0:
    joiner -> leader   "PDNODE-RDZV 1 <nnodes> <node_rank>\\n"
    leader -> joiner   "OK\\n" | "ERR <reason>\\n"
    both ways          "HB\\n" every HEARTBEAT_S; "SHUTDOWN\\n" from the leader on a clean stop
A connection that closes, or stays silent for SILENCE_S (a host cut off the network
sends no FIN), is a lost rank: the process exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

log = logging.getLogger("standin.rendezvous")

MAGIC = "PDNODE-RDZV 1"
HEARTBEAT_S = 1.0
SILENCE_S = 10.0
HELLO_TIMEOUT_S = 10.0
RETRY_S = 0.5
# torch's default process-group timeout (SGLang passes dist_timeout, None by default);
# the DP-attention port handshake waits as long (data_parallel_controller.py).
DEFAULT_TIMEOUT_S = 600.0


class RendezvousError(Exception):
    """The rendezvous failed or a joined rank was lost; the message is one line."""


def parse_dist_init_addr(text: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port); ValueError names what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError("must be HOST:PORT (e.g. 10.0.0.2:32000)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("an IPv6 address must be in brackets ([fd00::2]:32000)")
    if not host or any(c.isspace() for c in host):
        raise ValueError("must be HOST:PORT (e.g. 10.0.0.2:32000)")
    number = int(port)
    if not 1 <= number <= 65535:
        raise ValueError(f"port {number} is not in 1-65535")
    return host, number


async def _heartbeat(writer: asyncio.StreamWriter) -> None:
    while True:
        writer.write(b"HB\n")
        await writer.drain()
        await asyncio.sleep(HEARTBEAT_S)


async def _watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, who: str) -> str:
    """Until the peer says SHUTDOWN (-> "shutdown"); raises RendezvousError when it is lost."""
    beat = asyncio.ensure_future(_heartbeat(writer))
    try:
        while True:
            if beat.done():
                raise RendezvousError(f"{who}: connection lost ({beat.exception() or 'closed'})")
            try:
                line = await asyncio.wait_for(reader.readline(), SILENCE_S)
            except TimeoutError:
                raise RendezvousError(f"{who}: silent for {SILENCE_S:.0f} s") from None
            except OSError as exc:
                raise RendezvousError(f"{who}: connection lost ({exc})") from None
            if not line:
                raise RendezvousError(f"{who}: connection closed")
            if line == b"SHUTDOWN\n":
                return "shutdown"
    finally:
        beat.cancel()


class Leader:
    """Node rank 0: waits for ranks 1..nnodes-1 and watches them from then on."""

    def __init__(self, host: str, port: int, nnodes: int):
        self.host, self.port, self.nnodes = host, port, nnodes
        self.all_joined = asyncio.Event()
        self.lost = asyncio.Event()
        self.reason = ""
        self._joined: dict[int, asyncio.StreamWriter] = {}
        self._server: asyncio.base_events.Server | None = None
        self._closing = False

    async def start(self) -> None:
        """Listen on dist_init_addr (OSError when the port is taken)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        log.info("dist-init rendezvous on %s:%d, waiting for %d other node rank(s)",
                 self.host, self.port, self.nnodes - 1)
        if self.nnodes == 1:
            self.all_joined.set()

    def _lose(self, reason: str) -> None:
        if not self._closing and not self.lost.is_set():
            self.reason = reason
            log.error("%s: the instance cannot run without it (like an NCCL failure)", reason)
            self.lost.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        rank = None
        try:
            try:
                hello = (await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)).decode("ascii", "replace")
            except (TimeoutError, OSError):
                return
            rank, refusal = self._admit(hello)
            if refusal:
                log.warning("refused a rendezvous from %s: %s", peer, refusal)
                writer.write(f"ERR {refusal}\n".encode())
                await writer.drain()
                rank = None
                return
            self._joined[rank] = writer
            writer.write(b"OK\n")
            await writer.drain()
            log.info("node rank %d joined from %s (%d of %d)", rank, peer and peer[0],
                     len(self._joined) + 1, self.nnodes)
            if len(self._joined) == self.nnodes - 1:
                self.all_joined.set()
            await _watch(reader, writer, f"node rank {rank}")
            self._lose(f"node rank {rank} said SHUTDOWN")
        except RendezvousError as exc:
            self._lose(str(exc))
        except OSError as exc:
            if rank is not None:
                self._lose(f"node rank {rank}: connection lost ({exc})")
        finally:
            if rank is not None and not self._closing:
                self._lose(f"node rank {rank}: connection closed")
            writer.close()

    def _admit(self, hello: str) -> tuple[int | None, str]:
        parts = hello.strip().rsplit(" ", 2)
        if len(parts) != 3 or parts[0] != MAGIC or not (parts[1].isdigit() and parts[2].isdigit()):
            return None, "not a pdnode rendezvous greeting"
        nnodes, rank = int(parts[1]), int(parts[2])
        if nnodes != self.nnodes:
            return None, f"nnodes {nnodes} differs from rank 0's nnodes {self.nnodes}"
        if not 1 <= rank < self.nnodes:
            return None, f"node_rank {rank} is not in 1..{self.nnodes - 1}"
        if rank in self._joined:
            return None, f"node rank {rank} has already joined"
        return rank, ""

    async def wait_all(self, timeout_s: float) -> None:
        """Until every rank has joined; RendezvousError on timeout or a lost rank."""
        joined = asyncio.ensure_future(self.all_joined.wait())
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({joined, lost}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            joined.cancel()
            lost.cancel()
        if self.lost.is_set():
            raise RendezvousError(self.reason)
        if not self.all_joined.is_set():
            missing = sorted(set(range(1, self.nnodes)) - set(self._joined))
            raise RendezvousError(
                f"node rank(s) {', '.join(map(str, missing))} did not join {self.host}:{self.port} "
                f"within {timeout_s:.0f} s (dist_timeout)"
            )

    async def close(self) -> None:
        """Clean stop: tell every joined rank (SGLang broadcasts ShutdownReq), then close."""
        self._closing = True
        for writer in self._joined.values():
            with contextlib.suppress(OSError):
                writer.write(b"SHUTDOWN\n")
                await asyncio.wait_for(writer.drain(), 2.0)
            writer.close()
        if self._server is not None:
            self._server.close()


async def join(host: str, port: int, nnodes: int, node_rank: int, timeout_s: float
               ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Node rank >= 1: connect to rank 0, retrying until it listens or timeout_s passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), RETRY_S * 4)
            break
        except (TimeoutError, OSError) as exc:
            if loop.time() >= deadline:
                raise RendezvousError(
                    f"node rank 0 at {host}:{port} (dist_init_addr) not reachable within "
                    f"{timeout_s:.0f} s: {str(exc) or 'timed out'}"
                ) from None
            await asyncio.sleep(RETRY_S)
    writer.write(f"{MAGIC} {nnodes} {node_rank}\n".encode())
    try:
        await writer.drain()
        reply = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
    except (TimeoutError, OSError) as exc:
        writer.close()
        raise RendezvousError(f"no answer from node rank 0 at {host}:{port}: {str(exc) or 'timed out'}") from None
    if reply != b"OK\n":
        writer.close()
        text = reply.decode("ascii", "replace").strip().removeprefix("ERR ") or "connection closed"
        raise RendezvousError(f"node rank 0 at {host}:{port} refused node rank {node_rank}: {text}")
    return reader, writer


def _dummy_health_app(enable_metrics: bool) -> Any:
    """What SGLang's launch_dummy_health_check_server answers on a rank >= 1 (its /metrics
    exposes this node's scheduler processes; the stand-in has none here: an empty page)."""
    from aiohttp import web  # not at import: config.py imports this module, aiohttp-free

    async def ok(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="", content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    app = web.Application()
    for path in ("/health", "/health_generate", "/ping"):
        app.router.add_get(path, ok)
    if enable_metrics:
        app.router.add_get("/metrics", metrics)
    return app


async def run_follower(host: str, port: int, dist_host: str, dist_port: int, nnodes: int,
                       node_rank: int, timeout_s: float, startup_s: float, enable_metrics: bool) -> int:
    """A node rank >= 1 process: exit 0 when rank 0 shuts it down, 1 when rank 0 is lost."""
    from aiohttp import web

    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    loop.add_signal_handler(signal.SIGTERM, lambda: log.warning(
        "SIGTERM received on node_rank %d; waiting for node rank 0 to stop the instance", node_rank))
    runner = None
    writer = None
    try:
        try:
            reader, writer = await join(dist_host, dist_port, nnodes, node_rank, timeout_s)
        except RendezvousError as exc:
            log.error("%s", exc)
            return 1
        log.info("node rank %d of %d joined node rank 0 at %s:%d", node_rank, nnodes, dist_host, dist_port)
        watch = asyncio.ensure_future(_watch(reader, writer, "node rank 0"))
        if startup_s:
            await asyncio.wait({watch}, timeout=startup_s)
        if not watch.done():
            runner = web.AppRunner(_dummy_health_app(enable_metrics), access_log=None)
            await runner.setup()
            try:
                await web.TCPSite(runner, host=host, port=port).start()
            except OSError as exc:
                log.error("cannot listen on %s:%d: %s", host, port, exc.strerror or exc)
                watch.cancel()
                return 1
            log.info("node rank %d ready; dummy health check on %s:%d", node_rank, host, port)
        stopped = asyncio.ensure_future(interrupted.wait())
        await asyncio.wait({watch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not watch.done():
            watch.cancel()
            log.info("stopped (SIGINT)")
            return 0
        try:
            watch.result()
        except RendezvousError as exc:
            log.error("%s: exiting (like an NCCL failure)", exc)
            return 1
        log.info("node rank 0 stopped the instance")
        return 0
    finally:
        if writer is not None:
            writer.close()
        if runner is not None:
            await runner.cleanup()
