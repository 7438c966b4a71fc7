"""playbooks/restart.yml refuses to restart a role's only instance unless
pdnode_allow_unavailable accepts the window (issue 45): run for real against this machine
as the node (a local connection) with the demo layout (1P1D), where it must stop before
anything touches the host -- and the rule that names the lone instances."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from module_runner import load_module

ROOT = Path(__file__).resolve().parents[1]
pdnode_lone_instances = load_module(ROOT / "plugins" / "filter" / "pdnode.py").pdnode_lone_instances


def test_the_lone_instances_are_those_alone_in_their_role():
    engines = {"prefill-0": {"role": "prefill"}, "prefill-1": {"role": "prefill"}, "decode-0": {"role": "decode"}}
    assert pdnode_lone_instances(engines) == ["decode-0"]
    assert pdnode_lone_instances({**engines, "decode-1": {"role": "decode"}}) == []


@pytest.mark.integration
@pytest.mark.parametrize("instance", ["prefill-0", "all"])
def test_restarting_the_only_prefill_is_refused_before_anything_runs(tmp_path, instance):
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "group_vars").symlink_to(ROOT / "inventories" / "demo" / "group_vars")
    (inv / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"pdnode-demo": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv),
                           str(ROOT / "playbooks" / "restart.yml"), "-e", f"restart_instance={instance}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:]
    out = proc.stdout
    assert "restarting prefill-0" in out and "leaves no prefill" in out and "nothing was stopped" in out, out[-3000:]
    assert "pdnode_allow_unavailable" in out
    # the refusal is the first thing that failed, and nothing after it ran
    assert "Put back every planned worker" not in out and "changed=0" in out.split("PLAY RECAP")[-1]
