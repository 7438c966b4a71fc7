"""pdnode reads an inventory exactly as Ansible does (issue 17, section 3).

The judge is ``ansible-inventory``: over many generated layouts (group_vars and
host_vars as files and as directories; .yml, .yaml, .json and no extension; inline
host and group vars; nested groups; several hosts) every ``pdnode_*`` value pdnode
resolves for every host equals the one ``ansible-inventory --list`` gives. The four
precedence cases an earlier reader of its own got wrong are tests of their own, through
the CLI an operator runs.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdnode.core.inventory.read import inventory_variables

ROOT = Path(__file__).resolve().parents[1]
GPU01 = ROOT / "inventories" / "gpu01"
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def _ansible_hostvars(inv: Path) -> dict[str, dict]:
    r = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(inv), "--list"], capture_output=True, text=True,
                       check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    hostvars = json.loads(r.stdout)["_meta"]["hostvars"]
    return {h: {k: v for k, v in hv.items() if k.startswith("pdnode_")} for h, hv in hostvars.items()}


def _pdnode_hostvars(inv: Path) -> dict[str, dict]:
    return {h: {k: v for k, v in hv.items() if k.startswith("pdnode_")} for h, hv in inventory_variables(inv).items()}


def _write(path: Path, data: dict, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if fmt == "json" else yaml.safe_dump(data))


def _var_file(base: Path, name: str, data: dict, rng: random.Random, tag: str) -> None:
    """One layer of variables for group or host ``name`` under ``base`` (group_vars or
    host_vars), in one of the forms Ansible reads."""
    form = rng.choice(["file.yml", "file.yaml", "file.json", "file", "dir", "dir-two"])
    if form.startswith("file"):
        ext = form[4:]
        _write(base / f"{name}{ext}", data, "json" if ext == ".json" else "yaml")
    elif form == "dir":
        ext = rng.choice([".yml", ".yaml", ".json", ""])
        _write(base / name / f"{tag}{ext}", data, "json" if ext == ".json" else "yaml")
    else:  # two files in the directory: the later name (sorted) wins where they overlap
        first = {k: f"{v}-first" if isinstance(v, str) else v for k, v in data.items()}
        _write(base / name / "a.yml", first, "yaml")
        _write(base / name / "zz.json", data, "json")


def _layout(tmp: Path, seed: int) -> Path:
    """A random inventory: hosts in nested groups, each layer setting its own variable
    and the contested ones, in a random form."""
    rng = random.Random(seed)  # noqa: S311 - reproducible layouts, not secrets
    inv = tmp / f"inv{seed}"
    hosts = [f"h{i}" for i in range(rng.randint(1, 3))]
    groups = ["gpu", "gpu_h200", "site_a"]
    tree: dict = {"all": {"children": {}}}
    if rng.random() < 0.5:
        tree["all"]["vars"] = {"pdnode_contested": "all-inline", "pdnode_all_inline": 1}
    gpu = {"hosts": {}, "children": {"gpu_h200": {"hosts": {}}}}
    if rng.random() < 0.5:
        gpu["vars"] = {"pdnode_contested": "gpu-inline", "pdnode_nested": {"from": "gpu-inline"}}
    if rng.random() < 0.5:
        gpu["children"]["gpu_h200"]["vars"] = {"pdnode_contested": "h200-inline"}
    site = {"hosts": {}}
    for h in hosts:
        inline = {"pdnode_contested": f"{h}-inline", "pdnode_port": 8000 + int(h[1:])} if rng.random() < 0.5 else None
        placement = rng.choice(["gpu", "gpu_h200", "both"])
        if placement in ("gpu", "both"):
            gpu["hosts"][h] = inline
        if placement in ("gpu_h200", "both"):
            gpu["children"]["gpu_h200"]["hosts"][h] = inline if placement == "gpu_h200" else None
        if rng.random() < 0.5:
            site["hosts"][h] = None
    tree["all"]["children"]["gpu"] = gpu
    if site["hosts"]:
        tree["all"]["children"]["site_a"] = site
    if rng.random() < 0.3:
        tree["all"]["children"]["gpu"]["vars"] = {**gpu.get("vars", {}), "ansible_group_priority": 5}
    _write(inv / "hosts.yml", tree, "yaml")
    for group in ["all"] + groups:
        if rng.random() < 0.6:
            _var_file(inv / "group_vars", group, {"pdnode_contested": f"{group}-file", f"pdnode_g_{group}": seed,
                                                  "pdnode_nested": {"from": f"{group}-file"}}, rng, group)
    for h in hosts:
        if rng.random() < 0.6:
            _var_file(inv / "host_vars", h, {"pdnode_contested": f"{h}-file", "pdnode_list": [h, seed]}, rng, h)
    return inv


@pytest.mark.parametrize("seed", range(24))
def test_every_pdnode_value_matches_ansible_inventory(tmp_path, seed):
    inv = _layout(tmp_path, seed)
    theirs = _ansible_hostvars(inv)
    ours = _pdnode_hostvars(inv)
    assert ours == theirs, (seed, sorted(p.relative_to(inv).as_posix() for p in inv.rglob("*") if p.is_file()))
    assert any("pdnode_contested" in hv for hv in theirs.values()) or not theirs


def _gpu01_copy(tmp_path: Path) -> Path:
    inv = tmp_path / "gpu01"
    shutil.copytree(GPU01, inv)
    return inv


def _router_port(inv: Path) -> int:
    r = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "render", str(inv), "--role", "router"],
                       capture_output=True, text=True, check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["port"]


PRECEDENCE = {
    # a var file sorted after the others in group_vars/all/, in JSON
    "json_file_in_group_dir": lambda inv: _write(inv / "group_vars" / "all" / "zz.json", {"pdnode_router_port": 8080},
                                                 "json"),
    # a group_vars file without an extension
    "group_file_without_extension": lambda inv: _write(inv / "group_vars" / "gpu01_hosts", {"pdnode_router_port": 8080},
                                                       "yaml") or _add_group(inv, "gpu01_hosts"),
    # host vars inline in hosts.yml beside a host_vars/ file: host_vars wins
    "host_vars_over_inline": lambda inv: _inline_and_host_vars(inv),
    # a child group's vars over its parent's
    "child_group_over_parent": lambda inv: _child_over_parent(inv),
}


GPU01_HOST = {"gpu01": {"ansible_host": "gpu01.example.internal", "ansible_user": "ops"}}


def _hosts_yml(inv: Path, children: dict) -> None:
    _write(inv / "hosts.yml", {"all": {"children": children}}, "yaml")


def _add_group(inv: Path, group: str) -> None:
    _hosts_yml(inv, {"pd_nodes": {"hosts": GPU01_HOST}, group: {"hosts": {"gpu01": None}}})


def _inline_and_host_vars(inv: Path) -> None:
    _hosts_yml(inv, {"pd_nodes": {"hosts": {"gpu01": {**GPU01_HOST["gpu01"], "pdnode_router_port": 8081}}}})
    _write(inv / "host_vars" / "gpu01.yml", {"pdnode_router_port": 8080}, "yaml")


def _child_over_parent(inv: Path) -> None:
    # "a_child" sorts before its parent: precedence follows depth, not names. (Vars
    # inline in hosts.yml rank below group_vars/all/, so these are group_vars files.)
    _hosts_yml(inv, {"pd_nodes": {"children": {"a_child": {"hosts": GPU01_HOST}}}})
    _write(inv / "group_vars" / "pd_nodes.yml", {"pdnode_router_port": 8081}, "yaml")
    _write(inv / "group_vars" / "a_child.yml", {"pdnode_router_port": 8080}, "yaml")


@pytest.mark.parametrize("case", sorted(PRECEDENCE))
def test_router_port_set_through_a_precedence_rule_is_what_ansible_gives(tmp_path, case):
    inv = _gpu01_copy(tmp_path)
    PRECEDENCE[case](inv)
    host = next(iter(_ansible_hostvars(inv)))
    assert _ansible_hostvars(inv)[host]["pdnode_router_port"] == 8080
    assert _router_port(inv) == 8080


def test_a_template_in_the_inventory_is_resolved_as_the_playbooks_see_it(tmp_path):
    inv = _gpu01_copy(tmp_path)
    _write(inv / "group_vars" / "all" / "zz.yml",
           {"site_base_port": 8000, "pdnode_router_port": "{{ site_base_port + 80 }}"}, "yaml")
    assert _router_port(inv) == 8080


def test_an_undefined_variable_in_a_template_is_one_line_exit_2(tmp_path):
    inv = _gpu01_copy(tmp_path)
    _write(inv / "group_vars" / "all" / "zz.yml", {"pdnode_router_port": "{{ no_such_variable }}"}, "yaml")
    r = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "check", str(inv)], capture_output=True, text=True,
                       check=False, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "pdnode_router_port" in r.stderr, r.stderr
    assert "no_such_variable" in r.stderr and "Traceback" not in r.stderr
