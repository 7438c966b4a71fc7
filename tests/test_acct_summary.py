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


def record(comm: bytes, utime: int, stime: int, flag: int = 0, version: int = 3) -> bytes:
    # struct acct_v3: flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float),
    # utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
    return struct.pack("<BBHIIIIIIf8H16s", flag, version, 0, 0, 0, 0, 7, 1, 1_800_000_000, 250.0,
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
