"""scripts/lib/acct_summary.py (scripts/measure-ci-cpu's reader of Linux acct_v3 records):
records built byte for byte as the kernel writes them are read back with their CPU."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("acct_summary", Path(__file__).resolve().parents[1] / "scripts/lib/acct_summary.py")
acct_summary = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(acct_summary)


def record(comm: bytes, utime: int, stime: int, flag: int = 0, version: int = 3, pid: int = 7, ppid: int = 1,
           btime: int = 1_800_000_000, etime: float = 250.0) -> bytes:
    # struct acct_v3: flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float),
    # utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
    return struct.pack("<BBHIIIIIIf8H16s", flag, version, 0, 0, 0, 0, pid, ppid, btime, etime,
                       utime, stime, 0, 0, 0, 0, 0, 0, comm)


def test_comp_t_reads_mantissa_and_base_8_exponent():
    assert acct_summary.comp_t(150) == 150
    assert acct_summary.comp_t((1 << 13) | 100) == 800  # exponent 1: x8
    assert acct_summary.comp_t((2 << 13) | 3) == 192  # exponent 2: x64


def test_records_sum_by_command_and_mark_forks():
    data = (record(b"ansible-playboo", 100, 50) + record(b"ansible-playboo", 5, 5, flag=acct_summary.AFORK)
            + record(b"ansible-playboo", (1 << 13) | 10, 0, flag=acct_summary.AFORK) + record(b"python3.11", 17, 1))
    recs = acct_summary.records(data)
    assert [r["etime_s"] for r in recs] == [2.5] * 4
    assert acct_summary.by_command(recs) == [("ansible-playboo", 1, 1.5), ("ansible-playboo*", 2, 0.9),
                                             ("python3.11", 1, 0.18)]


def test_another_record_version_is_refused_not_misread():
    with pytest.raises(ValueError, match="acct version 2, expected 3"):
        acct_summary.records(record(b"x", 1, 1, version=2))


def test_trees_sum_each_roots_descendants_and_a_reused_pid_goes_to_the_process_alive_then():
    t = 1_800_000_000
    data = (record(b"timeout", 0, 0, pid=100, ppid=1, btime=t, etime=10_000.0)  # a stage, 100 s
            + record(b"pytest", 50, 0, pid=101, ppid=100, btime=t + 1, etime=9_000.0)
            + record(b"ansible-playboo", 30, 0, pid=102, ppid=101, btime=t + 5, etime=2_000.0)
            + record(b"ansible-playboo", 7, 0, pid=103, ppid=102, btime=t + 6, flag=acct_summary.AFORK)
            # pid 101 again, long after that pytest ended: its child is not the stage's
            + record(b"sleep", 0, 0, pid=101, ppid=1, btime=t + 500, etime=10_000.0)
            + record(b"python", 900, 0, pid=104, ppid=101, btime=t + 500))
    recs = acct_summary.records(data)
    assert [p and p["pid"] for p in acct_summary.parents(recs)] == [None, 100, 101, 102, None, 101]
    assert acct_summary.parents(recs)[5] is recs[4]  # the sleep, alive when it started
    [(root, total, cpu)] = acct_summary.trees(recs, lambda r: r["comm"] == "timeout")
    assert root is recs[0] and total == pytest.approx(0.87)
    assert cpu == {"pytest": 0.5, "ansible-playboo": 0.3, "ansible-playboo*": 0.07}
