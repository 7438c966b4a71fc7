"""What the mooncake role installs and reports: the build for this host (with the other
builds to remove: they share the mooncake package directory) and the loopback check's
line. From the role's own values and what the host answered (not the plan alone), so the
role calls these through filters (plugins/filter/roles.py)."""

from __future__ import annotations

import json
from typing import Any

from pdnode.core.host import facts as hostfacts
from pdnode.core.rules import mooncake_select


def choose(smi: dict[str, Any], build: str, stack_cuda: Any, versions: dict[str, str]) -> dict[str, Any]:
    """``nvidia-smi -q``'s result (rc, stdout; a failed or missing nvidia-smi: no driver)
    and the role's build (auto: from the driver's CUDA version) -> the selection of
    pdnode.core.rules.mooncake_select.select with ``others``: every other build's package.
    Raises mooncake_select.SelectionError when the combination cannot work."""
    driver_cuda = ""
    if smi.get("rc", 1) == 0:
        driver_cuda = hostfacts.smi_q_summary(smi.get("stdout") or "").get("cuda_version") or ""
    chosen = mooncake_select.select(driver_cuda or None, (build if build != "auto" else "") or None,
                                    stack_cuda or None, dict(versions or {}))
    others = [p for p in sorted(set(mooncake_select.PACKAGES.values())) if p != chosen["package"]]
    return {**chosen, "others": others}


def loopback_report(stdout_lines: list[str]) -> str:
    """The loopback check's last line (JSON) -> the bandwidth report the role shows."""
    r = json.loads(stdout_lines[-1])
    return (f"{r['package']} {r['version']}, {r['protocol']}: {r['bytes']} bytes x {r['iterations']}, "
            f"write {r['write_gb_s_best']} GB/s best ({r['write_gb_s_mean']} mean), read {r['read_gb_s']} GB/s, "
            f"data intact: {r['intact']}")
