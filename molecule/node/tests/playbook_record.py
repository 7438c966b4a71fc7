"""Run one of the bundle's playbooks against the scenario's instance as an operator runs it
from the checkout, and keep Ansible's own record of the run (the ansible.posix.json
callback): the tests that count module calls, read a task's result or see what a read
named share this."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def run_playbook(inventory, playbook: str, *args: str, must_pass: bool = True) -> dict:
    """ansible-playbook REPO/PLAYBOOK ARGS; the JSON record, with the exit code under "rc"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(PATH=f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '')}", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_NOCOLOR="1")
    r = subprocess.run(["ansible-playbook", "-i", str(inventory), str(REPO / playbook), *args], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=900, check=False)
    if must_pass:
        assert r.returncode == 0, f"{playbook} {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-3000:]}"
    assert "{" in r.stdout, f"{playbook}: no JSON record:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    record = json.loads(r.stdout[r.stdout.index("{"):])
    record["rc"] = r.returncode
    return record


def make_report_dirs() -> None:
    """The checkout's report directories, as a first run from it makes them: the scenario's
    converge ran from molecule, so a fresh clone may lack them, and a test that counts a
    no-change run's work must not count that first run's."""
    for report in ("preflight", "verify"):
        (REPO / ".cache" / report).mkdir(parents=True, exist_ok=True)
