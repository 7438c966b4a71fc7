"""The forward-pass model of one scheduler rank: where layout turns into throughput.

SGLang runs one scheduler per DP rank (an attention-DP rank, or a DP replica without
attention DP); each scheduler runs one forward pass at a time over a batch. This module
models exactly that, so a stand-in's throughput depends on its ServerArgs the way a real
engine's does:

prefill  A forward pass takes the waiting prompts in arrival order, up to
         `chunk_tokens` tokens (SGLang's chunked_prefill_size, already divided by
         attn_dp_size; a longer prompt continues in the next pass), and lasts
         tokens x prefill_s_per_token, where prefill_s_per_token is the per-GPU cost
         divided by the rank's GPUs (linear tensor parallelism). A prompt is done when
         the pass that holds its last token ends.
decode   One step produces one token for every running request of the rank and lasts
         step_base_s + step_per_request_s x (batch - 1): a lone request sees
         step_base_s between its tokens. At most `max_running` requests run; the rest
         wait in the rank's queue (sglang:num_queue_reqs) and join at a step boundary.
         A request's first token (made by the prefill) is emitted when it joins.
unified  Both on one rank, prefill first (SGLang runs a waiting prefill batch before the
         next decode step), so prompts stall the running requests.

Time is asyncio sleep; every duration is multiplied by `factor()` (the `slow` fault).
Each rank keeps its own timeline, like a GPU that does not wait for the host: while work
is waiting, a pass starts where the previous one was due to end, not when this process
got round to it. A late wake-up (a busy machine's CPU contention) then shortens the next
wait instead of adding to every pass, so the simulated time a rank spends, and its pace
over many passes, do not depend on the machine's load; only when the process falls
behind by more than a pass do passes run back to back until it has caught up.

What the engine reports comes from that timeline, never from the CPU's clock: an arrival
is placed on it (inside the pass running when it came, or where an idle rank restarts
its timeline), and a prompt's end, a slot's admission and each decode token carry the
timeline time of the pass that made them. A request's queue wait, TTFT and ITL are
differences of those times, so a busy machine reports the same latencies as an idle one.
`stats` counts what each rank simulated (GET /sim/ranks).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Prompt:
    remaining: int
    arrival: float  # on the rank's timeline
    done: asyncio.Future[float]  # the timeline time its last pass ends
    started: float | None = None  # the timeline time its first pass starts


@dataclass(frozen=True)
class PrefillTiming:
    """A prompt's simulated seconds on its rank: waiting for its first pass, and from its
    arrival to the end of its last pass."""

    queued_s: float
    total_s: float


@dataclass
class DecodeSlot:
    """A request's place in a rank's decode batch; `tokens` counts steps it may emit."""

    remaining: int  # tokens still to produce by decode steps
    arrival: float  # on the rank's timeline
    joined: asyncio.Future[float]  # the timeline time it joins the batch (its first token)
    tokens: asyncio.Queue[float] = field(default_factory=asyncio.Queue)  # each step's end

    @property
    def admitted(self) -> float:
        return self.joined.result()


@dataclass(frozen=True)
class RankModel:
    prefill_s_per_token: float  # per prompt token on this rank (per-GPU cost / rank GPUs)
    chunk_tokens: int | None  # None: a whole batch of prompts in one pass
    step_base_s: float
    step_per_request_s: float
    max_running: int

    def step_s(self, batch: int) -> float:
        return self.step_base_s + self.step_per_request_s * max(batch - 1, 0)


# the last passes kept per rank for GET /sim/ranks
RECENT_PASSES = 64


@dataclass
class RankStats:
    """What a rank simulated: passes, their simulated seconds (after the `slow` factor),
    the largest decode batch. Counts, not wall-clock readings: a test can assert them
    exactly on any machine."""

    prefill_passes: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0
    decode_s: float = 0.0
    max_batch: int = 0
    recent: collections.deque[dict[str, Any]] = field(default_factory=lambda: collections.deque(maxlen=RECENT_PASSES))

    def as_dict(self) -> dict[str, Any]:
        return {"prefill_passes": self.prefill_passes, "prefill_tokens": self.prefill_tokens,
                "prefill_s": round(self.prefill_s, 9), "decode_steps": self.decode_steps,
                "decode_tokens": self.decode_tokens, "decode_s": round(self.decode_s, 9),
                "max_batch": self.max_batch, "recent": list(self.recent)}


class RankScheduler:
    def __init__(self, model: RankModel, factor: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self._factor = factor
        self._clock = clock
        self._due: float | None = None  # when the last pass is due to end while the rank stays busy
        self._pass_start = 0.0  # when the pass now running started (timeline time)
        self.stats = RankStats()
        self._prompts: collections.deque[_Prompt] = collections.deque()
        self._waiting: collections.deque[DecodeSlot] = collections.deque()
        self._running: list[DecodeSlot] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()

    def _arrival(self) -> float:
        """Where something arriving now falls on the timeline: inside the pass that is
        running (clamped to its end when this process runs late), or, on an idle rank,
        now, where the timeline restarts so that the first pass starts at the arrival and
        not when the rank's task next gets the CPU."""
        now = self._clock()
        if self._due is None:
            self._due = self._pass_start = now
            return now
        return min(max(now, self._pass_start), self._due)

    async def prefill(self, tokens: int) -> PrefillTiming:
        """Return when the prompt's last token has been through a forward pass."""
        prompt = _Prompt(max(tokens, 1), self._arrival(), asyncio.get_running_loop().create_future())
        self._prompts.append(prompt)
        self._kick()
        try:
            end = await asyncio.shield(prompt.done)
        except asyncio.CancelledError:
            if prompt in self._prompts:
                self._prompts.remove(prompt)
            raise
        started = prompt.started if prompt.started is not None else prompt.arrival
        return PrefillTiming(queued_s=started - prompt.arrival, total_s=end - prompt.arrival)

    async def join(self, tokens: int) -> DecodeSlot:
        """Wait for a running slot (queued while the batch is full); the slot then
        receives one item in `tokens` per step, `tokens` steps in all."""
        slot = DecodeSlot(remaining=max(tokens, 0), arrival=self._arrival(),
                          joined=asyncio.get_running_loop().create_future())
        self._waiting.append(slot)
        self._kick()
        try:
            await asyncio.shield(slot.joined)
        except asyncio.CancelledError:
            self.leave(slot)
            raise
        return slot

    def leave(self, slot: DecodeSlot) -> None:
        if slot in self._waiting:
            self._waiting.remove(slot)
        if slot in self._running:
            self._running.remove(slot)

    def _admit(self) -> None:
        """Slots join at a step boundary: the timeline time the last pass ended (or the
        arrival that restarted an idle rank's timeline)."""
        at = self._due if self._due is not None else self._clock()
        while self._waiting and len(self._running) < self.model.max_running:
            slot = self._waiting.popleft()
            if not slot.joined.done():
                slot.joined.set_result(max(at, slot.arrival))
            if slot.remaining > 0:
                self._running.append(slot)

    async def _loop(self) -> None:
        while True:
            self._admit()
            if self._prompts:
                await self._prefill_pass()
                continue
            if self._running:
                await self._decode_step()
                continue
            self._due = None  # idle: the next pass starts when work comes
            self._wake.clear()
            await self._wake.wait()

    async def _forward(self, seconds: float) -> tuple[float, float]:
        """One forward pass of `seconds` on the rank's own timeline (module docstring);
        returns the timeline times it starts and ends."""
        now = self._clock()
        start = now if self._due is None else min(self._due, now)
        end = self._due = start + seconds
        self._pass_start = start
        await asyncio.sleep(max(0.0, end - now))
        return start, end

    async def _prefill_pass(self) -> None:
        budget = self.model.chunk_tokens
        batch: list[tuple[_Prompt, int]] = []
        for prompt in self._prompts:
            take = prompt.remaining if budget is None else min(prompt.remaining, budget)
            if take <= 0:
                break
            batch.append((prompt, take))
            if budget is not None:
                budget -= take
        tokens = sum(take for _, take in batch)
        seconds = tokens * self.model.prefill_s_per_token * self._factor()
        st = self.stats
        st.prefill_passes += 1
        st.prefill_tokens += tokens
        st.prefill_s += seconds
        st.recent.append({"kind": "prefill", "tokens": tokens, "prompts": len(batch), "s": round(seconds, 9)})
        start, end = await self._forward(seconds)
        for prompt, take in batch:
            if prompt.started is None:
                prompt.started = max(start, prompt.arrival)
            prompt.remaining -= take
            if prompt.remaining <= 0:
                if prompt in self._prompts:
                    self._prompts.remove(prompt)
                if not prompt.done.done():
                    prompt.done.set_result(end)

    async def _decode_step(self) -> None:
        batch = list(self._running)
        seconds = self.model.step_s(len(batch)) * self._factor()
        st = self.stats
        st.decode_steps += 1
        st.decode_tokens += len(batch)
        st.decode_s += seconds
        st.max_batch = max(st.max_batch, len(batch))
        st.recent.append({"kind": "decode", "batch": len(batch), "s": round(seconds, 9)})
        _, end = await self._forward(seconds)
        for slot in batch:
            if slot not in self._running:
                continue  # left during the step (client gone)
            slot.remaining -= 1
            slot.tokens.put_nowait(end)
            if slot.remaining <= 0:
                self._running.remove(slot)
