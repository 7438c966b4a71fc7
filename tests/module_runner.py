"""Run an Ansible module's main() in this process, as a host would run it (no host
needed): the tests of plugins/modules/*.py share this."""

from __future__ import annotations

import importlib.util
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest


def load_module(path: Path):
    """A fresh instance of the module file at PATH (module-level state starts clean)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_module(mod, args: dict, check: bool = False, diff: bool = False) -> dict:
    """Call MOD.main() with ARGS as Ansible passes them; returns its JSON result."""
    from ansible.module_utils import basic

    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check, "_ansible_diff": diff,
                                       "_ansible_no_log": False, "_ansible_tmpdir": None,
                                       "_ansible_remote_tmp": "/tmp", "_ansible_keep_remote_files": False}}
    basic._ANSIBLE_ARGS = json.dumps(payload).encode()
    basic._ANSIBLE_PROFILE = "legacy"
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        mod.main()
    return json.loads(out.getvalue())
