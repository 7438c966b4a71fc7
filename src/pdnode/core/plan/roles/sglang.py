"""What the sglang role installs and how its venvs differ: computed from the role's own
values (its defaults, which an inventory may override, and the plan's release the
playbook passes), not from the plan alone, so the role calls these through filters
(plugins/filter/roles.py) instead of reading a view."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ....node import releases

MARKER = ".pdnode-release"
# What `python3 -m venv` and Ansible's pip module need on the host.
VENV_PACKAGES = ["python3-venv", "python3-packaging"]


def nice_json(value: Any) -> str:
    """Ansible's to_nice_json(sort_keys=true): what the markers have always held."""
    return json.dumps(value, indent=4, sort_keys=True, separators=(",", ": "))


def release(*, engine: str, python: str, version: str, mooncake_version: str, router_requirement: str,
            sim_packages: list[str], sim_system_packages: list[str], venv: str, router_venv: str,
            install_root: str, wheelhouse: str, bundle_sha256: str) -> dict[str, Any]:
    """What this release installs and records. ``wheelhouse``: the controller wheelhouse's
    stamp, or "index" when the host installs from the package index. The router's venv
    holds its package only (not the wheelhouse: one rebuilt for a new engine release must
    not change the running router's inputs). The stand-in engine (sim) gets Mooncake's
    non-CUDA build and its own system libraries."""
    sim = engine == "sim"
    system = VENV_PACKAGES + (list(sim_system_packages) if sim else [])
    packages = [router_requirement] + (list(sim_packages) + [f"mooncake-transfer-engine-non-cuda=={mooncake_version}"]
                                       if engine != "sglang" else [f"sglang=={version}"])
    # the model role's download client (pdnode.node.model_fetch), pinned in either venv
    packages.append(f"huggingface_hub=={releases.HUGGINGFACE_HUB}")
    release_marker = nice_json({"system": system, "packages": packages, "wheelhouse": wheelhouse})
    router_marker = nice_json({"python": python, "packages": [router_requirement]})
    bundle_id = bundle_sha256[:12]
    bundle_dir = f"pdnode-{bundle_id}"

    def marker_file(where: str, text: str) -> dict[str, Any]:
        return {"path": f"{where}/{MARKER}", "sha256": hashlib.sha256(text.encode()).hexdigest(), "mode": "0644",
                "owner": "root", "group": "root"}

    def pth(where: str) -> dict[str, Any]:
        # pdnode.pth under lib/python3.N/site-packages (N is the venv's): printed, not changed
        return {"argv": ["find", f"{where}/lib", "-mindepth", "3", "-maxdepth", "3", "-name", "pdnode.pth",
                         "-type", "f", "-exec", "cat", "{}", "+"]}

    release_marker_path, router_marker_path = f"{venv}/{MARKER}", f"{router_venv}/{MARKER}"
    return {
        "system_packages": system, "packages": packages,
        "release_marker": release_marker, "router_marker": router_marker,
        "release_marker_path": release_marker_path, "router_marker_path": router_marker_path,
        "bundle_id": bundle_id, "bundle_dir": bundle_dir,
        "bundle_tarball": f"{install_root}/{bundle_dir}.tar.gz",
        # the paths the role writes at names the plan knows, as node_state checks them: the
        # install root and each venv's marker (pdnode.core.plan.managed holds the same modes and owners)
        "managed_directories": [{"path": install_root, "mode": "0755", "owner": "root", "group": "root"}],
        "managed_files": [marker_file(venv, release_marker), marker_file(router_venv, router_marker)],
        # node_state's read-only questions (drift() reads their answers): both markers; which
        # bundles each venv holds as install_bundle.py leaves it (its unpacked bundles, this
        # bundle's package, its pdnode.pth); the tarballs in the install root
        "read": [release_marker_path, router_marker_path],
        "find": {
            "release_src": {"path": f"{venv}/src", "pattern": "pdnode-.*"},
            "router_src": {"path": f"{router_venv}/src", "pattern": "pdnode-.*"},
            "release_bundle": {"path": f"{venv}/src/{bundle_dir}/pdnode", "pattern": "__init__[.]py"},
            "router_bundle": {"path": f"{router_venv}/src/{bundle_dir}/pdnode", "pattern": "__init__[.]py"},
            "tarballs": {"path": install_root, "pattern": "pdnode-.*[.]tar[.]gz"},
        },
        "commands": {"release_pth": pth(venv), "router_pth": pth(router_venv)},
    }


def _marker(text: str | None) -> str:
    """A marker as read (None when missing), trailing line ends dropped. (The role's Jinja
    meant the same, but its pattern, '[\\\\r\\\\n]+$' in a folded vars scalar, dropped trailing
    backslashes, r and n instead; a marker the role wrote ends in "}" either way.)"""
    return re.sub(r"[\r\n]+$", "", text or "")


def drift(state: dict[str, Any], release: dict[str, Any], venv: str, router_venv: str) -> dict[str, Any]:
    """node_state's answer (tasks/main.yml's read) against this release: every way the
    venvs differ from it, as install_bundle.py leaves a venv (this bundle unpacked and no
    other, one pdnode.pth whose line points at it, this tarball and no other); whether each
    venv's marker differs (its packages are installed again), and whether each marker file
    is to be written (its content, or only its mode or owners, differ)."""
    managed = list(state.get("drift", []))
    found, commands, read = state.get("found", {}), state.get("commands", {}), state.get("read", {})
    release_outdated = _marker(read.get(release["release_marker_path"])) != release["release_marker"]
    router_outdated = _marker(read.get(release["router_marker_path"])) != release["router_marker"]
    bundle_dir = release["bundle_dir"]

    def lacks_bundle(key: str, where: str) -> bool:
        # a question node_state was not asked (or not answered) counts as not holding it
        return (found.get(f"{key}_src") != [bundle_dir] or not found.get(f"{key}_bundle")
                or commands.get(f"{key}_pth", {}).get("stdout", "").splitlines() != [f"{where}/src/{bundle_dir}"])

    def file_drift(path: str) -> bool:
        return any(line.startswith(f"file {path}: ") for line in managed)

    lines = (managed
             + (["release venv: marker differs"] if release_outdated else [])
             + (["router venv: marker differs"] if router_outdated else [])
             + ([f"release venv: does not hold bundle {release['bundle_id']}"] if lacks_bundle("release", venv) else [])
             + ([f"router venv: does not hold bundle {release['bundle_id']}"]
                if lacks_bundle("router", router_venv) else [])
             + ([f"bundle tarball: not only {bundle_dir}.tar.gz"]
                if found.get("tarballs") != [f"{bundle_dir}.tar.gz"] else []))
    return {
        "lines": lines, "managed": managed,
        # packages.yml runs: a marker differs, or a marker or the install root drifted
        "install": release_outdated or router_outdated or bool(managed),
        "release_outdated": release_outdated, "router_outdated": router_outdated,
        "write_release_marker": release_outdated or file_drift(release["release_marker_path"]),
        "write_router_marker": router_outdated or file_drift(release["router_marker_path"]),
    }
