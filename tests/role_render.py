"""The pd_services role's files for a plan, rendered as the deploy renders them: Ansible's
template engine with the role's defaults and vars, the collection's lookup and filters.
Shared by the tests that read what a deploy would write (tests/test_plan_facts.py,
tests/test_engine_unit_restart.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def render_pd_services_files(plan: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    """_pd_services_files of PLAN (each file's path, mode, owners and content), rendered in TMP."""
    roles = ROOT / "roles"
    (tmp / "plan.json").write_text(json.dumps({"pd_services_plan": plan, "pdnode_out": str(tmp / "files.json")}))
    play = [{"name": "Render", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars_files": [str(roles / "pd_services/defaults/main.yml"), str(roles / "pd_services/vars/main.yml"),
                            str(tmp / "plan.json")],
             "tasks": [{"name": "Write the files the role would write", "ansible.builtin.copy": {
                 "content": "{{ _pd_services_files | to_json }}", "dest": "{{ pdnode_out }}", "mode": "0600"}}]}]
    (tmp / "render.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    # its templates found beside the play, as they are found beside the role's tasks
    (tmp / "templates").symlink_to(roles / "pd_services/templates")
    # the templates name the collection's lookup and filters (pdnode.sglang_pd.*): this
    # checkout is that collection, on a collections path of its own (what renders is this tree)
    collection = tmp / "collections" / "ansible_collections" / "pdnode"
    collection.mkdir(parents=True)
    (collection / "sglang_pd").symlink_to(ROOT)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(tmp / "collections"), "ANSIBLE_LOCALHOST_WARNING": "0",
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0", "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                        "-e", f"ansible_python_interpreter={sys.executable}", str(tmp / "render.yml")],
                       capture_output=True, text=True, env=env, cwd=tmp, timeout=300, check=False)
    assert r.returncode == 0, f"rendering failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    return json.loads((tmp / "files.json").read_text())
