"""The stand-in's capacity model: layout (TP, attention DP, batch limits) changes throughput
the way SGLang's schedulers do (scheduler.py)."""

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
    advances a virtual clock, so passes and steps are checked exactly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self._real = asyncio.sleep

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 9))
        for _ in range(5):  # let the callers of the previous pass resume at its end time
            await self._real(0)
        self.now += seconds


def _run(coro_factory, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(sched_mod.asyncio, "sleep", clock.sleep)
    result = asyncio.run(coro_factory(clock))
    return clock, result


def test_prefill_passes_are_chunked_and_scale_with_rank_gpus(monkeypatch):
    model = RankModel(prefill_s_per_token=0.001 / 4, chunk_tokens=100, step_base_s=0.01,
                      step_per_request_s=0.0, max_running=8)

    async def main(clock):
        s = RankScheduler(model, lambda: 1.0)
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
        s = RankScheduler(model, lambda: 1.0)
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


def test_chunk_and_batch_limit_follow_sglang_server_args():
    base = {"model_path": "m", "tp_size": 4}
    assert server_settings_from_dict(base).chunked_prefill_size == 8192
    dp = server_settings_from_dict({**base, "attn_dp_size": 4, "max_running_requests": 64})
    assert dp.chunked_prefill_size == 2048 and dp.rank_gpus == 1 and dp.num_ranks == 4
    assert server_settings_from_dict({**base, "chunked_prefill_size": -1}).chunked_prefill_size is None
    with pytest.raises(ConfigError, match="chunked_prefill_size=0"):
        server_settings_from_dict({**base, "chunked_prefill_size": 0})


# --- processes: a stand-in pair, load from threads --------------------------------------------
def _burst(node, n: int, prompt: str, max_new_tokens: int, sample_after_s: float | None = None):
    """n concurrent PD requests; returns (seconds until all finished, decode gauges sampled
    mid-way as (running, queued))."""
    errors: list[str] = []

    def send() -> None:
        p, d = node.pd_request("/generate", {"text": prompt, "sampling_params": {
            "max_new_tokens": max_new_tokens, "ignore_eos": True}})
        if d.status != 200 or d.json()["meta_info"]["completion_tokens"] != max_new_tokens:
            errors.append(f"{p.status} {d.status} {d.text[:200]}")

    threads = [threading.Thread(target=send) for _ in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    gauges = None
    if sample_after_s is not None:
        time.sleep(sample_after_s)
        fams = node.metrics("decode")
        gauges = (metric_sum(fams, "sglang:num_running_reqs"), metric_sum(fams, "sglang:num_queue_reqs"))
    for t in threads:
        t.join()
    assert not errors, errors
    return time.monotonic() - t0, gauges


DECODE_ENV = {"PDNODE_SIM_DECODE_MS_PER_TOKEN": "25", "PDNODE_SIM_DECODE_MS_PER_REQUEST": "0",
              "PDNODE_SIM_MAX_RUNNING_PER_RANK": "4"}


@pytest.mark.integration
def test_attention_dp_4_runs_4x_the_decode_batch_of_attention_dp_1(tmp_path):
    results = {}
    for adp in (1, 4):
        with standin_node(tmp_path / f"adp{adp}", router=False, decode_env=DECODE_ENV,
                          decode_args={"attn_dp_size": adp, "ep_size": adp}) as node:
            node.pd_request("/generate", {"text": "warm up", "sampling_params": {"max_new_tokens": 2}})
            # 16 requests x 80 tokens; the gauges are sampled while the first wave decodes
            results[adp] = _burst(node, 16, "hello there", 80, sample_after_s=0.5)
    (t1, (run1, queue1)), (t4, (run4, queue4)) = results[1], results[4]
    assert (run1, queue1) == (4, 12)  # one rank of 4: the rest queue
    assert (run4, queue4) == (16, 0)  # four ranks of 4: all run
    # 4 waves of 79 steps vs one wave: about 4x the time (less the fixed start of each request)
    assert 3.0 < t1 / t4 < 5.0, (t1, t4)


@pytest.mark.integration
def test_prefill_tp4_takes_half_the_time_of_tp2(tmp_path):
    prompt = " ".join(["word"] * 400)  # 400 tokens (one per started 4 letters, per word)
    elapsed = {}
    for tp in (2, 4):
        with standin_node(tmp_path / f"tp{tp}", router=False, prefill_args={"tp_size": tp},
                          prefill_env={"PDNODE_SIM_PREFILL_MS_PER_TOKEN": "2"}) as node:
            node.pd_request("/generate", {"text": "warm up", "sampling_params": {"max_new_tokens": 1}})
            samples = []
            for _ in range(3):
                t0 = time.monotonic()
                p, d = node.pd_request("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 1}})
                assert p.status == d.status == 200
                samples.append(time.monotonic() - t0)
            elapsed[tp] = min(samples)
    # 400 tokens x 2 ms / tp: 0.4 s at TP 2, 0.2 s at TP 4 (plus the same small overhead)
    assert elapsed[2] >= 0.4 and elapsed[4] >= 0.2
    assert 1.7 < elapsed[2] / elapsed[4] < 2.1, elapsed
