"""`pdnode check`, render, explain and plan run none of the inventory's code (issue 27,
item 7).

They read an inventory as the playbooks do (ansible-core's inventory and variable
managers, values templated), so a value such as
``"{% set x = lookup('pipe', 'touch ran') %}hi"`` would run ``touch`` on the machine of
whoever reviews the inventory. Here such values are planted in several fields and files
of a copied inventory (group_vars/all/*.yml, host_vars, hosts.yml), every command runs
through pdnode's entry point, and no marker file may appear; each value is reported:
refused where it reaches a unit, argv or ServerArgs, "templated at deploy, not judged"
elsewhere (pdnode.core.inventory.deferred). The shipped inventories read exactly as without the
guard, and ansible-playbook still templates the same values at deploy time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from planvars import changed, variables
from test_planner import measurement_args

from pdnode.commands.cli import main
from pdnode.core.inventory import deferred, read as inventory
from pdnode.core.rules import values
from pdnode.core.inventory.fields import BY_NAME, REQUIRED
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]


def _copy(tmp_path: Path, name: str = "gpu01") -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / name, inv)  # symlinked files copied as files
    return inv


def _plant(inv: Path, group_vars: dict, host_vars: dict, inline: dict, host: str = "gpu01") -> None:
    """Variables in a new group_vars/all file (read last), in host_vars/HOST.yml and inline
    in hosts.yml's entry of HOST."""
    (inv / "group_vars" / "all" / "zz-planted.yml").write_text(yaml.safe_dump(group_vars))
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(host_vars))
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["pd_nodes"]["hosts"][host].update(inline)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return rc, out, err


def _ran(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("ran-*"))


def _warned(err: str) -> dict[str, str]:
    """field -> its warning line, of the lines that say "templated at deploy, not judged"."""
    lines = [line for line in err.splitlines() if "templated at deploy, not judged" in line]
    return {line.removeprefix("warning: ").split("=", 1)[0]: line for line in lines}


# --- values only the deploy needs: a warning each, the plan computed without them --------------------------------

def _deploy_time(m: Path) -> tuple[dict, dict, dict, dict[str, str]]:
    """(group_vars, host_vars, inline, field -> what it needs) for the demo inventory."""
    group = {
        "ansible_become_password": f"{{{{ lookup('pipe', 'touch {m}/ran-become') }}}}",
        "site_mirror": f"{{% set x = lookup('pipe', 'touch {m}/ran-mirror') %}}http://mirror.example",
        "pdnode_verify_reference_answer": f"{{{{ query('pipe', 'touch {m}/ran-answer') | first | default('Paris') }}}}",
        "pdnode_verify_thresholds": {"ttft_p50_max_s": f"{{{{ q('pipe', 'touch {m}/ran-threshold') }}}}"},
        "rdma_packages": ["libibverbs1", f"{{{{ lookup('ansible.builtin.pipe', 'touch {m}/ran-rdma') }}}}"],
    }
    host = {
        "pdnode_fast_path": f"{{{{ lookup('file', '{m}/fast') | bool }}}}",
        "nvidia_driver_repo_base_url": "{{ lookup('env', 'PDNODE_TEST_MIRROR') }}",
        "site_models": f"{{{{ '{m}/*' | fileglob }}}}",
    }
    inline = {"ansible_port": f"{{{{ lookup('pipe', 'touch {m}/ran-port; echo 22') }}}}"}
    needs = {
        "ansible_become_password": "lookup('pipe')", "site_mirror": "lookup('pipe')",
        "pdnode_verify_reference_answer": "query('pipe')", "pdnode_verify_thresholds.ttft_p50_max_s": "query('pipe')",
        "rdma_packages[1]": "lookup('ansible.builtin.pipe')", "pdnode_fast_path": "lookup('file')",
        "nvidia_driver_repo_base_url": "lookup('env')",
        "site_models": "the filter fileglob (it reads the controller's files)", "ansible_port": "lookup('pipe')",
    }
    return group, host, inline, needs


def test_values_only_the_deploy_needs_are_warned_and_run_nothing(tmp_path, capsys):
    inv = _copy(tmp_path, "demo")
    group, host, inline, needs = _deploy_time(tmp_path)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    name = next(iter(hosts["all"]["children"]["pd_nodes"]["hosts"]))
    _plant(inv, group, host, inline, host=name)
    (tmp_path / "fast").write_text("false\n")

    rc, out, err = _cli(capsys, "check", str(inv))
    assert rc == 0, err
    assert out.startswith(f"{inv}: host {name} OK ("), out
    warned = _warned(err)
    assert sorted(warned) == sorted(needs), err
    for field, line in warned.items():
        assert f"templated at deploy, not judged: it needs {needs[field]}," in line, line
    # judged as if unset: the values the plan falls back to
    plan = load_inventory(inv)
    assert isinstance(plan.variables["pdnode_fast_path"], deferred.Deferred)

    rc, out, err = _cli(capsys, "render", str(inv), "--role", "plan")
    assert rc == 0, err
    rendered = json.loads(out)
    assert rendered["settings"]["pdnode_fast_path"] is True  # the default: the deploy decides
    assert sorted(_warned(err)) == sorted(needs)
    assert sum("templated at deploy" in w for w in rendered["warnings"]) == len(needs)
    rc, out, err = _cli(capsys, "explain", str(inv))
    assert rc == 0 and sorted(_warned(err)) == sorted(needs), err
    rc, out, err = _cli(capsys, "plan", str(inv), *measurement_args(tmp_path))
    assert rc == 0, err
    assert _ran(tmp_path) == []


# --- values that reach a unit, argv or ServerArgs: refused, one line each ------------------------------------------

def test_values_in_units_or_argv_are_refused_and_run_nothing(tmp_path, capsys):
    inv = _copy(tmp_path)
    m = tmp_path
    (m / "gpu.txt").write_text("NVIDIA H200")
    prefill = load_inventory(ROOT / "inventories" / "gpu01").variables["pdnode_prefill_instances"]
    prefill[0]["extra_args"] = {"dtype": f"{{{{ lookup('pipe', 'touch {m}/ran-dtype; echo auto') }}}}"}
    group = {
        "pdnode_model_path": f"{{{{ lookup('pipe', 'touch {m}/ran-model') }}}}",
        "pd_services_limit_nofile": f"{{% set x = lookup('pipe', 'touch {m}/ran-nofile') %}}1048576",
        "pdnode_router_host": "{{ '0.0.0.0' if '/etc' is exists else '127.0.0.1' }}",
        "pdnode_sglang_version": "{{ ('/etc/*' | fileglob) and '0.5.23' }}",
    }
    host = {
        "pdnode_engine_environment": {"SGLANG_X": f"{{{{ lookup('pipe', 'touch {m}/ran-env') }}}}"},
        "pdnode_prefill_instances": prefill,
        "pdnode_gpu_model": f"{{% include '{m}/gpu.txt' %}}",
    }
    inline = {"pdnode_model_served_name": "{{ 'glm' | community.general.random_mac }}"}
    _plant(inv, group, host, inline)
    needs = {
        "pdnode_model_path": "lookup('pipe')", "pd_services_limit_nofile": "lookup('pipe')",
        "pdnode_router_host": "the test exists (it reads the controller's files)",
        "pdnode_sglang_version": "the filter fileglob (it reads the controller's files)",
        "pdnode_engine_environment.SGLANG_X": "lookup('pipe')",
        "pdnode_prefill_instances[0].extra_args.dtype": "lookup('pipe')",
        "pdnode_gpu_model": f"an include of '{m}/gpu.txt'",
        "pdnode_model_served_name": "the filter community.general.random_mac (a collection's)",
    }
    for argv in (["check"], ["render", "--role", "plan"], ["explain"], ["plan", *measurement_args(tmp_path)]):
        rc, out, err = _cli(capsys, argv[0], str(inv), *argv[1:])
        assert rc == 1 and out == "", (argv, out, err)
        head, *lines = err.splitlines()
        assert head == f"{inv}: {len(needs)} problems in host gpu01:", (argv, err)
        got = {line.strip().split("=", 1)[0]: line for line in lines}
        assert sorted(got) == sorted(needs), (argv, err)
        for field, line in got.items():
            assert f": needs {needs[field]} to be computed, and pdnode check runs none of the inventory's code" in line
            assert "Fix: write the value itself (what the template gives), not the template." in line, line
    assert "pdnode_model_path=\"{{ lookup('pipe', 'touch " in got["pdnode_model_path"]
    assert got["pdnode_model_path"].endswith("[inv/group_vars/all/zz-planted.yml]")
    assert got["pdnode_gpu_model"].endswith("[inv/host_vars/gpu01.yml]")
    assert got["pdnode_model_served_name"].endswith("[inv/hosts.yml]")

    rc, out, err = _cli(capsys, "check", "--json", str(inv))
    report = json.loads(out)
    assert rc == 1 and not report["ok"]
    assert {p["rule"] for p in report["problems"]} == {"value-needs-lookup"}
    assert _ran(tmp_path) == []


def test_another_hosts_values_that_need_a_lookup_are_refused(tmp_path, capsys):
    """A layout over several hosts reads its peers' address and description."""
    inv = _copy(tmp_path, "gpu-pair")
    (inv / "host_vars" / "gpu02.yml").write_text(
        f"pdnode_node_address: \"{{{{ lookup('pipe', 'touch {tmp_path}/ran-address; echo 10.20.0.12') }}}}\"\n"
        f"pdnode_router_port: \"{{{{ lookup('pipe', 'touch {tmp_path}/ran-port; echo 8000') | int }}}}\"\n")
    rc, _, err = _cli(capsys, "check", str(inv), "--host", "gpu01")
    assert rc == 1
    head, *lines = err.splitlines()
    assert head == f"{inv}: 2 problems in host gpu01:", err
    assert sorted(line.strip().split("=", 1)[0] for line in lines) == ["gpu02.pdnode_node_address",
                                                                       "gpu02.pdnode_router_port"], err
    assert all(": needs lookup('pipe') to be computed" in line for line in lines), err
    assert _ran(tmp_path) == []


def test_a_plugin_from_a_plugin_directory_does_not_run(tmp_path):
    """A filter that is not ansible-core's (ANSIBLE_FILTER_PLUGINS) is not called; the
    command runs as a process of its own, as an operator runs it."""
    plugins = tmp_path / "filter_plugins"
    plugins.mkdir()
    (plugins / "site.py").write_text(
        "import pathlib\n\n\ndef touch(value):\n"
        f"    pathlib.Path({str(tmp_path / 'ran-filter')!r}).touch()\n    return value\n\n\n"
        "class FilterModule:\n    def filters(self):\n        return {'site_touch': touch}\n")
    inv = _copy(tmp_path)
    _plant(inv, {"pdnode_model_path": "{{ '/models/GLM-4.5-Air-FP8' | site_touch }}"}, {}, {})
    env = {**os.environ, "ANSIBLE_FILTER_PLUGINS": str(plugins), "PDNODE_SGLANG_VALIDATOR": "off"}
    r = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "check", str(inv)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert r.returncode == 1, r.stderr
    assert "pdnode_model_path=\"{{ '/models/GLM-4.5-Air-FP8' | site_touch }}\": needs the filter site_touch " \
           "(not ansible-core's) to be computed" in r.stderr, r.stderr
    assert _ran(tmp_path) == []


def test_an_inventory_script_is_not_run(tmp_path, capsys):
    """Ansible's script plugin executes any executable file of an inventory directory."""
    inv = _copy(tmp_path)
    script = inv / "dynamic.sh"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran-script\necho '{{\"_meta\": {{\"hostvars\": {{}}}}}}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    rc, out, err = _cli(capsys, "check", str(inv))
    assert rc == 0 and out.startswith(f"{inv}: host gpu01 OK"), err
    assert _ran(tmp_path) == []


def test_the_guard_is_lifted_after_reading(tmp_path):
    """Only pdnode's reading is guarded: Ansible's own functions are back afterwards."""
    from ansible import constants
    from ansible._internal._templating import _jinja_plugins

    before = (_jinja_plugins._invoke_lookup, _jinja_plugins.JinjaPluginIntercept.__getitem__,
              jinja2.Environment._load_template, list(constants.INVENTORY_ENABLED))
    inv = _copy(tmp_path)
    _plant(inv, {"pdnode_model_path": f"{{{{ lookup('pipe', 'touch {tmp_path}/ran-x') }}}}"}, {}, {})
    load_inventory(inv)
    after = (_jinja_plugins._invoke_lookup, _jinja_plugins.JinjaPluginIntercept.__getitem__,
             jinja2.Environment._load_template, list(constants.INVENTORY_ENABLED))
    assert after == before
    assert "script" in constants.INVENTORY_ENABLED or "ansible.builtin.script" in constants.INVENTORY_ENABLED


# --- the shipped inventories read as before: no new warning, the same output ---------------------------------------

@contextlib.contextmanager
def _no_guard():
    yield []


@pytest.mark.parametrize("name", ["gpu01", "demo", "gpu-pair"])
def test_shipped_inventories_read_exactly_as_without_the_guard(name, capsys, monkeypatch):
    path = str(ROOT / "inventories" / name)
    commands = [["check", path], ["explain", path], ["check", "--json", path]]
    if name != "gpu-pair":
        commands.append(["render", path, "--role", "plan"])
    guarded = []
    inventory._resolve_cached.cache_clear()
    for argv in commands:
        guarded.append(_cli(capsys, *argv))
    check_rc, check_out, check_err = guarded[0]
    assert check_rc == 0 and " OK (" in check_out
    assert check_err and all(line.startswith("warning: ") for line in check_err.splitlines()), check_err
    assert not any("templated at deploy" in out + err or "needs" in err for _, out, err in guarded), check_err
    monkeypatch.setattr(inventory, "guard", _no_guard)
    inventory._resolve_cached.cache_clear()
    try:
        unguarded = [_cli(capsys, *argv) for argv in commands]
    finally:
        inventory._resolve_cached.cache_clear()
    assert guarded == unguarded


# --- the tables behind the verdict ------------------------------------------------------------------------------

# a different valid value for each deploy-time field
OTHER_VALUES = {
    "pdnode_fast_path": False, "pdnode_wheelhouse": "wheels/x", "pdnode_driver_branch": 570,
    "pdnode_kv_prompt_tokens": 8000, "pdnode_model_weights_gb": 100.0,
    "pdnode_model_controller_path": "playbooks/files/demo-moe", "pdnode_model_kv_bytes_per_token": 70000,
    "pdnode_verify_prompt_words": 111, "pdnode_verify_max_tokens": 23, "pdnode_verify_burst_requests": 9,
    "pdnode_verify_burst_concurrency": 3, "pdnode_verify_timeout_s": 31.0,
    "pdnode_verify_reference_prompt": "What is the capital of Italy? Answer in one word.",
    "pdnode_verify_reference_answer": "Rome", "pdnode_verify_thresholds": {"ttft_p50_max_s": 9.0},
}


def test_deploy_time_fields_reach_no_unit_argv_or_environment():
    assert sorted(OTHER_VALUES) == sorted(deferred.DEPLOY_TIME_FIELDS)
    for name in ("gpu01", "demo"):
        base = variables(name)
        plan = build_plan(base, "node")
        for field, value in OTHER_VALUES.items():
            assert BY_NAME[field].default is not REQUIRED, field  # the plan can do without it
            other = build_plan(changed(base, {field: value}), "node")
            assert other.settings[field] != plan.settings[field] or field == "pdnode_verify_thresholds"
            assert (other.services, other.firewall, other.ports) == (plan.services, plan.firewall, plan.ports), field


def test_unit_role_variables_are_written_into_units():
    templates = "\n".join(p.read_text() for d in ("pd_services", "monitoring")
                          for p in (ROOT / "roles" / d / "templates").glob("*.j2"))
    for name in sorted(deferred.UNIT_ROLE_VARIABLES):
        assert name in values.ROLE_RULES or name in values.HARDENING_SWITCHES, name
        assert name in templates, name
    assert deferred.lands_in_unit("pdnode_model_path") and not deferred.lands_in_unit("pdnode_fast_path")
    assert not deferred.lands_in_unit("ansible_host") and not deferred.lands_in_unit("pdnode_no_such_variable")


def test_a_deferred_value_survives_copies():
    import copy

    value = deferred.Deferred("{{ lookup('pipe', 'x') }}", "lookup('pipe')")
    for twin in (copy.deepcopy(value), copy.copy(value), copy.deepcopy({"v": [value]})["v"][0]):
        assert isinstance(twin, deferred.Deferred) and twin == value and twin.needs == value.needs


# --- the deploy templates them as before ----------------------------------------------------------------------

def test_ansible_playbook_still_templates_them_at_deploy(tmp_path):
    """The same values in a playbook: Ansible runs the lookups and the deploy's plan holds
    what they return (the guard lives only in pdnode's own reading)."""
    inv = _copy(tmp_path)
    m = tmp_path
    _plant(inv, {"site_mirror": f"{{% set x = lookup('pipe', 'touch {m}/ran-mirror') %}}http://mirror.example"},
           {"pdnode_model_served_name": f"{{{{ lookup('pipe', 'touch {m}/ran-served; echo glm-deployed') }}}}"},
           {"ansible_connection": "local", "ansible_python_interpreter": sys.executable})
    out = tmp_path / "out.json"
    play = [{"hosts": "gpu01", "gather_facts": False, "tasks": [
        {"ansible.builtin.import_tasks": str(ROOT / "playbooks" / "tasks" / "plan.yml")},
        {"ansible.builtin.copy": {"dest": str(out), "mode": "0600", "content": "{{ {'mirror': site_mirror, "
                                  "'served': _pdnode_plan.services['prefill-0'].args.served_model_name} | to_json }}"}},
    ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".venv" / "collections"), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv), str(tmp_path / "play.yml")],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    assert json.loads(out.read_text()) == {"mirror": "http://mirror.example", "served": "glm-deployed"}
    assert _ran(tmp_path) == ["ran-mirror", "ran-served"]
