"""Sum a BSD process-accounting file (acct v3, what `accton FILE` writes on Linux) by
command: the CPU every exited process used, for scripts/measure-ci-cpu. Then by tree:
each stage of scripts/test (a `timeout` process: the stage runner starts every stage
under one) and each container (a `containerd-shim`: its processes' parent), with the CPU
of everything below it.

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


def parents(recs: list[dict]) -> list[dict | None]:
    """Each record's parent record, or None. A run of some 60,000 processes reuses pids,
    so the parent is the process with the ppid that was alive when the child started (the
    latest such start; btime counts whole seconds, hence the second of slack)."""
    by_pid: dict[int, list[dict]] = collections.defaultdict(list)
    for r in recs:
        by_pid[r["pid"]].append(r)
    out = []
    for r in recs:
        alive = [p for p in by_pid.get(r["ppid"], ())
                 if p is not r and p["btime"] - 1 <= r["btime"] <= p["btime"] + p["etime_s"] + 1]
        out.append(max(alive, key=lambda p: p["btime"]) if alive else None)
    return out


def trees(recs: list[dict], is_root) -> list[tuple[dict, float, collections.Counter]]:
    """(root, CPU seconds of every process below it, that CPU by command) for each record
    is_root accepts, in the order they started."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for i, parent in enumerate(parents(recs)):
        if parent is not None:
            children[id(parent)].append(i)
    out = []
    for root in sorted((r for r in recs if is_root(r)), key=lambda r: r["btime"]):
        cpu: collections.Counter[str] = collections.Counter()
        stack = list(children[id(root)])
        while stack:
            r = recs[stack.pop()]
            cpu[r["comm"]] += r["cpu_s"]
            stack.extend(children[id(r)])
        out.append((root, sum(cpu.values()), cpu))
    return out


def print_trees(title: str, rows: list[tuple[dict, float, collections.Counter]], start: int) -> None:
    print(title)
    for root, total, cpu in rows:
        top = ", ".join(f"{c} {s:.0f}" for c, s in cpu.most_common(4))
        print(f"  from +{root['btime'] - start:5d} s for {root['etime_s']:6.0f} s: {total:7.1f} CPU-s ({top})")


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
    stages = trees(recs, lambda r: r["comm"] == "timeout" and r["etime_s"] > 10)
    if stages:
        start = stages[0][0]["btime"]  # times from the first stage's start
        print_trees("stages (timeout processes of over 10 s; see the CI log for which is which):", stages, start)
        print_trees("containers (containerd-shim; their processes' CPU, over 1 CPU-s):",
                    [t for t in trees(recs, lambda r: r["comm"] == "containerd-shim") if t[1] > 1], start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
