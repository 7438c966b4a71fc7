"""playbooks/restart.yml refuses to restart a role's only instance unless
pdnode_allow_unavailable accepts the window (issue 45): run for real against this machine
as the node (a local connection) with the demo layout (1P1D), where it must stop before
anything touches the host -- and the rule (pdnode.core.change.cost: an instance with no peer
of its role)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planvars import changed, variables

from pdnode.core.change.cost import restart_refusal
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]


def test_only_a_role_s_only_instance_is_refused_and_the_override_accepts_it():
    v = variables("gpu01-2p1d")  # two prefills, one decode
    plan = build_plan(v, "gpu01").as_dict()
    assert restart_refusal(plan, ["prefill-0"]) is None
    line = restart_refusal(plan, ["prefill-0", "prefill-1", "decode-0"])
    assert line.startswith("restarting decode-0 leaves no instance of its role serving until it is back "
                           "(decode-0 is the layout's only decode)") and "\n" not in line
    assert restart_refusal(build_plan(changed(v, {"pdnode_allow_unavailable": True}), "gpu01").as_dict(),
                           ["decode-0"]) is None


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
    assert "restarting prefill-0" in out and "leaves no instance of its role serving" in out, out[-3000:]
    assert "nothing was stopped" in out
    assert "pdnode_allow_unavailable" in out
    # the refusal is the first thing that failed, and nothing after it ran
    assert "Put back every planned worker" not in out and "changed=0" in out.split("PLAY RECAP")[-1]
