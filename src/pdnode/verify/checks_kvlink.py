"""kv.link: the KV path's link, measured on the node with roles/mooncake's transfer check
(two processes, the prefill's GPU to the decode's, over the transport the plan chose:
docs/kv-path.md). One run per distinct GPU pair of the plan (plan.cluster.kv.checks); a
pair FAILs when the data does not arrive intact, when the check cannot run, or when the
link moves less than the verify's KV-speed floor (the path's, or the inventory's). Real
engines on a layout of one host only; elsewhere N/A, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .base import FAIL, NA, PASS, Ctx, Result

CHECK_BYTES = 64 << 20  # fits beside engines that hold most of the GPU's memory
CHECK_ITERATIONS = 3
CHECK_TIMEOUT_S = 120.0  # each side's start (CUDA, Mooncake) and the transfers


def check_kv_link(ctx: Ctx) -> Result:
    e = ctx.run.expect
    if not e.kv_link_checks:
        return Result(NA, f"not applicable: the plan's KV path is {e.kv_path or 'unknown'}, and it measures no link "
                          "here (the stand-in engine, or a layout spanning hosts, whose pairs one host's check "
                          "cannot reach)")
    if not ctx.t.on_node:
        return Result(NA, "not applicable (remote): the link is measured on the node itself",
                      "run on the node (ansible-playbook playbooks/verify.yml does)")
    tool = e.kv_check_tool or ""
    if not os.path.isfile(tool):
        return Result(FAIL, f"the Mooncake transfer check is not at {tool or '(no path in the plan)'}",
                      "run the provision phase (ansible-playbook site.yml --tags provision): roles/mooncake "
                      "installs it")
    floor = ctx.s.thresholds.get("kv_transfer_speed_min_gb_s")
    lines, failed = [], []
    for check in e.kv_link_checks:
        verdict, line = _measure(check, tool, floor, ctx.deadline.left())
        lines.append(line)
        if not verdict:
            failed.append(check["pair"])
    evidence = f"{e.kv_path}: " + "; ".join(lines)
    if failed:
        return Result(FAIL, evidence, f"{', '.join(failed)}: look at the link (nvidia-smi topo -m; "
                                      "docs/kv-path.md) and rerun the check by hand with the arguments above")
    return Result(PASS, evidence)


def _measure(check: dict, tool: str, floor: float | None, left_s: float) -> tuple[bool, str]:
    """(passed, one line of evidence) for one pair."""
    argv = [sys.executable, tool, "--bytes", str(CHECK_BYTES), "--iterations", str(CHECK_ITERATIONS),
            "--timeout", str(CHECK_TIMEOUT_S), *map(str, check["args"])]
    name = f"{check['pair']} (GPU {check['src_gpu']} -> {check['dst_gpu']})"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False,
                              timeout=max(1.0, min(left_s, 3 * CHECK_TIMEOUT_S)))
    except subprocess.TimeoutExpired:
        return False, f"{name}: the check did not finish in time"
    last = (done.stdout.strip().splitlines() or ["{}"])[-1]
    try:
        out = json.loads(last)
    except ValueError:
        out = {}
    if not isinstance(out, dict) or "intact" not in out:
        why = (out.get("error") if isinstance(out, dict) else None) or (done.stderr.strip().splitlines() or
                                                                         ["no output"])[-1]
        return False, f"{name}: the check could not run (exit {done.returncode}): {why[:300]}"
    speed = out.get("write_gb_s_best")
    line = f"{name} over {out.get('transport')}: {speed} GB/s best, data {'intact' if out['intact'] else 'CORRUPTED'}"
    if not out["intact"]:
        return False, line
    if floor is not None and (not isinstance(speed, (int, float)) or speed < floor):
        return False, f"{line}, below the floor of {floor:g} GB/s"
    return True, line
