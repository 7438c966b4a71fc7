"""kv.transport: the transport each engine's Mooncake installed, as it logged it when it
started, against the plan's KV path (docs/field-failures.md row 8: with no usable RDMA
device Mooncake falls back to TCP without an error, vllm#51518; a MC_* variable set on the
host outside pdnode does the same to the NVLink path). Read on the node, from the journal
of each engine unit's current start (pdnode.core.plan.kv_path.MOONCAKE_TRANSPORT_LINES).
A transport other than the plan's FAILs, naming the instance and its line; an engine whose
journal holds no such line is a WARN (a log rotated away, a Mooncake that logs otherwise):
nothing to compare is not a failure."""

from __future__ import annotations

import subprocess

from ..core.plan.kv_path import MOONCAKE_PATHS, logged_transport
from . import services as svc
from .base import FAIL, NA, PASS, WARN, Ctx, Result

JOURNAL_TIMEOUT_S = 15.0


def check_kv_transport(ctx: Ctx) -> Result:
    path = ctx.run.expect.kv_path
    if path not in MOONCAKE_PATHS:
        return Result(NA, f"not applicable: the plan's KV path is {path or 'unknown'}, not one of Mooncake's")
    if not ctx.t.on_node:
        return Result(NA, "not applicable (remote): the engines' journal is read on the node itself",
                      "run on the node (ansible-playbook playbooks/verify.yml does)")
    engines = [i for i in ctx.t.instances if i.unit]
    if not engines or not svc.systemctl_available():
        return Result(NA, "not applicable: no engine unit of this host, or no systemctl here")
    lines, wrong, silent = [], [], []
    for inst in engines:
        text = _journal(inst.unit)
        if text is None:
            return Result(NA, "not applicable: the engines' journal cannot be read here (systemd is not PID 1, or "
                              "this user may not read it)")
        got = logged_transport(text)
        if got is None:
            silent.append(inst.id)
        elif got[0] != path:
            wrong.append(inst.id)
            lines.append(f"{inst.id} logged {got[1]!r}: {got[0]}, not the plan's {path}")
        else:
            lines.append(f"{inst.id}: {got[0]} ({got[1]!r})")
    if silent:
        lines.append(f"{', '.join(silent)} logged no Mooncake transport line since it started")
    evidence = "; ".join(lines)
    if wrong:
        return Result(FAIL, evidence,
                      f"{', '.join(wrong)} moves the KV cache over another transport than the plan's {path}: "
                      "'no HCA detected' means Mooncake found no usable RDMA device (rdma role, "
                      "/sys/class/infiniband, the NIC map); a forced transport means an MC_* variable set outside "
                      f"pdnode (systemctl show -p Environment {_unit(ctx, wrong[0])}; drop-ins); docs/kv-path.md")
    if silent:
        return Result(WARN, evidence, "journalctl -u UNIT -b | grep -i transport: an engine restarted long ago may "
                                      "have had its start rotated out of the journal")
    return Result(PASS, evidence)


def _unit(ctx: Ctx, iid: str) -> str:
    return ctx.t.instance(iid).unit or iid


def _journal(unit: str) -> str | None:
    """The unit's journal since its current start (its invocation), or None when systemd or
    the journal cannot answer."""
    try:
        invocation = subprocess.run(["systemctl", "show", "-p", "InvocationID", "--value", unit],
                                    capture_output=True, text=True, timeout=JOURNAL_TIMEOUT_S, check=False)
        if invocation.returncode != 0 or not invocation.stdout.strip():
            return None
        journal = subprocess.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation.stdout.strip()}", "-o", "cat",
                                  "--no-pager", "-q"], capture_output=True, text=True, timeout=JOURNAL_TIMEOUT_S,
                                 check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return journal.stdout if journal.returncode == 0 else None
