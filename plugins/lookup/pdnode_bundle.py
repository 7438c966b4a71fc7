"""Pack the pdnode package for the hosts in Ansible's own process (no module call)."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

try:
    from pdnode.commands import bundle
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pdnode.commands import bundle

DOCUMENTATION = r"""
name: pdnode_bundle
short_description: Pack the pdnode package Ansible imports into a reproducible tarball; its sha256
description:
  - Writes the tarball pdnode.commands.bundle packs (same sources, same bytes) to the path given,
    only when its content differs, and returns the tarball's SHA-256 (hex).
  - The package packed is the one Ansible imports (a checkout's src/pdnode or the installed
    wheel), as C(python -m pdnode.commands.bundle) run by Ansible's interpreter packs it.
  - It runs in the controller's process; the sglang role calls it once per run (a run_once
    set_fact), so a no-change deploy starts no process on the controller for it.
options:
  _terms:
    description: Controller path of the tarball to write.
    required: true
    type: list
    elements: path
"""

RETURN = r"""
_raw:
  description: The SHA-256 (hex) of each tarball written.
  type: list
  elements: str
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        try:
            return [bundle.write(Path(str(term))) for term in terms]
        except OSError as exc:
            raise AnsibleLookupError(f"cannot write the pdnode bundle {exc.filename}: {exc.strerror}") from exc
