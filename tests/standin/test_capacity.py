"""The stand-in's capacity model: layout (TP, attention DP, batch limits) changes throughput
the way SGLang's schedulers do (scheduler.py).

The scheduler alone runs on a virtual clock (exact durations). The processes are checked
by what the stand-in itself reports, which no CPU load can change: the passes each rank
simulated (GET /sim/ranks, in simulated seconds) and the batch gauges read while a `slow`
fault holds the batch still; wall-clock time is only ever a lower bound (a simulated pass
cannot end early)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pdnode.standin import scheduler as sched_mod
from pdnode.standin.config import ConfigError, server_settings_from_dict
from pdnode.standin.scheduler import RankModel, RankScheduler

from .node import metric_sum, standin_node


# --- the scheduler alone: a recorded clock instead of real sleeps --------------------------
class _Clock:
    """Replaces asyncio.sleep in the scheduler: records each forward's duration and
    advances a virtual clock, so passes and steps are checked exactly. `late` is added to
    every sleep: a process that wakes up late (a busy machine)."""

    def __init__(self, late: float = 0.0) -> None:
        self.now = 0.0
        self.late = late
        self.sleeps: list[float] = []
        self._real = asyncio.sleep

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 9))
        for _ in range(5):  # let the callers of the previous pass resume at its end time
            await self._real(0)
        self.now += seconds + self.late


def _run(coro_factory, monkeypatch, late: float = 0.0):
    clock = _Clock(late)
    monkeypatch.setattr(sched_mod.asyncio, "sleep", clock.sleep)
    result = asyncio.run(coro_factory(clock))
    return clock, result


def test_prefill_passes_are_chunked_and_scale_with_rank_gpus(monkeypatch):
    model = RankModel(prefill_s_per_token=0.001 / 4, chunk_tokens=100, step_base_s=0.01,
                      step_per_request_s=0.0, max_running=8)

    async def main(clock):
        s = RankScheduler(model, lambda: 1.0, clock.time)
        done: dict[str, float] = {}

        async def one(name, tokens):
            await s.prefill(tokens)
            done[name] = clock.now

        await asyncio.gather(one("a", 150), one("b", 150))
        return done

    clock, done = _run(main, monkeypatch)
    # 300 tokens in passes of at most 100: a gets 100, then a's last 50 + b's first 50, then b's 100
    assert clock.sleeps == [0.025, 0.025, 0.025]
    assert done == {"a": pytest.approx(0.05), "b": pytest.approx(0.075)}


def test_decode_step_grows_with_the_batch_and_the_limit_queues(monkeypatch):
    model = RankModel(prefill_s_per_token=0.0, chunk_tokens=None, step_base_s=0.010,
                      step_per_request_s=0.002, max_running=2)

    async def main(clock):
        s = RankScheduler(model, lambda: 1.0, clock.time)
        joined: list[float] = []

        async def one():
            slot = await s.join(3)
            joined.append(clock.now)
            for _ in range(3):
                await slot.tokens.get()
            s.leave(slot)

        await asyncio.gather(one(), one(), one())
        return joined

    clock, joined = _run(main, monkeypatch)
    # two run (steps of 10 + 2 ms), the third waits in the queue until they finish, then runs alone
    assert clock.sleeps == [0.012, 0.012, 0.012, 0.010, 0.010, 0.010]
    assert joined == [0.0, 0.0, pytest.approx(0.036)]


def test_late_wake_ups_do_not_slow_the_rank_down(monkeypatch):
    """Every wake-up 4 ms late (CPU contention): the next step waits that much less, so the
    steps stay on the rank's own timeline and only the last one is late."""
    model = RankModel(prefill_s_per_token=0.0, chunk_tokens=None, step_base_s=0.010,
                      step_per_request_s=0.0, max_running=8)

    async def main(clock):
        s = RankScheduler(model, lambda: 1.0, clock.time)
        slot = await s.join(5)
        for _ in range(5):
            await slot.tokens.get()
        s.leave(slot)
        return clock.now

    clock, end = _run(main, monkeypatch, late=0.004)
    assert clock.sleeps == [0.010, 0.006, 0.006, 0.006, 0.006]
    assert end == pytest.approx(5 * 0.010 + 0.004)  # without the timeline: 5 x 0.014


def test_chunk_and_batch_limit_follow_sglang_server_args():
    base = {"model_path": "m", "tp_size": 4}
    assert server_settings_from_dict(base).chunked_prefill_size == 8192
    dp = server_settings_from_dict({**base, "attn_dp_size": 4, "max_running_requests": 64})
    assert dp.chunked_prefill_size == 2048 and dp.rank_gpus == 1 and dp.num_ranks == 4
    assert server_settings_from_dict({**base, "chunked_prefill_size": -1}).chunked_prefill_size is None
    with pytest.raises(ConfigError, match="chunked_prefill_size=0"):
        server_settings_from_dict({**base, "chunked_prefill_size": 0})


# --- processes: a stand-in pair, load from threads --------------------------------------------
def _ranks(node, role: str) -> list[dict]:
    resp = node.get(node.url(role) + "/sim/ranks")
    assert resp.status == 200, resp.text
    return resp.json()["ranks"]


def _held_burst(node, n: int, prompt: str, max_new_tokens: int) -> tuple[float, float]:
    """n concurrent PD requests while a `slow` fault holds the decode steps (1 s each): once
    every request has reached the decode's batch or its queue and two more steps have begun
    on every rank (requests join at a step's start), the gauges are read, the fault is
    lifted and the burst runs to its end. Returns the gauges (running, queued)."""
    errors: list[str] = []

    def send() -> None:
        p, d = node.pd_request("/generate", {"text": prompt, "sampling_params": {
            "max_new_tokens": max_new_tokens, "ignore_eos": True}}, timeout=600)
        if d.status != 200 or d.json()["meta_info"]["completion_tokens"] != max_new_tokens:
            errors.append(f"{p.status} {d.status} {d.text[:200]}")

    node.set_faults("decode", ["slow:40"])  # 25 ms steps x 40: a wave of 79 steps lasts 79 s
    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60  # seconds on a quiet machine; the held wave lasts 79 s
        steps: list[int] | None = None
        while not errors:
            fams = node.metrics("decode")
            gauges = (metric_sum(fams, "sglang:num_running_reqs"), metric_sum(fams, "sglang:num_queue_reqs"))
            now = [r["decode_steps"] for r in _ranks(node, "decode")]
            if steps is None and sum(gauges) >= n:
                steps = now  # all arrived: the next step's start admits what fits
            elif steps is not None and all(b >= a + 2 for a, b in zip(steps, now, strict=True)):
                break
            assert time.monotonic() < deadline, f"{gauges}: not all of {n} requests in the decode batch ({now})"
            time.sleep(0.1)
    finally:
        node.set_faults("decode", [])
        for t in threads:
            t.join()
    assert not errors, errors
    return gauges


DECODE_ENV = {"PDNODE_SIM_DECODE_MS_PER_TOKEN": "25", "PDNODE_SIM_DECODE_MS_PER_REQUEST": "0",
              "PDNODE_SIM_MAX_RUNNING_PER_RANK": "4"}


@pytest.mark.integration
def test_attention_dp_4_runs_4x_the_decode_batch_of_attention_dp_1(tmp_path):
    gauges, ranks = {}, {}
    for adp in (1, 4):
        with standin_node(tmp_path / f"adp{adp}", router=False, decode_env=DECODE_ENV,
                          decode_args={"attn_dp_size": adp, "ep_size": adp}) as node:
            node.pd_request("/generate", {"text": "warm up", "sampling_params": {"max_new_tokens": 2}})
            gauges[adp] = _held_burst(node, 16, "hello there", 80)  # 16 requests x 80 tokens
            ranks[adp] = _ranks(node, "decode")
    assert gauges[1] == (4, 12)  # one rank of 4: the rest queue
    assert gauges[4] == (16, 0)  # four ranks of 4: all run
    # what the ranks simulated: the same tokens (79 decode steps' worth per request, 1 for
    # the warm-up), batches never above the rank's limit of 4, spread over 1 or 4 ranks
    for adp in (1, 4):
        assert len(ranks[adp]) == adp
        assert sum(r["decode_tokens"] for r in ranks[adp]) == 16 * 79 + 1
        assert [r["max_batch"] for r in ranks[adp]] == [4] * adp
    # with attention DP 4 each rank made a quarter of the tokens (round robin: 4 requests
    # each, the warm-up on rank 0); one rank of 4 needs at least 4 waves of 79 steps
    assert sorted(r["decode_tokens"] for r in ranks[4]) == [4 * 79] * 3 + [4 * 79 + 1]
    assert ranks[1][0]["decode_steps"] >= 4 * 79


@pytest.mark.integration
def test_prefill_tp4_takes_half_the_time_of_tp2(tmp_path):
    prompt = " ".join(["word"] * 400)  # 400 tokens (one per started 4 letters, per word)
    passes, elapsed = {}, {}
    for tp in (2, 4):
        with standin_node(tmp_path / f"tp{tp}", router=False, prefill_args={"tp_size": tp},
                          prefill_env={"PDNODE_SIM_PREFILL_MS_PER_TOKEN": "2"}) as node:
            t0 = time.monotonic()
            p, d = node.pd_request("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 1}})
            elapsed[tp] = time.monotonic() - t0
            assert p.status == d.status == 200
            passes[tp] = [x for r in _ranks(node, "prefill") for x in r["recent"] if x["kind"] == "prefill"]
    # 400 tokens x 2 ms / tp, in one pass (the chunk is 8192): exactly what the rank simulated
    assert passes[2] == [{"kind": "prefill", "tokens": 400, "prompts": 1, "s": 0.4}]
    assert passes[4] == [{"kind": "prefill", "tokens": 400, "prompts": 1, "s": 0.2}]
    # and it really waited that long (load can only add to it)
    assert elapsed[2] >= 0.4 and elapsed[4] >= 0.2
