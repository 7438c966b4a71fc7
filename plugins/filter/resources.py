"""Ansible filters over pdnode.core.resources: where the controller's files are, in a checkout
and from the installed collection and package alike. No rule lives here."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from pdnode.core import resources
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pdnode.core import resources


def pdnode_controller_root(playbook_dir: str) -> str:
    """playbook_dir -> the directory of the inventory's relative paths and the runs' reports."""
    return str(resources.controller_root(str(playbook_dir)))


def pdnode_controller_path(path: str | None, playbook_dir: str) -> str:
    """An inventory path setting -> '' when unset, else absolute (relative: under the
    controller's directory for PLAYBOOK_DIR's playbooks)."""
    return resources.controller_path(None if path is None else str(path), str(playbook_dir))


def pdnode_module_file(module: str) -> str:
    """'pdnode.node.drain' -> the file of that module in the pdnode package Ansible imports."""
    return str(resources.module_file(str(module)))


def pdnode_resource(path: str) -> str:
    """'templates/grafana/x.json' -> that package data file."""
    return str(resources.resource(*str(path).split("/")))


class FilterModule:
    def filters(self):
        return {"pdnode_controller_root": pdnode_controller_root, "pdnode_controller_path": pdnode_controller_path,
                "pdnode_module_file": pdnode_module_file,
                "pdnode_resource": pdnode_resource}
