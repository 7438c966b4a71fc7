"""The stand-in's Mooncake write (pdnode.standin.kv.MooncakeEngine.write): each slice
submitted with transfer_submit_write, then polled with transfer_check_status between
asyncio sleeps, never SGLang's batch_transfer_sync_write, whose thread spins on the status
(on a 2-core test machine the spinning threads starved the engines: a prefill's /health
silent for a minute). Its outcome is the sync write's: 0 when every slice arrived, -1 when
a submit or a slice failed or Mooncake's deadline passed. The bytes themselves cross real
Mooncake in every stand-in node test (decode checks each request's stamped slot).

The engine below is a stand-in for Mooncake's binding with the calls the write makes; the
binding the stand-ins run must have them (the first test)."""

from __future__ import annotations

import asyncio
import time

from pdnode.standin import kv


class FakeBinding:
    """transfer_submit_write / transfer_check_status as Mooncake's binding answers them:
    a batch id (or -1 as an unsigned id), then 0 while running, 1 once done, -1 failed."""

    def __init__(self, polls_to_finish: int = 3, fail_slice: int | None = None, submit_fails: bool = False,
                 never_done: bool = False) -> None:
        self.polls_to_finish, self.fail_slice = polls_to_finish, fail_slice
        self.submit_fails, self.never_done = submit_fails, never_done
        self.submitted: list[tuple[str, int, int, int]] = []
        self.checks: dict[int, int] = {}

    def transfer_submit_write(self, session: str, src: int, dst: int, n: int) -> int:
        if self.submit_fails:
            return 2**64 - 1
        self.submitted.append((session, src, dst, n))
        return 1000 + len(self.submitted)

    def transfer_check_status(self, batch: int) -> int:
        self.checks[batch] = self.checks.get(batch, 0) + 1
        if self.fail_slice is not None and batch == 1001 + self.fail_slice:
            return -1
        if self.never_done or self.checks[batch] < self.polls_to_finish:
            return 0
        return 1

    def batch_transfer_sync_write(self, *args: object) -> int:  # the spinning call: never used
        raise AssertionError("batch_transfer_sync_write spins a thread on a shared CPU")


def engine(binding: FakeBinding) -> kv.MooncakeEngine:
    eng = kv.MooncakeEngine.__new__(kv.MooncakeEngine)  # no real TransferEngine behind it
    eng._te = binding
    eng.session_id = "127.0.0.1:1"
    return eng


def write(binding: FakeBinding, slices: int = 4) -> int:
    srcs, dsts, lens = [100 * i for i in range(slices)], [900 + 100 * i for i in range(slices)], [100] * slices
    return asyncio.run(engine(binding).write("127.0.0.1:2", srcs, dsts, lens))


def test_the_binding_the_stand_ins_run_has_the_polled_calls():
    from mooncake.engine import TransferEngine

    for name in ("transfer_submit_write", "transfer_check_status"):
        assert callable(getattr(TransferEngine, name, None)), name


def test_every_slice_is_submitted_then_polled_until_done():
    binding = FakeBinding(polls_to_finish=3)
    assert write(binding) == 0
    assert binding.submitted == [("127.0.0.1:2", 100 * i, 900 + 100 * i, 100) for i in range(4)]
    assert binding.checks == {1001: 3, 1002: 3, 1003: 3, 1004: 3}  # each until its first 1, then no more


def test_a_failed_slice_or_submit_fails_the_write():
    assert write(FakeBinding(fail_slice=2)) == -1
    binding = FakeBinding(submit_fails=True)
    assert write(binding) == -1 and binding.checks == {}


def test_mooncakes_deadline_for_a_sync_write(monkeypatch):
    monkeypatch.delenv("MC_TRANSFER_TIMEOUT", raising=False)
    assert kv.transfer_timeout_s() == 30.0
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")  # Mooncake raises it to its floor of 5 s
    assert kv.transfer_timeout_s() == 5.0
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "45")
    assert kv.transfer_timeout_s() == 45.0


def test_a_write_that_never_ends_fails_at_the_deadline(monkeypatch):
    monkeypatch.setattr(kv, "transfer_timeout_s", lambda: 0.2)
    started = time.monotonic()
    assert write(FakeBinding(never_done=True)) == -1
    assert time.monotonic() - started >= 0.2  # not before the deadline
