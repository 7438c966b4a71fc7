"""Sum a BSD process-accounting file (acct v3, what `accton FILE` writes on Linux) by
command: the CPU every exited process used, for scripts/measure-ci-cpu.

    python3 scripts/lib/acct_summary.py FILE [TOP]

A command that forked without exec (Ansible's per-task workers) is listed with a `*`.
Standard library only."""

from __future__ import annotations

import collections
import struct
import sys

RECORD = struct.Struct("<BBHIIIIIIf8H16s")  # struct acct_v3, 64 bytes
AFORK = 0x01  # forked, never exec'd
AHZ = 100  # comp_t counts ticks of 1/AHZ s


def comp_t(value: int) -> int:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(data: bytes) -> list[dict]:
    out = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        (flag, version, _tty, _exit, uid, _gid, pid, ppid, btime, etime, utime, stime,
         *_rest, comm) = RECORD.unpack_from(data, offset)
        if version != 3:
            raise ValueError(f"record at byte {offset}: acct version {version}, expected 3 (Linux's acct_v3)")
        name = comm.split(b"\0")[0].decode(errors="replace") + ("*" if flag & AFORK else "")
        out.append({"comm": name, "pid": pid, "ppid": ppid, "uid": uid, "btime": btime,
                    "etime_s": etime / AHZ, "cpu_s": (comp_t(utime) + comp_t(stime)) / AHZ})
    return out


def by_command(recs: list[dict]) -> list[tuple[str, int, float]]:
    """(command, processes, CPU seconds), most CPU first."""
    count: collections.Counter[str] = collections.Counter()
    cpu: collections.defaultdict[str, float] = collections.defaultdict(float)
    for r in recs:
        count[r["comm"]] += 1
        cpu[r["comm"]] += r["cpu_s"]
    return sorted(((c, count[c], cpu[c]) for c in count), key=lambda row: -row[2])


def main(argv: list[str]) -> int:
    if not 2 <= len(argv) <= 3:
        print("usage: acct_summary.py FILE [TOP]", file=sys.stderr)
        return 2
    with open(argv[1], "rb") as handle:
        recs = records(handle.read())
    rows = by_command(recs)
    print(f"{sum(r[2] for r in rows):.1f} CPU-s in {len(recs)} exited processes")
    for comm, n, cpu in rows[: int(argv[2]) if len(argv) == 3 else 20]:
        print(f"{cpu:9.1f} CPU-s {n:7d}  {comm}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
