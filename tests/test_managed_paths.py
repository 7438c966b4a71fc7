"""The plan's list of managed paths (`managed`, pdnode.core.plan.managed) is what the deploy's
roles write (issue 27, item 6): a fast path sees only what it reads, and the node
scenario's drift matrix (molecule/node/tests/test_drift_matrix.py) generates its cases
from this list, so a path a role writes but the list lacks would be a drift nobody
plants and no read looks at.

Every task of the sglang and pd_services roles that writes a path (copy, template, file,
unarchive, pip, the files module, a command running one of the role's own scripts) is
found in the roles' task files, and the paths it writes are rendered by Ansible's own
template engine (one ansible-playbook run on localhost, with the role variables
deploy.yml hands them) for the plan of every host of every example inventory; the
result must be the plan's list, path for path, with the same mode, owner and group. Each
managed path is also judged on every run: by the role's one read (node_state) or by the
files module, which judges every file it writes each time. A writer that writes what the
plan cannot name is listed below with the reason; the list must not go stale.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdnode.core.inventory.read import inventory_hosts, inventory_variables
from pdnode.core.plan.managed import ASPECTS
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("sglang", "pd_services")
INVENTORIES = sorted(p for p in (ROOT / "inventories").iterdir() if (p / "hosts.yml").is_file()
                     and any("pdnode_prefill_instances:" in f.read_text() for f in p.rglob("*.yml")))
# Modules that write a path, and the argument that names it.
WRITERS = {"copy": "dest", "template": "dest", "file": "path", "unarchive": "dest", "pip": "virtualenv",
           "lineinfile": "path", "blockinfile": "path", "get_url": "dest", "pd_services_files": "files"}
# A command that runs one of the role's own scripts (files/<name>.py on its stdin).
SCRIPT = re.compile(r"lookup\('ansible\.builtin\.file', '([\w.-]+\.py)'\)")
# Writers of paths the plan cannot name, (role, task name) -> why.
NOT_IN_THE_PLAN = {
    ("sglang", "Install pinned packages into the release virtualenv"):
        "the venv's packages: the install, judged as a whole by the venv's marker",
    ("sglang", "Install the router package into the router's virtualenv"):
        "the router venv's packages: judged as a whole by its marker",
    ("sglang", "Copy the pdnode bundle to the host"):
        "the bundle's tarball is named by the bundle's checksum, known only at deploy (the read finds it by name)",
    ("sglang", "Install the bundle into the release and the router virtualenvs"):
        "the bundle unpacked into each venv and its pdnode.pth: judged by the read's bundle checks",
}


def _tasks(items: list[dict[str, Any]] | None):
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def _module(task: dict[str, Any]) -> tuple[str, Any] | None:
    for key, args in task.items():
        short = key.rsplit(".", 1)[-1]
        if short in WRITERS:
            return short, args
        if short in ("command", "shell") and isinstance(args, dict) and SCRIPT.search(str(args.get("stdin", ""))):
            return "script", args
    return None


def writers() -> list[dict[str, Any]]:
    """Every task of the two roles that writes a path: role, name, module, its arguments."""
    found = []
    for role in ROLES:
        for where in ("tasks", "handlers"):
            for path in sorted((ROOT / "roles" / role / where).glob("*.yml")):
                for task in _tasks(yaml.safe_load(path.read_text())):
                    module = _module(task)
                    if module:
                        found.append({"role": role, "name": task["name"], "module": module[0], "args": module[1],
                                      "loop": task.get("loop"), "vars": task.get("vars") or {},
                                      "when": task.get("when"), "file": f"{role}/{where}/{path.name}"})
    return found


def reads() -> list[dict[str, Any]]:
    """The roles' node_state reads: their files and directories arguments."""
    out = []
    for role in ROLES:
        for task in _tasks(yaml.safe_load((ROOT / "roles" / role / "tasks/main.yml").read_text())):
            args = next((a for k, a in task.items() if k.endswith("node_state")), None)
            if args is not None:
                out.append({"role": role, "files": args.get("files", []), "directories": args.get("directories", [])})
    return out


def plans() -> dict[str, dict[str, Any]]:
    """The plan of every host of every example inventory; the demo's also with an API key
    (the node scenario's)."""
    out = {}
    for inv in INVENTORIES:
        peers = inventory_variables(inv)
        for host in inventory_hosts(inv):
            out[f"{inv.name}/{host}"] = build_plan(peers[host], host, peers).as_dict()
    demo = inventory_variables(ROOT / "inventories/demo")
    host = next(iter(demo))
    out["demo/api-key"] = build_plan({**demo[host], "pdnode_api_key_file": "molecule/node/files/test-api-key"}, host,
                                     demo).as_dict()
    return out


ITEM_FIELD = re.compile(r"^\{\{ *item\.(\w+) *\}\}$")


def _message(w: dict[str, Any]) -> tuple[Any, str | None]:
    """What writer W writes, as a debug message (its path argument and its mode and owners,
    templated as the role's task templates them), and the expression of its own loop."""
    args = w["args"]
    if w["module"] == "pd_services_files":
        return {"files": args["files"], "secrets": args.get("secrets", []), "inputs": args.get("inputs", []),
                "applied_dir": args.get("applied_dir", "")}, None
    if w["module"] == "script":
        return args["argv"], None
    msg = {"path": args[WRITERS[w["module"]]], **{k: args[k] for k in ("mode", "owner", "group") if k in args}}
    if w["loop"] is None:
        return msg, None
    # a loop over entries ("{{ item.path }}", "{{ item.mode }}", ...): the entries are rendered,
    # and each field taken from them here
    fields = {k: ITEM_FIELD.match(str(v)) for k, v in msg.items()}
    assert all(fields.values()), f"{w['file']}: {w['name']}: a looped writer this test cannot render: {msg}"
    return {k: m.group(1) for k, m in fields.items()}, w["loop"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{plan name: {"plan": plan, "writers": [...], "reads": [...], "out": what each wrote}}."""
    tmp = tmp_path_factory.mktemp("managed")
    all_plans = plans()
    names = sorted(all_plans)
    found = [w for w in writers() if (w["role"], w["name"]) not in NOT_IN_THE_PLAN]
    found_reads = reads()
    deploy = yaml.safe_load((ROOT / "playbooks/deploy.yml").read_text())[0]
    role_vars = {}
    for entry in deploy["roles"]:
        role_vars.update(entry.get("vars", {}))
    per_plan = {
        **role_vars, "_pdnode_plan": "{{ plan_item }}",
        # paths only: no wheelhouse's stamp; a key file named where the plan has a key
        "_pdnode_wh": "", "_pdnode_key": "{{ 'key' if plan_item.settings.pdnode_api_key_file else '' }}",
        "__sglang_bundle_sha256": "0" * 64,
        # every task judging, on a host where every read found everything different: each
        # writer's condition then says only whether the plan has what it writes (a router, a key)
        "pd_services_fast_path": False, "sglang_fast_path": False,
        "sglang_release_changed": True, "sglang_router_release_changed": True,
        "__sglang_state": {"read": {}, "drift": [], "found": {}, "commands": {}}}
    # the role's own definitions (vars/main.yml), its templates found beside the play as
    # they are found beside the role's tasks
    (tmp / "templates").symlink_to(ROOT / "roles/pd_services/templates")
    # One task per writer (and per read), each over every plan: its message per plan, or
    # skipped where the writer's condition is false for that plan.
    tasks, seen, same = [], {}, {}
    for n, w in enumerate(found):
        msg, loop = _message(w)
        key = json.dumps([msg, loop, w["vars"], w["when"]], sort_keys=True)
        if w["module"] == "pd_services_files":  # the handler's record call: only records, of these files
            key = json.dumps([w["args"][k] for k in ("files", "inputs", "applied_dir")])
        if key in seen:  # the same paths as an earlier writer: rendered once (the template is slow)
            same[n] = seen[key]
            continue
        seen[key] = same[n] = n
        tasks.append({"name": f"writer {n}", "ansible.builtin.debug": {"msg": {"writes": msg, "loop": loop or []}},
                      "loop": "{{ pdnode_plans }}", "loop_control": {"loop_var": "plan_item"},
                      "vars": {**per_plan, **w["vars"]}, "register": f"__w{n}",
                      **({"when": w["when"]} if w["when"] is not None else {})})
    for n, r in enumerate(found_reads):
        tasks.append({"name": f"read {n}", "ansible.builtin.debug": {"msg": {"files": r["files"],
                                                                          "directories": r["directories"]}},
                      "loop": "{{ pdnode_plans }}", "loop_control": {"loop_var": "plan_item"},
                      "vars": per_plan, "register": f"__r{n}"})
    out = [f"'w{n}': __w{n}.results" for n in sorted(set(same.values()))] + [
        f"'r{n}': __r{n}.results" for n in range(len(found_reads))]
    tasks.append({"name": "Write what the writers write", "ansible.builtin.copy": {
        "content": "{{ {" + ", ".join(out) + "} | to_json }}", "dest": str(tmp / "out.json"), "mode": "0600"}})
    (tmp / "plans.json").write_text(json.dumps({"pdnode_plans": [all_plans[n] for n in names]}))
    files = [str(ROOT / "roles" / r / d / "main.yml") for r in ROLES for d in ("defaults", "vars")]
    play = [{"name": "Render", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars_files": [*files, str(tmp / "plans.json")], "tasks": tasks}]
    (tmp / "render.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".venv" / "collections"),
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0", "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                        "-e", f"ansible_python_interpreter={sys.executable}", str(tmp / "render.yml")],
                       capture_output=True, text=True, env=env, cwd=tmp, timeout=600, check=False)
    assert r.returncode == 0, f"rendering failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    results = json.loads((tmp / "out.json").read_text())
    cases = {}
    for i, name in enumerate(names):
        got = {}
        for n, w in enumerate(found):
            result = results[f"w{same[n]}"][i]
            if result.get("skipped"):
                got[f"w{n}"] = []
            elif w["loop"] is None:
                got[f"w{n}"] = [result["msg"]["writes"]]
            else:  # the fields of each entry the writer loops over
                got[f"w{n}"] = [{k: entry[f] for k, f in result["msg"]["writes"].items()}
                                for entry in result["msg"]["loop"]]
        got.update({f"r{n}": results[f"r{n}"][i]["msg"] for n in range(len(found_reads))})
        cases[name] = {"plan": all_plans[name], "writers": found, "reads": found_reads, "out": got}
    return cases


def written(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """path -> {role, mode, owner, group (as far as the writer names them), how}: what the
    two roles write for this plan, from their tasks as Ansible renders them."""
    out: dict[str, dict[str, Any]] = {}

    def put(path: str, role: str, how: str, **attrs: Any) -> None:
        assert path not in out or out[path]["role"] == role, (path, out[path], role)
        out.setdefault(path, {"role": role, "how": set()})["how"].add(how)
        out[path].update({k: v for k, v in attrs.items() if v is not None})

    for n, w in enumerate(case["writers"]):
        for got in case["out"][f"w{n}"]:  # one message per loop item (one without a loop)
            if w["module"] == "pd_services_files":
                readers = set()
                for spec in got["files"] + got["secrets"]:
                    put(spec["path"], w["role"], "files module", mode=spec["mode"], owner=spec.get("owner", "root"),
                        group=spec.get("group", "root"))
                    readers.update(spec.get("roles", []))
                readers.update(r for spec in got["inputs"] for r in spec["roles"])
                for reader in readers:  # the records of what each service was started with, as the
                    # module writes them (RECORD_MODE, the module's user: root on a host)
                    put(f"{got['applied_dir']}/{reader}.sha256", w["role"], "files module", mode="0600",
                        owner="root", group="root")
            elif w["module"] == "script":
                script = SCRIPT.search(str(w["args"]["stdin"])).group(1)
                assert script == "admin_key.py", f"{w['file']}: {w['name']} runs {script}, a writer this test does " \
                    "not know: render what it writes here, or say in NOT_IN_THE_PLAN why the plan cannot name it"
                path, owner, group, mode = got[2:6]
                put(path, w["role"], "admin_key.py", mode=mode, owner=owner, group=group)
            else:
                put(got["path"], w["role"], w["module"], **{k: got.get(k) for k in ("mode", "owner", "group")})
    return out


def test_every_path_the_roles_write_is_in_the_plans_list_with_its_mode_and_owners(rendered):
    checked = 0
    for name, case in rendered.items():
        plan = case["plan"]
        managed = {e["path"]: e for e in plan["managed"]}
        assert len(managed) == len(plan["managed"]), f"{name}: a path listed twice"
        paths = written(case)
        assert set(paths) == set(managed), (
            f"{name}: written but not in the plan's managed paths: {sorted(set(paths) - set(managed))}; "
            f"in the plan but written by no task: {sorted(set(managed) - set(paths))}")
        for path, w in paths.items():
            entry = managed[path]
            assert w["role"] == entry["role"], (name, path)
            for k in ("mode", "owner", "group"):
                if k in w:
                    assert str(w[k]) == entry[k], (name, path, k, w[k], entry[k])
            checked += 1
    print(f"\n{checked} written paths of {len(rendered)} plans are the plans' managed paths")


def test_every_managed_path_is_judged_on_every_run(rendered):
    """By the role's read (node_state: content where the plan knows it, mode, owner,
    group, presence), or by the files module, which judges every file it is given on
    every run; with the plan's mode and owners."""
    for name, case in rendered.items():
        plan = case["plan"]
        judged: dict[str, dict[str, Any]] = {}
        for n in range(len(case["reads"])):
            got = case["out"][f"r{n}"]
            for spec in got["files"] + got["directories"]:
                judged[spec["path"]] = spec
        by_files_module = {p for p, w in written(case).items() if "files module" in w["how"]}
        for e in plan["managed"]:
            if e["path"] in by_files_module:
                continue
            assert e["path"] in judged, f"{name}: {e['path']} is judged on no run (the fast path never reads it)"
            spec = judged[e["path"]]
            assert {k: spec.get(k, "root") for k in ("mode", "owner", "group")} == {
                k: e[k] for k in ("mode", "owner", "group")}, (name, e["path"])
            if "content" in e["restores"]:
                assert spec.get("sha256"), f"{name}: {e['path']}: its content is restored but not read"


def test_the_writers_the_plan_cannot_name_are_still_there():
    names = {(w["role"], w["name"]) for w in writers()}
    assert set(NOT_IN_THE_PLAN) <= names, sorted(set(NOT_IN_THE_PLAN) - names)


def test_each_entry_says_what_a_re_run_restores():
    every = plans()
    assert any(e["kind"] == "secret" and "content" in e["restores"] for p in every.values() for e in p["managed"])
    for name, plan in every.items():
        for e in plan["managed"]:
            assert e["restores"] and set(e["restores"]) <= set(ASPECTS), (name, e)
            # mode, owner and group of every path; content of every file but the host-made key
            # and the layout record (a changed one is refused: the plan read it first)
            assert {"mode", "owner", "group"} <= set(e["restores"]), (name, e["path"])
            if e["kind"] == "state":
                assert set(e["restores"]) == {"mode", "owner", "group", "presence"}, (name, e["path"])
            elif e["kind"] != "directory" and e["path"] != plan["install"]["admin_key_path"]:
                assert "content" in e["restores"] and "presence" in e["restores"], (name, e["path"])
