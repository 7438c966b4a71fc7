"""Which Mooncake transfer-engine wheel fits a host.

Mooncake ships three builds under three PyPI names: ``mooncake-transfer-engine``
(CUDA 12), ``mooncake-transfer-engine-cuda13`` (CUDA 13) and
``mooncake-transfer-engine-non-cuda`` (no GPU; imports with libibverbs alone). The CUDA
builds need libcuda and fail to import on a host without a driver; a CUDA-13 build also
needs a driver new enough for CUDA 13. This function is the one place that decides.
"""

from __future__ import annotations

import re
from typing import Any

from ...node import releases

PACKAGES = {
    "cuda12": "mooncake-transfer-engine",
    "cuda13": "mooncake-transfer-engine-cuda13",
    "non-cuda": "mooncake-transfer-engine-non-cuda",
}
DEFAULT_VERSIONS = {"non-cuda": releases.MOONCAKE, "cuda12": releases.MOONCAKE, "cuda13": releases.MOONCAKE_CUDA13}


# The first NVIDIA driver branch whose CUDA is 13 (525-575: CUDA 12). The one rule from
# a pinned branch to its CUDA major: the plan's install.cuda_major (DCGM's package flavor)
# reads it; select() below judges the CUDA the installed driver reports.
FIRST_CUDA13_BRANCH = 580


class SelectionError(ValueError):
    pass


def branch_cuda_major(branch: Any) -> int:
    """The CUDA major of NVIDIA driver branch BRANCH (580 -> 13, 570 -> 12)."""
    return 13 if int(branch) >= FIRST_CUDA13_BRANCH else 12


def _major(version: Any) -> int | None:
    if version is None or version == "":
        return None
    m = re.match(r"^\s*(\d+)", str(version))
    if not m:
        raise SelectionError(f"CUDA version {version!r} is not a version (expected e.g. '13.0' or 12)")
    return int(m.group(1))


def select(driver_cuda: Any = None, override: str | None = None, stack_cuda: Any = None,
           versions: dict[str, str] | None = None) -> dict[str, Any]:
    """Pick the build.

    - ``driver_cuda``: the highest CUDA the installed driver supports (``CUDA Version``
      of nvidia-smi), None when there is no NVIDIA driver.
    - ``stack_cuda``: the CUDA major of the Python stack it must load beside (the
      SGLang/torch release's CUDA), None to follow the driver.
    - ``override``: ``cuda12`` | ``cuda13`` | ``non-cuda`` forces a build.

    Returns ``{flavor, package, version, requirement, reason}``; raises SelectionError
    when the combination cannot work (a CUDA build without a driver, a driver older than
    the stack).
    """
    vers = {**DEFAULT_VERSIONS, **(versions or {})}
    drv, stack = _major(driver_cuda), _major(stack_cuda)
    if override:
        if override not in PACKAGES:
            raise SelectionError(f"unknown Mooncake build {override!r}; use one of {', '.join(PACKAGES)}")
        if override != "non-cuda" and drv is None:
            raise SelectionError(f"the {override} build of Mooncake needs an NVIDIA driver and this host has none: "
                                 "use non-cuda, or install the driver first")
        flavor, reason = override, f"forced by the override ({override})"
    elif drv is None:
        flavor, reason = "non-cuda", "no NVIDIA driver on the host"
    else:
        want = stack if stack is not None else drv
        if want > drv:
            raise SelectionError(f"the Python stack needs CUDA {want} but the driver supports only CUDA "
                                 f"{driver_cuda}: upgrade the driver branch")
        if want >= 13:
            flavor = "cuda13"
        elif want == 12:
            flavor = "cuda12"
        else:
            raise SelectionError(f"CUDA {want} is older than any Mooncake CUDA build (12 or 13)")
        source = f"the stack's CUDA {stack}" if stack is not None else f"the driver's CUDA {driver_cuda}"
        reason = f"{source} (driver supports CUDA {driver_cuda})"
    package, version = PACKAGES[flavor], vers[flavor]
    return {"flavor": flavor, "package": package, "version": version,
            "requirement": f"{package}=={version}", "reason": reason}
