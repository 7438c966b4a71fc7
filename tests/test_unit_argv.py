"""No value into a command line (issue 17, section 4): the argv systemd itself parses from
every rendered unit is the plan's argv, value for value.

A host once reached the router unit's ExecStartPost= unquoted: Python's ip_address takes
any text after an IPv6 zone id's '%', systemd splits an Exec line at a lone ';' and runs a
next command prefixed '+' as root, and `systemd-analyze verify` checks only the first
command. Now every host field refuses zone ids (tests/test_plan_hostile.py) and every
value reaches an Exec*= line through one filter, pdnode_exec_line (double quotes, '\\' and
'"' escaped, '%' and '$' doubled). This test holds the result to real systemd:

- the units of every host of every example inventory (inventories/*), and of plans
  whose host, path, name and environment fields hold fuzzed values: each value is
  either refused by the plan (`pdnode check`) or lands in its unit, where systemd reads
  back exactly the plan's argv (ExecStart=, ExecStartPre=, ExecStartPost=), user,
  environment file and description;
- the firewall unit and the DCGM exporter drop-in, the other templates with Exec lines;
- pdnode_exec_line itself on hostile arguments (';', '+sh', '$HOME', '%n', quotes,
  backslashes, '\\x2f', control characters), started for real: the process gets them.

The units are rendered by Ansible's own template engine (one ansible-playbook run on
localhost: the role's files with their templates, as the deploy renders them), loaded into systemd 252
as PID 1 in one container of the project's substrate image (scripts/substrate) with one
daemon-reload, and read back over D-Bus (busctl --json: `systemctl show` joins argv with
spaces, so it cannot show where an argument ends). Docker is part of the toolchain
(scripts/setup installs it): without it this test fails, it does not skip.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from planvars import changed

from pdnode.core.inventory.read import inventory_hosts, inventory_variables
from pdnode.core.plan.build import PlanError, build_plan
from pdnode.core.plan.roles import firewall as firewall_role
from pdnode.node.unitcheck import exec_line

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
# Every example inventory that describes a layout (h200-single is a preflight-only host:
# one GPU, no plan).
INVENTORIES = sorted(p for p in (ROOT / "inventories").iterdir() if (p / "hosts.yml").is_file()
                     and any("pdnode_prefill_instances:" in f.read_text() for f in p.rglob("*.yml")))
CONTAINER = f"pdnode-unit-argv-{os.getpid()}"
READY_TIMEOUTS = (1800, 60)  # pd_services_ready_timeout_s: the default and the demo's

# --- fuzzed values ------------------------------------------------------------------------
# Fragments that mean something to systemd, a shell, a URL or a terminal, and plain ones.
FRAGMENTS = ["", " ", ";", " ; ", "\"", "'", "\\", "\\x2f", "$", "$HOME", "${HOME}", "$$", "%", "%n", "%%",
             "+", "-", "@", "!", ":", "&", "|", "`id`", "$(id)", ">", "*", "?", "~", "#", "=", ",", "/", ".",
             "..", "\t", "\n", "\x7f", "\u00e9", "\u00a0", "\u2028", "A", "_", "0"]
RANDOM_ALPHABET = ("abcXYZ019._-/:@+=,%$;\"'\\ !&|<>(){}[]*?~#\t\n\u00e9")
ZONE_PAYLOAD = '::%a --help ; +sh -c "id > pwned" ; echo x'


def _shapes(kind: str, frag: str) -> list[str]:
    return {
        "host": [frag, f"::1{frag}", f"::1%{frag}", f"127.0.0.1{frag}", f"node{frag}x", f"{frag}::"],
        "path": [frag, f"/opt/a{frag}b", f"/opt/{frag}", f"/srv/x{frag}/y"],
        "name": [frag, f"a{frag}", f"a{frag}b"],
        "value": [frag, f"a{frag}b"],
    }[kind]


PLAUSIBLE = {
    "host": ["::", "::1", "0.0.0.0", "127.0.0.1", "127.0.0.2", "localhost", "node-1.example", "fd00::1", "10.0.0.1",
             "fe80::1", ZONE_PAYLOAD, "::1%lo", "fe80::2%eth0"],
    "path": ["/opt/sglang-pd2", "/srv/a.b_c-d/e", "/etc/pd-x", "/var/lib/pd/x", "/data/m-1.5_b"],
    "name": ["a", "pd-2", "_x", "a1", "x-y"],
    "value": ["1", "a,b:c/d@e+f=g-h", "10.0.0.1", "mlx5_0,mlx5_1"],
}
# field -> (kind, the variables it sets from a value); "pair": a host of inventories/gpu-pair
FUZZED: dict[str, tuple[str, Any]] = {
    "pdnode_router_host": ("host", lambda v: {"pdnode_router_host": v}),
    "pdnode_router_metrics_host": ("host", lambda v: {"pdnode_router_metrics_host": v}),
    "pdnode_worker_host": ("host", lambda v: {"pdnode_worker_host": v}),
    "pdnode_node_address": ("host", "pair"),
    "pdnode_install_root": ("path", lambda v: {"pdnode_install_root": v}),
    "pdnode_config_dir": ("path", lambda v: {"pdnode_config_dir": v}),
    "pdnode_model_path": ("path", lambda v: {"pdnode_model_path": v}),
    "pdnode_api_key_file": ("path", lambda v: {"pdnode_api_key_file": v}),
    "pdnode_service_prefix": ("name", lambda v: {"pdnode_service_prefix": v}),
    "pdnode_service_user": ("name", lambda v: {"pdnode_service_user": v}),
    "pdnode_model_served_name": ("name", lambda v: {"pdnode_model_served_name": v}),
    "pdnode_prefill_instances[0].name": ("name", lambda v: {"prefill[0]": {"name": v}}),
    "pdnode_engine_environment (value)": ("value", lambda v: {"pdnode_engine_environment": {"X_Y": v}}),
    "pdnode_engine_environment (name)": ("value", lambda v: {"pdnode_engine_environment": {v: "1"}}),
}


def candidates(kind: str, seed: str) -> list[str]:
    """Every fragment in every shape of the field, the plausible values, and 24 random
    strings (seeded: the same values on every run)."""
    rng = random.Random(f"issue-17-{seed}")  # noqa: S311 - reproducible test values, not secrets
    found = [s for frag in FRAGMENTS for s in _shapes(kind, frag)] + PLAUSIBLE[kind]
    prefix = {"host": ["", "::1", "127.0.0."], "path": ["/opt/", "/srv/a"], "name": ["", "a"], "value": ["", "a"]}[kind]
    found += [rng.choice(prefix) + "".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(1, 12)))
              for _ in range(24)]
    return list(dict.fromkeys(found))


@dataclass
class Case:
    name: str  # also the file name of its rendered files
    plan: dict[str, Any]
    timeout: int
    source: str  # what it proves: an inventory host, or a fuzzed field and its value
    units: dict[str, str] = field(default_factory=dict)  # unit name in the container -> service id


@dataclass
class Fuzz:
    accepted: dict[str, list[str]] = field(default_factory=dict)
    refused: dict[str, list[str]] = field(default_factory=dict)


def _inventory_cases() -> list[Case]:
    cases = []
    for inv in INVENTORIES:
        peers = inventory_variables(inv)
        for host in inventory_hosts(inv):
            plan = build_plan(peers[host], host, peers).as_dict()  # every example inventory is valid
            cases.append(Case(f"inv-{inv.name}-{host}", plan, READY_TIMEOUTS[len(cases) % 2], f"{inv.name}/{host}"))
    return cases


def _merge(changes: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict):
            changes.setdefault(key, {}).update(value)
        else:
            changes[key] = value


def _fuzz_cases() -> tuple[list[Case], Fuzz]:
    """Each candidate alone through the plan (refused or accepted); then the accepted ones
    in as few plans as hold them: plan k carries the k-th accepted value of every field
    at once (a combination the plan refuses is split into one plan per value)."""
    gpu01 = inventory_variables(ROOT / "inventories" / "gpu01")["gpu01"]
    pair = inventory_variables(ROOT / "inventories" / "gpu-pair")

    def plan_of(changes: dict[str, Any], address: str | None = None) -> dict[str, Any]:
        if address is None:
            return build_plan(changed(gpu01, changes), "gpu01").as_dict()
        peers = {**pair, "gpu01": changed(pair["gpu01"], {"pdnode_node_address": address})}
        return build_plan(peers["gpu01"], "gpu01", peers).as_dict()

    fuzz = Fuzz()
    for name, (kind, vary) in FUZZED.items():
        fuzz.accepted[name], fuzz.refused[name] = [], []
        for value in candidates(kind, name):
            try:
                plan_of(vary(value)) if vary != "pair" else plan_of({}, value)
            except PlanError as exc:
                assert exc.problems, value
                fuzz.refused[name].append(value)
            else:
                fuzz.accepted[name].append(value)
    cases: list[Case] = []

    def add(plan: dict[str, Any], source: str) -> None:
        n = len(cases)
        cases.append(Case(f"fuzz-{n:04d}", plan, READY_TIMEOUTS[n % 2], source))

    single = [n for n, (_, vary) in FUZZED.items() if vary != "pair"]
    for k in range(max(len(fuzz.accepted[n]) for n in single)):
        picked = {n: fuzz.accepted[n][k % len(fuzz.accepted[n])] for n in single}
        changes: dict[str, Any] = {}
        for n, value in picked.items():
            _merge(changes, FUZZED[n][1](value))
        try:
            add(plan_of(changes), ", ".join(f"{n}={v!r}" for n, v in picked.items()))
        except PlanError:
            for n, value in picked.items():
                add(plan_of(FUZZED[n][1](value)), f"{n}={value!r}")
    for value in fuzz.accepted["pdnode_node_address"]:
        add(plan_of({}, value), f"pdnode_node_address={value!r}")
    return cases, fuzz


# --- the hostile arguments pdnode_exec_line must carry through -------------------------------
HOSTILE_ARGV = ["/usr/bin/python3", "-c",
                "import json, sys; open('/run/pdnode-argv.json', 'w').write(json.dumps(sys.argv[1:]))",
                ";", "+/bin/sh", "-c", "touch /run/pwned", " ; ", "$HOME", "${HOME}", "$$", "a$", "%n", "%%", "%",
                '"', "'", "\\", "\\x2f", "back\\slash\\", "tab\there", "new\nline", "", " ", "\u00e9\u2028",
                ZONE_PAYLOAD, "http://[::1%25lo]:8000/readiness"]


# --- Docker and the substrate image -----------------------------------------------------------
def _run(argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _substrate() -> dict[str, str]:
    """The container flags for systemd (scripts/substrate --print-env); the image is
    built when missing (scripts/substrate, cached)."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.fail("docker is not installed: scripts/setup installs it (this test needs a systemd container)")
    env = {}
    out = _run([str(ROOT / "scripts/substrate"), "--print-env"], timeout=60)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        m = re.match(r"^export (PDNODE_MOLECULE_\w+)=(.*)$", line)
        if m:
            env[m.group(1)] = m.group(2)
    if _run([docker, "image", "inspect", env["PDNODE_MOLECULE_IMAGE"]], timeout=60).returncode != 0:
        built = _run([str(ROOT / "scripts/substrate")], timeout=1800)
        assert built.returncode == 0, f"scripts/substrate failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    return env


def _start_container(env: dict[str, str]) -> None:
    flags = ["--cgroupns", env["PDNODE_MOLECULE_CGROUPNS"], "-v", env["PDNODE_MOLECULE_CGROUP_MOUNT"],
             "--tmpfs", "/run", "--tmpfs", "/run/lock", "--stop-signal", "SIGRTMIN+3"]
    flags += ["--privileged"] if env["PDNODE_MOLECULE_PRIVILEGED"] == "true" else ["--cap-add", "SYS_ADMIN"]
    started = _run(["docker", "run", "-d", "--rm", "--name", CONTAINER, *flags, env["PDNODE_MOLECULE_IMAGE"],
                    "/sbin/init"], timeout=180)
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 180  # a busy 2-core machine boots it in seconds, not minutes
    state = ""
    while time.monotonic() < deadline:
        state = _run(["docker", "exec", CONTAINER, "systemctl", "is-system-running"], timeout=60).stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(0.5)
    pytest.fail(f"systemd in {CONTAINER} did not come up within 180 s (state {state!r})")


# What the container runs: every unit's properties over D-Bus, one JSON line per unit.
QUERY = r"""
import json, subprocess, sys

def path(unit):
    # sd_bus_path_encode: letters stay, digits too after the first character
    return "/org/freedesktop/systemd1/unit/" + "".join(
        c if c.isascii() and (c.isalpha() or (i and c.isdigit())) else "_%02x" % ord(c) for i, c in enumerate(unit))

def get(unit, iface, *props):
    out = subprocess.run(["busctl", "--json=short", "get-property", "org.freedesktop.systemd1", path(unit),
                          "org.freedesktop.systemd1." + iface, *props], capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr.strip()}
    # one JSON document per line ('\n' only: an argument may hold U+2028, a line break to splitlines)
    return dict(zip(props, (json.loads(line)["data"] for line in out.stdout.rstrip("\n").split("\n"))))

for unit in json.load(sys.stdin):
    row = {"unit": unit}
    row.update(get(unit, "Unit", "LoadState", "Description"))
    row.update(get(unit, "Service", "ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload", "ExecStop",
                   "ExecStopPost", "ExecCondition", "User", "EnvironmentFiles"))
    print(json.dumps(row))
"""


# Cases per play. Ansible's cost per loop item grows with the size of the play's variables,
# so one play over all the plans costs the square of their number: 47 cases took 74 s of
# CPU in one play, about 20 s in plays of this size (4 or 2 per play: no faster).
CASES_PER_PLAY = 8


def _render(cases: list[Case], firewall: list[str], dcgm: list[str], tmp: Path) -> dict[str, dict[str, str]]:
    """One ansible-playbook run on localhost: the files the pd_services role writes for each
    plan (its _pd_services_files), the firewall unit of each prefix, the DCGM drop-in of each
    listen address, through ansible.builtin.template with the roles' defaults and vars."""
    out = tmp / "rendered"
    out.mkdir()
    roles = ROOT / "roles"
    var_files = [roles / "pd_services/defaults/main.yml", roles / "pd_services/vars/main.yml",
                 roles / "monitoring/defaults/main.yml",
                 roles / "monitoring/vars/main.yml"]
    templates = {"firewall": roles / "firewall/templates/firewall.service.j2",
                 "dcgm": roles / "monitoring/templates/dcgm-exporter.conf.j2"}

    def collect(what: str, loop: str, more: dict) -> dict:
        # debug runs on the controller: one template lookup per item, no module run; the
        # texts come back in the registered results, in loop order
        # the pd_services role's files: its own definition (vars/main.yml), its templates found
        # beside the play as they are found beside the role's tasks
        text = "{{ _pd_services_files }}" if what == "files" else \
            "{{ lookup('ansible.builtin.template', '" + str(templates[what]) + "') }}"
        return {"name": f"Render {what}",
                "ansible.builtin.debug": {"msg": text},
                "loop": "{{ " + loop + " }}", "loop_control": {"loop_var": "pdnode_item", "label": "{{ pdnode_item }}"
                                                                if what != "files" else "{{ pdnode_item.name }}"},
                "vars": more, "register": f"pdnode_{what}"}

    def write(results: str, dest: Path) -> dict:
        return {"name": "Write what was rendered", "ansible.builtin.copy": {
            "content": "{{ " + results + " | to_json }}", "dest": str(dest), "mode": "0600"}}

    files_task = collect("files", "pdnode_cases", {"pd_services_plan": "{{ pdnode_item.plan }}",
                                                   "pd_services_ready_timeout_s": "{{ pdnode_item.timeout }}"})
    chunks = [cases[i:i + CASES_PER_PLAY] for i in range(0, len(cases), CASES_PER_PLAY)]
    play = []
    for k, chunk in enumerate(chunks):
        (tmp / f"cases-{k}.json").write_text(json.dumps(
            {"pdnode_cases": [{"name": c.name, "plan": c.plan, "timeout": c.timeout} for c in chunk]}))
        play.append({"name": f"Render the units of cases {k * CASES_PER_PLAY}+ as the role does", "hosts": "localhost",
                     "connection": "local", "gather_facts": False,
                     "vars_files": [str(p) for p in var_files] + [str(tmp / f"cases-{k}.json")],
                     "tasks": [files_task, write("pdnode_files.results | map(attribute='msg') | list",
                                                 out / f"files-{k}.json")]})
    (tmp / "others.json").write_text(json.dumps({"pdnode_firewall_views": [firewall_role.names(p) for p in firewall],
                                                   "pdnode_dcgm_addresses": dcgm}))
    play.append({
        "name": "Render the firewall and DCGM units as the roles do", "hosts": "localhost", "connection": "local",
        "gather_facts": False, "vars_files": [str(p) for p in var_files] + [str(tmp / "others.json")],
        "tasks": [
            collect("firewall", "pdnode_firewall_views", {"firewall_view": "{{ pdnode_item }}"}),
            collect("dcgm", "pdnode_dcgm_addresses", {"monitoring_dcgm_exporter_listen_address": "{{ pdnode_item }}"}),
            write("{'firewall': pdnode_firewall.results | map(attribute='msg') | list, "
                  "'dcgm': pdnode_dcgm.results | map(attribute='msg') | list}", out / "others.json"),
        ]})
    (tmp / "render.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    (tmp / "templates").symlink_to(roles / "pd_services/templates")
    ansible = Path(sys.executable).parent / "ansible-playbook"
    env = {**os.environ, "ANSIBLE_FILTER_PLUGINS": str(ROOT / "plugins/filter"), "ANSIBLE_LOCALHOST_WARNING": "0",
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".venv" / "collections"),
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
           "ANSIBLE_DISPLAY_OK_HOSTS": "false", "ANSIBLE_NOCOLOR": "1"}
    r = _run([str(ansible), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
              str(tmp / "render.yml")], timeout=900, env=env, cwd=tmp)
    assert r.returncode == 0, f"rendering failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    files = [text for k in range(len(chunks)) for text in json.loads((out / f"files-{k}.json").read_text())]
    others = json.loads((out / "others.json").read_text())
    assert [len(files), len(others["firewall"]), len(others["dcgm"])] == [len(cases), len(firewall), len(dcgm)]
    return {"files": dict(zip([c.name for c in cases], files)),
            "firewall": dict(zip(firewall, others["firewall"])),
            "dcgm": dict(zip(map(str, range(len(dcgm))), others["dcgm"]))}


@dataclass
class Loaded:
    cases: list[Case]
    fuzz: Fuzz
    props: dict[str, dict[str, Any]]  # container unit name -> what systemd read
    firewall: list[str]
    dcgm: list[str]
    hostile_run: list[str] | None


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> Loaded:
    env = _substrate()
    tmp = tmp_path_factory.mktemp("unit-argv")
    fuzz_cases, fuzz = _fuzz_cases()
    cases = _inventory_cases() + fuzz_cases
    prefixes = sorted({c.plan["install"]["prefix"] for c in cases})
    dcgm = ["127.0.0.1:9400", "[::1]:9400", "node-1.example:65535"]
    rendered = _render(cases, prefixes, dcgm, tmp)
    units = tmp / "units"
    units.mkdir()
    for i, case in enumerate(cases):
        for f in rendered["files"][case.name]:
            name = Path(f["path"]).name
            sid = next((s for s, svc in case.plan["services"].items() if svc["unit"] == name), None)
            if sid is not None:  # the service units (the target and drop-ins have no Exec line)
                loaded_as = f"z{i:04d}-{name}"
                (units / loaded_as).write_text(f["content"])
                case.units[loaded_as] = sid
    for prefix, text in rendered["firewall"].items():
        (units / f"firewall-{prefix}.service").write_text(text)
    for index, text in rendered["dcgm"].items():
        (units / f"dcgm-{index}.service").write_text(text)
    (units / "hostile-argv.service").write_text(
        "[Service]\nType=oneshot\nExecStart=" + exec_line(HOSTILE_ARGV, sep=" \\\n    ") + "\n")
    _start_container(env)
    try:
        cp = _run(["docker", "cp", f"{units}/.", f"{CONTAINER}:/etc/systemd/system/"], timeout=300)
        assert cp.returncode == 0, cp.stderr
        reload = _run(["docker", "exec", CONTAINER, "systemctl", "daemon-reload"], timeout=300)
        assert reload.returncode == 0, reload.stderr
        names = sorted(p.name for p in units.iterdir())
        q = _run(["docker", "exec", "-i", CONTAINER, "python3", "-c", QUERY], input=json.dumps(names), timeout=900)
        assert q.returncode == 0, q.stderr
        props = {row["unit"]: row for row in map(json.loads, q.stdout.rstrip("\n").split("\n"))}
        started = _run(["docker", "exec", CONTAINER, "systemctl", "start", "hostile-argv.service"], timeout=120)
        got = _run(["docker", "exec", CONTAINER, "cat", "/run/pdnode-argv.json"], timeout=60)
        hostile_run = json.loads(got.stdout) if started.returncode == 0 and got.returncode == 0 else None
        pwned = _run(["docker", "exec", CONTAINER, "test", "-e", "/run/pwned"], timeout=60).returncode == 0
        assert not pwned, "a hostile argument ran a command"
    finally:
        _run(["docker", "rm", "-f", CONTAINER], timeout=120)
    return Loaded(cases, fuzz, props, prefixes, dcgm, hostile_run)


# --- what systemd read, against the plan ---------------------------------------------------
def at_exec(arg: str) -> str:
    """An argument as the process gets it: systemd replaces '$$' by '$' when it starts the
    command (and $NAME/${NAME} by the environment: none may remain)."""
    out, i = [], 0
    while i < len(arg):
        if arg[i] == "$":
            assert arg[i + 1:i + 2] == "$", f"systemd would substitute an environment variable in {arg!r}"
            i += 1
        out.append(arg[i])
        i += 1
    return "".join(out)


def commands(prop: list) -> list[list[str]]:
    """a(sasbttttuii) -> the argv of each command (path must be argv[0], none ignored)."""
    assert all(path == argv[0] and ignore is False for path, argv, ignore, *_ in prop), prop
    return [[at_exec(a) for a in argv] for _, argv, *_ in prop]


def expected(case: Case, sid: str) -> dict[str, Any]:
    svc, install = case.plan["services"][sid], case.plan["install"]
    return {
        "LoadState": "loaded",
        "Description": f"SGLang PD {sid} ({case.plan['settings']['pdnode_model_served_name']})",
        "ExecStart": [svc["exec"]],
        "ExecStartPre": [],
        # the readiness gate runs from the service's own venv (the router has one of its own)
        "ExecStartPost": [[install["router_python"] if svc["role"] == "router" else install["python"], "-m",
                           "pdnode.node.ready", "--timeout", str(case.timeout), *svc["ready"]]],
        # the router's reconcile at start, its failure ignored ('-': the router stays up)
        "ExecStartPost ignoring failure": [svc["post_start"]] if "post_start" in svc else [],
        "ExecCondition": [], "ExecReload": [], "ExecStop": [], "ExecStopPost": [],
        "User": install["user"],
        "EnvironmentFiles": [[svc["env_file"], False]],
    }


def read(props: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in props, props
    return {"LoadState": props["LoadState"], "Description": props["Description"],
            "ExecStart": commands(props["ExecStart"]), "ExecStartPre": commands(props["ExecStartPre"]),
            "ExecStartPost": commands([c for c in props["ExecStartPost"] if c[2] is False]),
            "ExecStartPost ignoring failure": commands([(path, argv, False, *rest)
                                                        for path, argv, ignore, *rest in props["ExecStartPost"]
                                                        if ignore is True]),
            **{k: commands(props[k]) for k in ("ExecCondition", "ExecReload", "ExecStop", "ExecStopPost")},
            "User": props["User"],
            "EnvironmentFiles": props["EnvironmentFiles"]}


def _check_cases(loaded: Loaded, cases: list[Case]) -> int:
    checked = 0
    for case in cases:
        assert case.units, f"{case.source}: no unit rendered"
        for unit, sid in case.units.items():
            assert read(loaded.props[unit]) == expected(case, sid), f"{case.source}: {unit}"
            checked += 1
    return checked


def test_every_unit_of_every_example_inventory_runs_the_plans_argv(loaded):
    cases = [c for c in loaded.cases if c.name.startswith("inv-")]
    assert {c.source.split("/")[0] for c in cases} == {p.name for p in INVENTORIES}
    checked = _check_cases(loaded, cases)
    assert checked >= 3 * len(INVENTORIES)
    print(f"\n{checked} units of {len(cases)} hosts in {len(INVENTORIES)} inventories: systemd's argv is the plan's")


def test_a_fuzzed_value_is_refused_or_lands_as_the_plan_says(loaded):
    fuzz = loaded.fuzz
    for name in FUZZED:
        # each field saw values of both kinds: the test exercises the field, not only its refusals
        assert fuzz.accepted[name] and fuzz.refused[name], (name, fuzz.accepted[name][:5], fuzz.refused[name][:5])
    checked = _check_cases(loaded, [c for c in loaded.cases if c.name.startswith("fuzz-")])
    for name in ("pdnode_router_host", "pdnode_router_metrics_host", "pdnode_worker_host", "pdnode_node_address"):
        assert ZONE_PAYLOAD in fuzz.refused[name] and not [v for v in fuzz.accepted[name] if "%" in v], name
    refused = sum(map(len, fuzz.refused.values()))
    accepted = sum(map(len, fuzz.accepted.values()))
    print(f"\nfuzzed {refused + accepted} values in {len(FUZZED)} fields: {refused} refused by check, {accepted} "
          f"accepted and landed as planned ({checked} units)")


def test_the_firewall_and_dcgm_exec_lines_are_what_the_roles_mean(loaded):
    for prefix in loaded.firewall:
        props = loaded.props[f"firewall-{prefix}.service"]
        assert props["LoadState"] == "loaded", props
        rules = ["/usr/sbin/nft", "-f", f"/etc/{prefix}-firewall.nft"]
        assert commands(props["ExecStart"]) == [rules] and commands(props["ExecReload"]) == [rules], props
        stop = props["ExecStop"]  # '-': a table already gone is not a failed stop
        assert [(argv, ignore) for _, argv, ignore, *_ in stop] == [
            (["/usr/sbin/nft", "delete", "table", "inet", prefix.replace("-", "_") + "_pdnode"], True)], stop
    for i, address in enumerate(loaded.dcgm):
        props = loaded.props[f"dcgm-{i}.service"]
        assert commands(props["ExecStart"]) == [["/usr/bin/dcgm-exporter", "-f", "/etc/dcgm-exporter/pdnode-counters.csv",
                                                 "-a", address, "-r", "127.0.0.1:5555"]], props


def test_pdnode_exec_line_carries_hostile_arguments_through_systemd(loaded):
    """Quoted by the one function the templates use: systemd parses the argv unchanged
    (one command: no ';' split, no '+' command), and the started process gets it."""
    props = loaded.props["hostile-argv.service"]
    assert commands(props["ExecStart"]) == [HOSTILE_ARGV], props
    assert loaded.hostile_run == HOSTILE_ARGV[3:], loaded.hostile_run
