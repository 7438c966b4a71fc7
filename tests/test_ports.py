"""Every port of a node: allocated by the plan without collision (pdnode.core.rules.ports), and,
before anything starts, a port of the plan held by another process is named with its
owner (pid, command, unit); our own units may hold their ports (a re-deploy)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from planvars import DECODE_REPLICAS, changed, layout, variables

from pdnode.core.host import facts as hf
from pdnode.core.host import preflight as pf
from pdnode.node import preflight as node_pf  # the same port judgement, on the host
from pdnode.core.plan.build import PlanError, build_plan
from pdnode.core.rules.ports import DP_ATTENTION_OFFSETS

SRC = Path(__file__).resolve().parents[1] / "src"
OWN = ["sglang-pd-prefill-0.service", "sglang-pd-decode-0.service", "sglang-pd-router.service"]


def test_live_listener_is_named_with_pid_and_command(tmp_path):
    server = tmp_path / "srv.py"
    server.write_text("import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                      "print(s.getsockname()[1], flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, str(server), "--marker-arg"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        (p,) = node_pf.port_problems(node_pf.live_listeners(), {"decode-0.port": port}, OWN)
        assert p.check == f"port.{port}"
        assert f"pid {child.pid} " in p.line and "--marker-arg" in p.line, p.line
        assert "decode-0.port" in p.line
    finally:
        child.kill()
        child.wait()


def test_cli_one_line_per_taken_port_and_exit_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(SRC))
        r = subprocess.run([sys.executable, "-m", "pdnode.node.preflight", "ports", *(f"--own-unit={u}" for u in OWN),
                            f"router.port={port}", "prefill-0.port=1"],
                           capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ERROR port.{port}=") and f"pid {os.getpid()}" in lines[0]


def test_free_ports_pass():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert node_pf.port_problems(node_pf.live_listeners(), {"decode-0.port": free}, OWN) == []


def test_own_units_hold_their_ports_foreign_units_do_not():
    listeners = [
        {"address": "127.0.0.1", "port": 30001, "pid": 10, "unit": "sglang-pd-decode-0.service", "command": "python"},
        {"address": "0.0.0.0", "port": 8000, "pid": 11, "unit": "sglang-pd-old.service", "command": "x"},
        # fds unreadable (another user, no CAP_SYS_PTRACE): the uid runs only our units
        {"address": "127.0.0.1", "port": 30000, "pid": None, "unit": None, "uid": 997, "uid_units": OWN[:1]},
        {"address": "127.0.0.1", "port": 8998, "pid": None, "unit": None, "uid": 0,
         "uid_units": ["?", "ssh.service"]},
    ]
    ports = {"decode-0.port": 30001, "router.port": 8000, "prefill-0.port": 30000,
             "prefill-0.bootstrap_port": 8998}
    lines = [p.line for p in node_pf.port_problems(listeners, ports, OWN)]
    # Exact unit names: a unit that merely shares the prefix is not ours.
    assert lines == [
        "ERROR port.8000='0.0.0.0:8000': the port router.port needs is already in use (pid 11 'x', unit "
        "sglang-pd-old.service). Fix: stop that process or choose another port for router.port.",
        "ERROR port.8998='127.0.0.1:8998': the port prefill-0.bootstrap_port needs is already in use (owner "
        "unknown, uid 0). Fix: stop that process or choose another port for prefill-0.bootstrap_port.",
    ]


def test_preflight_names_the_command_from_its_probe():
    raw = {
        "tcp": {"rc": 0, "stdout": "  sl  local_address rem_address   st\n   0: 0100007F:7531 00000000:0000 0A "
                "00000000:00000000 00:00000000 00000000     0 0 501 1\n", "stderr": ""},
        "socket_fds": {"rc": 0, "stdout": "/proc/40/fd socket:[501]\n", "stderr": ""},
        "cgroups": {"rc": 0, "stdout": "/proc/40/cgroup:0::/system.slice/foreign.service\n", "stderr": ""},
    }
    facts = hf.collect(raw)
    facts["commands"] = "/proc/40/cmdline:python3\0-m\0http.server\0" + "30001\0\n/proc/41/cmdline:bash\0\n"
    exp = pf.expectations(None, {"ports": {"decode-0.port": 30001}, "own_unit_prefix": "sglang-pd",
                                 "require_systemd": False, "supported_os": ["x"]})
    (p,) = [p for p in pf.judge(facts, exp) if p.check.startswith("port.")]
    assert "(pid 40 'python3 -m http.server 30001', unit foreign.service)" in p.line


PROBE = "sglang-pd-pair-probe.service"


def test_expectations_take_the_plans_unit_names():
    plan = build_plan(variables("demo"))
    assert pf.expectations(plan.as_dict())["own_units"] == sorted([*OWN, PROBE])
    off = build_plan(changed(variables("demo"), {"pdnode_pair_probe_interval_s": 0}))
    assert pf.expectations(off.as_dict())["own_units"] == sorted(OWN)


def test_a_socket_of_the_service_user_is_ours_while_the_pair_probe_runs():
    """The probe's oneshot runs as the service user: while it runs (a timer, every minute),
    that uid runs the probe's unit too. A deploy's port check at that moment must still
    see the engines' sockets as ours (it failed a re-deploy: "owner unknown")."""
    plan = build_plan(variables("demo")).as_dict()
    listeners = [{"address": "127.0.0.1", "port": 30000, "pid": None, "unit": None, "uid": 997,
                  "uid_units": ["sglang-pd-prefill-0.service", PROBE]}]
    assert node_pf.port_problems(listeners, {"prefill-0.port": 30000}, pf.own_units(plan)) == []
    # a unit the plan does not run is still foreign
    listeners[0]["uid_units"].append("sglang-pd-old.service")
    assert len(node_pf.port_problems(listeners, {"prefill-0.port": 30000}, pf.own_units(plan))) == 1


@pytest.mark.parametrize("probe_s", [60, 0], ids=["probe", "no-probe"])
def test_the_deploys_port_check_names_the_same_own_units(probe_s, tmp_path):
    """pd_services passes --own-unit to `pdnode.node.preflight ports` through the
    collection's filter (roles/pd_services/vars/main.yml); Ansible, templating the role's
    variable, gives the units own_units gives the preflight."""
    plan = build_plan(changed(variables("demo"), {"pdnode_pair_probe_interval_s": probe_s})).as_dict()
    repo = Path(__file__).resolve().parents[1]
    role = repo / "roles" / "pd_services"
    (tmp_path / "plan.json").write_text(json.dumps({"pd_services_plan": plan}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
                        "-m", "ansible.builtin.debug", "-a", "var=_pd_services_view.ports_argv",
                        "-e", f"@{role / 'defaults' / 'main.yml'}", "-e", f"@{role / 'vars' / 'main.yml'}",
                        "-e", f"@{tmp_path / 'plan.json'}"],
                       capture_output=True, text=True, env=env, cwd=repo, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    argv = json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["_pd_services_view.ports_argv"]
    got = sorted(a.removeprefix("--own-unit=") for a in argv if a.startswith("--own-unit="))
    assert got == pf.own_units(plan) and (PROBE in got) == bool(probe_s)


# --- allocation (pdnode.core.rules.ports) -------------------------------------------------------

def _instances(count, first_gpu, gpus_each, attn_dp):
    return [{"gpus": list(range(first_gpu + i * gpus_each, first_gpu + (i + 1) * gpus_each)),
             **({"attn_dp_size": attn_dp} if attn_dp > 1 else {})} for i in range(count)]


def _xpyd(base, p, d, p_attn=1, d_attn=1, gpus_each=2):
    return layout(base, _instances(p, 0, gpus_each, p_attn), _instances(d, p * gpus_each, gpus_each, d_attn))


def _of(ports, service):
    return {k: v for k, v in ports.items() if k.startswith(service + ".")}


def _assert_collision_free(ports):
    """Every reserved port once; each DP-attention range clear of every other port."""
    assert len(set(ports.values())) == len(ports), ports
    for service in {k.split(".")[0] for k in ports}:
        if f"{service}.port+{DP_ATTENTION_OFFSETS[0]}" in ports:
            base = ports[f"{service}.port"]
            window = set(range(base + DP_ATTENTION_OFFSETS[0], base + DP_ATTENTION_OFFSETS[-1] + 1))
            foreign = {name: port for name, port in ports.items() if port in window and not name.startswith(service)}
            assert foreign == {}, (service, foreign)


def test_gpu01_gets_the_documented_ports(gpu01_vars):
    assert build_plan(gpu01_vars).ports == {
        "router.port": 8000, "router.metrics_port": 29000,
        "decode-0.port": 30001, **{f"decode-0.port+{o}": 30001 + o for o in DP_ATTENTION_OFFSETS},
        "decode-0.nccl_port": 31100,
        "prefill-0.port": 30000, "prefill-0.bootstrap_port": 8998, "prefill-0.nccl_port": 31000,
    }


def test_allocation_is_deterministic(host16):
    """The same description gives the same ports, in a fresh interpreter too (no random
    or hash-ordered choice: a re-deploy must not move a port)."""
    v = _xpyd(host16, 3, 2, p_attn=2, d_attn=2)
    first = build_plan(v).ports
    assert build_plan(v).ports == first
    code = ("import json, sys; from pdnode.core.plan.build import build_plan; "
            "print(json.dumps(build_plan(json.loads(sys.stdin.read())).ports))")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(v), capture_output=True, text=True,
                       cwd=SRC.parent, timeout=60, env=dict(os.environ, PYTHONHASHSEED="12345"), check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == first


@pytest.mark.parametrize("p_attn", [1, 2], ids=["prefill-tp", "prefill-dp-attention"])
@pytest.mark.parametrize("d_attn", [1, 2], ids=["decode-tp", "decode-dp-attention"])
def test_adding_a_prefill_never_moves_a_decode(host16, p_attn, d_attn):
    for p in range(1, 4):
        before = build_plan(_xpyd(host16, p, 4, p_attn, d_attn)).ports
        after = build_plan(_xpyd(host16, p + 1, 4, p_attn, d_attn)).ports
        for j in range(4):
            assert _of(after, f"decode-{j}") == _of(before, f"decode-{j}"), (p, j)
        for i in range(p):  # nor an existing prefill
            assert _of(after, f"prefill-{i}") == _of(before, f"prefill-{i}"), (p, i)


def test_adding_a_decode_moves_no_plain_prefill(host16):
    for d in range(1, 4):
        before = build_plan(_xpyd(host16, 4, d, 1, 2)).ports
        after = build_plan(_xpyd(host16, 4, d + 1, 1, 2)).ports
        for i in range(4):
            assert _of(after, f"prefill-{i}") == _of(before, f"prefill-{i}"), (d, i)


def test_explicit_ports_are_kept_and_allocation_goes_around_them(gpu01_vars):
    v = changed(gpu01_vars, {"decode[0]": {"port": 30000, "nccl_port": 31000},
                             "prefill[0]": {"bootstrap_port": 9100}})
    plan = build_plan(v)
    ports = plan.ports
    assert (ports["decode-0.port"], ports["decode-0.nccl_port"], ports["prefill-0.bootstrap_port"]) == (
        30000, 31000, 9100)
    # prefill's defaults (30000, 31000) are taken: the next of its own kind
    assert (ports["prefill-0.port"], ports["prefill-0.nccl_port"]) == (30010, 31010)
    assert plan.services["decode-0"]["args"]["port"] == 30000
    assert plan.services["router"]["args"]["prefill"] == [["http://127.0.0.1:30010", 9100]]
    _assert_collision_free(ports)


def test_an_allocated_decode_skips_a_given_port_in_its_dp_attention_range(gpu01_vars):
    """prefill's NCCL port given as 30236: decode's default 30001 would bind 30234..30240."""
    ports = build_plan(changed(gpu01_vars, {"prefill[0]": {"nccl_port": 30236}})).ports
    assert ports["decode-0.port"] == 30011
    _assert_collision_free(ports)


LAYOUTS = {
    "1P1D": lambda v: v,
    "2P1D": lambda v: variables("gpu01-2p1d"),
    "1P2D": lambda v: variables("gpu01-1p2d"),
    "4P4D-one-gpu-each": lambda v: _xpyd(v, 4, 4, gpus_each=1),
    "prefill-dp-attention": lambda v: changed(v, {"prefill[0]": {"attn_dp_size": 4}}),
    "2P2D-all-dp-attention": lambda v: _xpyd(v, 2, 2, 2, 2),
    "dp-replicas": lambda v: changed(v, {"decode[0]": DECODE_REPLICAS}),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_without_ports_get_collision_free_ones(gpu01_vars, name):
    plan = build_plan(LAYOUTS[name](gpu01_vars))
    _assert_collision_free(plan.ports)
    services = plan.engines()
    for s in services:  # what the services use is what was reserved
        assert plan.ports[f"{s['id']}.port"] == s["args"]["port"]
        if "nccl_port" in s["args"]:
            assert plan.ports[f"{s['id']}.nccl_port"] == s["args"]["nccl_port"]
    assert len(services) == len(plan.settings["pdnode_prefill_instances"]) + len(
        plan.settings["pdnode_decode_instances"])


def test_every_small_layout_is_collision_free(host16):
    """1-4 prefills x 1-4 decodes, with and without DP attention on either side."""
    for p in range(1, 5):
        for d in range(1, 5):
            for p_attn in (1, 2):
                for d_attn in (1, 2):
                    _assert_collision_free(build_plan(_xpyd(host16, p, d, p_attn, d_attn)).ports)


def test_dp_replicas_leave_the_nccl_port_to_sglang(gpu01_vars):
    plan = build_plan(changed(gpu01_vars, {"decode[0]": DECODE_REPLICAS}))
    assert "decode-0.nccl_port" not in plan.ports
    assert "nccl_port" not in plan.services["decode-0"]["args"]


def _problems(v):
    with pytest.raises(PlanError) as info:
        build_plan(v)
    return [str(p) for p in info.value.problems]


def test_the_suggested_port_is_free(gpu01_vars):
    """Taking the fix of the collision line gives a valid plan (the line itself:
    tests/test_plan_alignment.py)."""
    v = changed(gpu01_vars, {"prefill[0]": {"attn_dp_size": 4, "port": 30000}, "decode[0]": {"port": 30001}})
    (line,) = _problems(v)
    suggested = int(line.split("Fix: set pdnode_decode_instances[0].port: ")[1].split(" ")[0])
    _assert_collision_free(build_plan(changed(v, {"decode[0]": {"port": suggested}})).ports)


def test_two_instances_on_one_port_is_one_line(gpu01_vars):
    v = layout(gpu01_vars, [{"gpus": [0, 1], "port": 30500}, {"gpus": [2, 3], "port": 30500}],
               [{"gpus": [4, 5, 6, 7], "port": 30501}])
    assert _problems(v) == [
        "pdnode_prefill_instances[1].port=30500: prefill-1's port and prefill-0's port are both port 30500. "
        "Fix: set pdnode_prefill_instances[1].port: 30502 (the nearest free port), or leave the instances' ports "
        "out so the plan allocates them."]


def test_a_listener_where_dp_replicas_draw_their_nccl_port_is_a_warning_with_a_free_port(gpu01_vars):
    """Field failure 12 (sglang#39611): SGLang 0.5.23 draws a DP replica's NCCL port from
    22000-29999 at every start; the router's metrics port (29000 in gpu01) lies there."""
    v = changed(gpu01_vars, {"decode[0]": DECODE_REPLICAS})
    plan = build_plan(v)
    [warning] = [w for w in plan.warnings if w.rule_id == "dp-replica-port-draw"]
    assert str(warning).startswith("pdnode_router_metrics_port=29000: decode-0 runs DP replicas"), str(warning)
    assert "22000-29999" in str(warning) and "the router's metrics_port" in str(warning)
    suggested = int(str(warning).split("Fix: set pdnode_router_metrics_port: ")[1].split(" ")[0])
    assert suggested not in plan.ports.values() and suggested > 29999
    moved = build_plan({**v, "pdnode_router_metrics_port": suggested})
    assert not [w for w in moved.warnings if w.rule_id == "dp-replica-port-draw"]
    _assert_collision_free(moved.ports)
    # without replicas nothing draws there: the same port is no warning
    assert not [w for w in build_plan(gpu01_vars).warnings if w.rule_id == "dp-replica-port-draw"]

