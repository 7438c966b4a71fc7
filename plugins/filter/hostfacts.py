"""Ansible filters over pdnode.core.host.facts and pdnode.core.host.preflight.

Thin by design: every parser and every rule lives in src/pdnode/; these wrappers
only convert exceptions into AnsibleFilterError.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from pdnode.core.host import facts as hostfacts, preflight
except ImportError:  # not installed (e.g. ansible-core carried as wheels): use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pdnode.core.host import facts as hostfacts, preflight


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


def pdnode_preflight_judge(facts, expect):
    """Facts + expectations -> {ok, errors: [line], warnings: [line], problems: [...]}."""
    try:
        return preflight.report(dict(facts), dict(expect))
    except ValueError as exc:
        raise AnsibleFilterError(f"pdnode_preflight_judge: {exc}") from exc


class FilterModule:
    def filters(self):
        return {
            "pdnode_hostfacts": pdnode_hostfacts,
            "pdnode_preflight_expect": pdnode_preflight_expect,
            "pdnode_preflight_judge": pdnode_preflight_judge,
        }
