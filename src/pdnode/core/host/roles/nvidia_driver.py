"""What the nvidia_driver role installs on a host: NVIDIA's repository path for its OS and
architecture, the packages of the pinned branch, and whether (and at which version) the
fabric manager goes with them. From the role's own values and the host's facts (not the
plan alone), so the role calls these through filters (plugins/filter/roles.py)."""

from __future__ import annotations

from typing import Any

from pdnode.core.host import facts as hostfacts

# Repository path names NVIDIA uses: ubuntu2204, ubuntu2404, debian12; x86_64 or sbsa.
SUPPORTED = ["ubuntu 22.04", "ubuntu 24.04", "debian 12"]
REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
FLAVOR_PACKAGES = {"open": ["nvidia-open"], "proprietary": ["cuda-drivers"]}
FABRICMANAGER = ["auto", "always", "never"]


def _int(value: Any) -> int:
    """Jinja's int filter: 0 for what is no whole number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def os_release(distribution: str, version: str, major_version: str) -> tuple[str, str]:
    """(os, version) as the supported list names them: Ubuntu by its full version
    (22.04), Debian by its major one (12)."""
    os = str(distribution).lower()
    return os, str(version if os == "ubuntu" else major_version)


def host(*, distribution: str, version: str, major_version: str, architecture: str, base_url: str, branch: Any,
         driver_version: str, flavor: str, fabricmanager: str, extra_packages: list[str],
         allow_branch_switch: bool) -> dict[str, Any]:
    """The repository, the packages in install order, and the problem ('' when none) that
    stops the role before it changes anything: an unsupported OS or architecture, flavor,
    branch (older than 525) or fabric manager setting."""
    os, os_version = os_release(distribution, version, major_version)
    arch = REPO_ARCH.get(architecture, "unsupported")
    supported = (f"{os} {os_version}" in SUPPORTED and arch != "unsupported" and flavor in FLAVOR_PACKAGES
                 and _int(branch) >= 525 and fabricmanager in FABRICMANAGER)
    problem = "" if supported else (
        f"nvidia_driver supports {', '.join(SUPPORTED)} on x86_64/aarch64, flavor open|proprietary, fabric manager "
        f"auto|always|never; this host is {os} {os_version} {architecture}, flavor {flavor}, fabric manager "
        f"{fabricmanager}.")
    # Branch locking as NVIDIA documents it for Debian/Ubuntu: the pinning package first
    # (nvidia-driver-pinning-<branch>, or -<exact version>), then the driver metapackage.
    pinning = f"nvidia-driver-pinning-{driver_version if driver_version else branch}"
    # From branch 590 on, NVIDIA's Debian/Ubuntu packages drop the branch from their names.
    suffix = f"-{branch}" if _int(branch) < 590 else ""
    return {
        "problem": problem,
        "repo_url": f"{base_url}/{os}{os_version.replace('.', '')}/{arch}/",
        "pinning_package": pinning,
        "packages": [pinning, *FLAVOR_PACKAGES.get(flavor, []), *extra_packages],
        "fm_packages": [f"nvidia-fabricmanager{suffix}", f"libnvidia-nscq{suffix}"],
        # present keeps an installed driver as it is; a branch switch is explicit
        "install_state": "latest" if allow_branch_switch else "present",
    }


def fabric(fabricmanager: str, *, pci: str, nvswitches: list[str], driver_version: str, modversion: str,
           fm_packages: list[str]) -> dict[str, Any]:
    """Whether the fabric manager is wanted (always, or auto where NVSwitches exist: in /proc
    once the driver runs, on the PCI bus before that), the driver version it must equal
    (the inventory's exact version, or the one the installed kernel module reports; '' when
    neither is known) and its packages pinned to that version."""
    count = max(len(hostfacts.parse_pci_scan(pci or "")["nvswitches"]), len(nvswitches))
    want = fabricmanager == "always" or (fabricmanager == "auto" and count > 0)
    exact = driver_version if driver_version else (modversion or "").strip()
    return {"nvswitch_count": count, "want": want, "exact_version": exact,
            "pinned": [f"{p}={exact}-*" for p in fm_packages]}
