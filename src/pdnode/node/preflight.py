"""The preflight's port judgement on the host (stdlib only): which of the plan's ports a
process other than the plan's own units holds, read from /proc now (the deploy's start
step, before it starts anything):

    python -m pdnode.node.preflight ports --own-unit UNIT ... NAME=PORT ...

The judgement (``_ports``, its ``Problem`` lines) and the /proc/net/tcp and socket-owner
parsers are the controller's too: pdnode.core.host.preflight judges the probes' facts with
the same ``_ports``, and pdnode.core.host.facts reads the probes' text with the same
parsers, so the host and the controller cannot disagree about a port.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any

TCP_STATE_LISTEN = "0A"


@dataclass(frozen=True)
class Problem:
    severity: str  # error | warning
    check: str     # e.g. gpu.count, port.30000
    value: Any
    rule: str
    fix: str

    @property
    def line(self) -> str:
        return f"{self.severity.upper()} {self.check}={_show(self.value)}: {self.rule}. Fix: {self.fix}."

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line}


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


class _J:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def error(self, check: str, value: Any, rule: str, fix: str) -> None:
        self.problems.append(Problem("error", check, value, rule, fix))

    def warn(self, check: str, value: Any, rule: str, fix: str) -> None:
        self.problems.append(Problem("warning", check, value, rule, fix))


def _ports(j: _J, facts: dict[str, Any], exp: dict[str, Any]) -> None:
    prefix = exp["own_unit_prefix"]
    own_units = set(exp.get("own_units") or [])

    def ours(unit: str) -> bool:
        # The plan's unit names when known (exact), else any unit of our prefix.
        return unit in own_units if own_units else bool(prefix) and unit.startswith(f"{prefix}-")

    commands = facts.get("commands") or {}
    if isinstance(commands, str):  # the raw cmdlines probe of the preflight role
        commands = parse_cmdlines(commands)
    by_port: dict[int, list[dict[str, Any]]] = {}
    for s in facts.get("listeners") or []:
        by_port.setdefault(int(s["port"]), []).append(s)
    for name, port in sorted((exp["ports"] or {}).items(), key=lambda kv: kv[1]):
        for s in by_port.get(int(port), []):
            unit = s.get("unit")
            if unit and ours(unit):
                continue  # our own service holds it: a re-deploy
            uid_units = s.get("uid_units") or []
            if (own_units or prefix) and not unit and uid_units and all(ours(u) for u in uid_units):
                continue  # owner unreadable, but its uid runs only our services
            command = s.get("command") or commands.get(s.get("pid"))
            who = (f"pid {s['pid']}" + (f" {command!r}" if command else "") + (f", unit {unit}" if unit else "")
                   ) if s.get("pid") else "owner unknown" + (f", uid {s['uid']}" if s.get("uid") is not None else "")
            j.error(f"port.{port}", f"{s['address']}:{port}", f"the port {name} needs is already in use ({who})",
                    f"stop that process or choose another port for {name}")
            break


# --- /proc/net/tcp, sockets and their owners ----------------------------------------

def _hex_ip(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # IPv6: four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    addr = ipaddress.IPv6Address(words)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)


def parse_proc_net_tcp(text: str) -> list[dict[str, Any]]:
    """/proc/net/tcp or /proc/net/tcp6 -> sockets ``{address, port, state, uid, inode}``."""
    out = []
    for line in (text or "").splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or ":" not in parts[1]:
            continue
        addr, port = parts[1].rsplit(":", 1)
        try:
            out.append({
                "address": _hex_ip(addr), "port": int(port, 16), "state": parts[3].upper(),
                "uid": int(parts[7]), "inode": int(parts[9]),
            })
        except ValueError:
            continue
    return out


def listening_sockets(*tables: str) -> list[dict[str, Any]]:
    """The LISTEN sockets of one or more /proc/net/tcp* texts."""
    out = []
    for text in tables:
        out += [s for s in parse_proc_net_tcp(text) if s["state"] == TCP_STATE_LISTEN]
    return out


def parse_socket_owners(fd_links: str, cgroups: str = "") -> dict[int, dict[str, Any]]:
    """Map socket inodes to the process and systemd unit holding them.

    ``fd_links``: lines ``/proc/<pid>/fd socket:[<inode>]`` (``find /proc/[0-9]*/fd
    -lname 'socket:*' -printf '%h %l\\n'``); ``cgroups``: lines
    ``/proc/<pid>/cgroup:<line>`` (``grep -H`` over the cgroup files). The unit is the
    last ``*.service``/``*.scope`` component of the process's cgroup path.
    """
    units = units_by_pid(cgroups)
    owners: dict[int, dict[str, Any]] = {}
    for line in (fd_links or "").splitlines():
        m = re.match(r"^/proc/(\d+)/fd\s+socket:\[(\d+)\]$", line.strip())
        if not m:
            continue
        pid, inode = int(m.group(1)), int(m.group(2))
        owners.setdefault(inode, {"pid": pid, "unit": units.get(pid)})
    return owners


def units_by_pid(cgroups: str) -> dict[int, str | None]:
    """pid -> the last ``*.service``/``*.scope`` of its cgroup path (lines as in
    parse_socket_owners), None for a process outside any unit."""
    units: dict[int, str | None] = {}
    for line in (cgroups or "").splitlines():
        m = re.match(r"^/proc/(\d+)/cgroup:(?:0::|\d+:name=systemd:)(\S*)", line.strip())
        if not m:
            continue
        parts = [p for p in m.group(2).split("/") if p.endswith((".service", ".scope"))]
        if parts or int(m.group(1)) not in units:  # hybrid hosts list v1 and v2 paths
            units[int(m.group(1))] = parts[-1] if parts else units.get(int(m.group(1)))
    return units


def units_per_uid(uid_lines: str, cgroups: str = "") -> dict[int, list[str]]:
    """uid -> the units its processes run in (``grep -H '^Uid:' /proc/*/status`` lines and
    the cgroup lines); a process outside any unit counts as "?"."""
    unit_of = units_by_pid(cgroups)
    out: dict[int, set[str]] = {}
    for line in (uid_lines or "").splitlines():
        m = re.match(r"^/proc/(\d+)/status:Uid:\s+(\d+)", line.strip())
        if m:
            out.setdefault(int(m.group(2)), set()).add(unit_of.get(int(m.group(1))) or "?")
    return {uid: sorted(units) for uid, units in out.items()}


# --- on the host: the same port judgement, from /proc now (the deploy's start step) ---------

def parse_cmdlines(text: str) -> dict[int, str]:
    """``grep -a -H '' /proc/[0-9]*/cmdline`` lines -> {pid: command line, NULs as spaces}."""
    out: dict[int, str] = {}
    for line in (text or "").splitlines():
        m = re.match(r"^/proc/(\d+)/cmdline:(.*)$", line)
        if m and m.group(2):
            out[int(m.group(1))] = _short(m.group(2).replace("\0", " "))
    return out


def _short(command: str, limit: int = 120) -> str:
    command = " ".join(command.split())
    return command if len(command) <= limit else command[:limit - 3] + "..."


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""  # a process that ended meanwhile, or a file we may not read


def live_listeners(proc: str = "/proc") -> list[dict[str, Any]]:
    """The host's TCP listeners with owner pid, systemd unit and command line, read from
    /proc the way the preflight's probes read them (run as root to see every owner)."""
    fd_lines, cgroup_lines, uid_lines = [], [], []
    pids = [d for d in os.listdir(proc) if d.isdigit()]
    for pid in pids:
        cgroup_lines += [f"/proc/{pid}/cgroup:{line}" for line in _read(f"{proc}/{pid}/cgroup").splitlines()]
        uid_lines += [f"/proc/{pid}/status:{line}" for line in _read(f"{proc}/{pid}/status").splitlines()
                      if line.startswith("Uid:")]
        try:
            # Unreadable for another user's process without CAP_SYS_PTRACE (containers):
            # then the socket's uid and the units that uid runs tell whose it is.
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:"):
                fd_lines.append(f"/proc/{pid}/fd {link}")
    owners = parse_socket_owners("\n".join(fd_lines), "\n".join(cgroup_lines))
    uid_units = units_per_uid("\n".join(uid_lines), "\n".join(cgroup_lines))
    out = []
    for s in listening_sockets(_read(f"{proc}/net/tcp"), _read(f"{proc}/net/tcp6")):
        owner = owners.get(s["inode"], {})
        pid = owner.get("pid")
        command = _short(_read(f"{proc}/{pid}/cmdline").replace("\0", " ")) if pid else None
        out.append({"address": s["address"], "port": s["port"], "pid": pid, "unit": owner.get("unit"),
                    "command": command or None, "uid": s["uid"], "uid_units": uid_units.get(s["uid"], [])})
    return out


def port_problems(listeners: list[dict[str, Any]], ports: dict[str, int], own_units: list[str]) -> list[Problem]:
    j = _J()
    _ports(j, {"listeners": listeners}, {"ports": ports, "own_units": own_units, "own_unit_prefix": None})
    return j.problems


def main(argv: list[str] | None = None) -> int:
    """python -m pdnode.node.preflight ports --own-unit UNIT ... NAME=PORT ...

    One line per port of the plan that a process other than our units holds; exit 1
    when there is one, 0 when every port is free or ours."""
    import argparse

    ap = argparse.ArgumentParser(prog="pdnode.preflight")
    ap.add_argument("what", choices=["ports"])
    ap.add_argument("--own-unit", action="append", default=[], help="a unit of ours (may hold its ports)")
    ap.add_argument("ports", nargs="+", metavar="NAME=PORT")
    args = ap.parse_args(argv)
    try:
        ports = {name: int(port) for name, port in (p.rsplit("=", 1) for p in args.ports)}
    except ValueError:
        ap.error("ports are NAME=PORT")
    problems = port_problems(live_listeners(), ports, args.own_unit)
    for p in problems:
        print(p.line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
