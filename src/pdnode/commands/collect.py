"""`pdnode collect INVENTORY`: the incident bundle of every host, through the collect
playbook (the checkout's playbooks/collect.yml or the installed collection's
pdnode.sglang_pd.collect), which runs pdnode.node.collect on each host and merges the parts."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..core.resources import playbook as find_playbook


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect", help="the incident bundle: every host's state, logs and files in one tar.gz "
                                       "(runs playbooks/collect.yml)")
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--limit", help="only these hosts (an Ansible --limit pattern)")
    p.add_argument("--out", help="directory for the bundle (default: .cache/collect in the repository, or in "
                                 "the current directory with the installed package)")
    p.set_defaults(func=cmd_collect)


def cmd_collect(args: argparse.Namespace) -> int:
    """Exit 0: bundle written with every host; 1: written, some host missing; 2: no bundle."""
    playbook, playbook_env = find_playbook("collect")
    # The project's own Ansible: the one installed beside this Python (.venv/bin).
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    if not os.access(ansible_playbook, os.X_OK):
        print(f"pdnode collect: ansible-playbook is not installed next to {sys.executable} "
              "(set up the project's .venv: scripts/setup)", file=sys.stderr)
        return 2
    inventory = Path(args.inventory).resolve()
    if not inventory.exists():
        print(f"pdnode collect: inventory {args.inventory} not found", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pdnode-collect-") as tmp:
        path_file = Path(tmp) / "summary.json"
        extra = {"collect_path_file": str(path_file)}
        if args.out:
            extra["collect_out_dir"] = str(Path(args.out).resolve())
        argv = [str(ansible_playbook), playbook, "-i", str(inventory), "-e", json.dumps(extra)]
        argv += ["--limit", args.limit] if args.limit else []
        # A checkout's configuration, always (its collections path holds the checkout as
        # pdnode.sglang_pd), whatever ANSIBLE_CONFIG the caller's shell has.
        env = dict(os.environ, **playbook_env)
        env["PATH"] = f"{ansible_playbook.parent}{os.pathsep}{env.get('PATH', '')}"
        t0 = time.monotonic()
        # Ansible's own output is the progress (one line per task and host).
        rc = subprocess.run(argv, env=env, check=False).returncode
        elapsed = time.monotonic() - t0
        summary = json.loads(path_file.read_text()) if path_file.is_file() else None
    if summary is None:
        print(f"pdnode collect: no bundle was written (ansible-playbook exit {rc}; its output above says why)",
              file=sys.stderr)
        return 2
    print(f"bundle: {summary['bundle']}  ({summary['files']} files, {summary['missing']} items not collected "
          f"(MANIFEST.json says why), {elapsed:.1f} s)")
    if summary["not_collected"] or rc != 0:
        hosts = ", ".join(summary["not_collected"]) or "see the playbook output"
        print(f"pdnode collect: the bundle is incomplete: not collected from {hosts}", file=sys.stderr)
        return 1
    return 0
