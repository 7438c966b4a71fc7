"""Ansible filters over pdnode.core.host.facts / pdnode.core.host.preflight / pdnode.core.rules.mooncake_select.

Thin by design: every parser and every rule lives in src/pdnode/; these wrappers
only convert exceptions into AnsibleFilterError.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from pdnode.core.host import facts as hostfacts, preflight
    from pdnode.core.rules import mooncake_select
except ImportError:  # not installed (e.g. ansible-core carried as wheels): use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pdnode.core.host import facts as hostfacts, preflight
    from pdnode.core.rules import mooncake_select


def pdnode_hostfacts(raw):
    """Registered probe results {name: {rc, stdout, stderr}} -> host facts dict."""
    try:
        return hostfacts.collect(dict(raw))
    except Exception as exc:  # a parser bug must name itself, not crash the play
        raise AnsibleFilterError(f"pdnode_hostfacts: {exc}") from exc


def pdnode_preflight_expect(plan, overrides=None):
    """Plan dict (or None) + explicit expectations -> the expectations judged."""
    try:
        return preflight.expectations(dict(plan) if plan else None, dict(overrides or {}))
    except ValueError as exc:
        raise AnsibleFilterError(f"pdnode_preflight_expect: {exc}") from exc


def pdnode_own_units(plan):
    """Plan dict -> the systemd units it runs on this host (they may hold its ports)."""
    return preflight.own_units(dict(plan))


def pdnode_preflight_judge(facts, expect):
    """Facts + expectations -> {ok, errors: [line], warnings: [line], problems: [...]}."""
    try:
        return preflight.report(dict(facts), dict(expect))
    except ValueError as exc:
        raise AnsibleFilterError(f"pdnode_preflight_judge: {exc}") from exc


def pdnode_pci_scan(text):
    """sysfs PCI listing -> {nvidia_gpus, nvswitches, mellanox_nics} (lists)."""
    return hostfacts.parse_pci_scan(text or "")


def pdnode_smi_summary(text):
    """nvidia-smi -q text -> {driver_version, cuda_version, attached_gpus, gpus}."""
    return hostfacts.smi_q_summary(text or "")


def pdnode_mooncake_select(driver_cuda, override=None, stack_cuda=None, versions=None):
    """Pick the Mooncake transfer-engine build for the host."""
    try:
        return mooncake_select.select(driver_cuda or None, override or None, stack_cuda or None,
                                      dict(versions or {}))
    except mooncake_select.SelectionError as exc:
        raise AnsibleFilterError(f"pdnode_mooncake_select: {exc}") from exc


class FilterModule:
    def filters(self):
        return {
            "pdnode_hostfacts": pdnode_hostfacts,
            "pdnode_preflight_expect": pdnode_preflight_expect,
            "pdnode_preflight_judge": pdnode_preflight_judge,
            "pdnode_own_units": pdnode_own_units,
            "pdnode_pci_scan": pdnode_pci_scan,
            "pdnode_smi_summary": pdnode_smi_summary,
            "pdnode_mooncake_select": pdnode_mooncake_select,
        }
