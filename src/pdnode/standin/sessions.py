"""A prefill's blacklist of decode sessions, as SGLang 0.5.23's Mooncake backend keeps it
(srt/disaggregation/mooncake/conn.py; field failure 4, sglang#13054).

One failed transfer to a decode's Mooncake session puts the session on the list, and every
later request for that decode fails at once ("Decode instance could be dead, remote
mooncake session ... is not alive") while the decode itself stays healthy. What lifts it is
the failed-session probe (SGLANG_ENABLE_FAILED_SESSION_PROBE, on by default): every listed
session is probed (Mooncake's send_probe: a TCP connect to the peer's handshake port) at
SGLANG_FAILED_SESSION_PROBE_INTERVAL_S, doubling while it fails up to
SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S; a probe that answers lifts it and counts
sglang:failed_session_recoveries_total; a session no request asked for in
SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S is dropped (a restarted decode comes back under a new
session id). With the probe off, the list is for good: the failure as the issue reported it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

log = logging.getLogger("standin.sessions")


@dataclasses.dataclass
class _Probe:
    last_requested: float
    next_probe_at: float
    interval: float


def dead_session_reason(session_id: str) -> str:
    return f"Decode instance could be dead, remote mooncake session {session_id} is not alive"


async def tcp_probe(session_id: str, timeout_s: float = 2.0) -> bool:
    """Mooncake's send_probe, in the stand-in: the session id is "host:rpc_port"."""
    host, _, port = session_id.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    return True


class FailedSessions:
    def __init__(self, *, probe: bool, interval_s: float, max_interval_s: float, idle_timeout_s: float,
                 on_recovered: Callable[[], None], prober: Callable[[str], object] = tcp_probe) -> None:
        self.probe_enabled = probe
        self.interval_s = interval_s
        self.max_interval_s = max_interval_s
        self.idle_timeout_s = idle_timeout_s
        self._on_recovered = on_recovered
        self._prober = prober
        self._failed: set[str] = set()
        self._probes: dict[str, _Probe] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.probe_enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def mark_failed(self, session_id: str) -> None:
        if session_id not in self._failed:
            log.error("Session %s failed.", session_id)
        self._failed.add(session_id)

    def refuses(self, session_id: str) -> bool:
        """Whether a request for this session fails at once (and notes that it was asked)."""
        if session_id not in self._failed:
            return False
        probe = self._probes.get(session_id)
        if probe is not None:
            probe.last_requested = time.monotonic()
        return True

    async def _loop(self) -> None:
        log.info("Starting failed-session probe loop (interval=%.1fs)", self.interval_s)
        while True:
            await asyncio.sleep(self.interval_s)
            await self.probe_once()

    async def probe_once(self) -> None:
        """One pass: SGLang's _run_one_probe_pass."""
        now = time.monotonic()
        due = []
        for session_id in list(self._failed):
            probe = self._probes.setdefault(session_id, _Probe(now, now, self.interval_s))
            if now - probe.last_requested >= self.idle_timeout_s:
                self._lift(session_id)
                log.info("Dropped blacklisted session %s: no request for %.0fs", session_id, now - probe.last_requested)
            elif now >= probe.next_probe_at:
                due.append(session_id)
        for session_id in due:
            if await self._prober(session_id):
                self._lift(session_id)
                log.info("Session %s recovered via probe; un-blacklisted", session_id)
                self._on_recovered()
            else:
                probe = self._probes[session_id]
                probe.interval = min(2 * probe.interval, self.max_interval_s)
                probe.next_probe_at = time.monotonic() + probe.interval

    def _lift(self, session_id: str) -> None:
        self._failed.discard(session_id)
        self._probes.pop(session_id, None)
