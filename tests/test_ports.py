"""A port of the plan held by another process is named with its owner (pid, command,
unit) before anything starts; our own units may hold their ports (a re-deploy)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from pdnode import hostfacts as hf
from pdnode import preflight as pf

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
OWN = ["sglang-pd-prefill.service", "sglang-pd-decode.service", "sglang-pd-router.service"]


def test_live_listener_is_named_with_pid_and_command(tmp_path):
    server = tmp_path / "srv.py"
    server.write_text("import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                      "print(s.getsockname()[1], flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, str(server), "--marker-arg"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        (p,) = pf.port_problems(pf.live_listeners(), {"pdnode_decode_port": port}, OWN)
        assert p.check == f"port.{port}"
        assert f"pid {child.pid} " in p.line and "--marker-arg" in p.line, p.line
        assert "pdnode_decode_port" in p.line
    finally:
        child.kill()
        child.wait()


def test_cli_one_line_per_taken_port_and_exit_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
        r = subprocess.run([sys.executable, "-m", "pdnode.preflight", "ports", *(f"--own-unit={u}" for u in OWN),
                            f"pdnode_router_port={port}", "pdnode_prefill_port=1"],
                           capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ERROR port.{port}=") and f"pid {os.getpid()}" in lines[0]


def test_free_ports_pass():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert pf.port_problems(pf.live_listeners(), {"pdnode_decode_port": free}, OWN) == []


def test_own_units_hold_their_ports_foreign_units_do_not():
    listeners = [
        {"address": "127.0.0.1", "port": 30001, "pid": 10, "unit": "sglang-pd-decode.service", "command": "python"},
        {"address": "0.0.0.0", "port": 8000, "pid": 11, "unit": "sglang-pd-old.service", "command": "x"},
        # fds unreadable (another user, no CAP_SYS_PTRACE): the uid runs only our units
        {"address": "127.0.0.1", "port": 30000, "pid": None, "unit": None, "uid": 997, "uid_units": OWN[:1]},
        {"address": "127.0.0.1", "port": 8998, "pid": None, "unit": None, "uid": 0,
         "uid_units": ["?", "ssh.service"]},
    ]
    ports = {"pdnode_decode_port": 30001, "pdnode_router_port": 8000, "pdnode_prefill_port": 30000,
             "pdnode_prefill_bootstrap_port": 8998}
    lines = [p.line for p in pf.port_problems(listeners, ports, OWN)]
    # Exact unit names: a unit that merely shares the prefix is not ours.
    assert lines == [
        "ERROR port.8000='0.0.0.0:8000': the port pdnode_router_port needs is already in use (pid 11 'x', unit "
        "sglang-pd-old.service). Fix: stop that process or choose another port for pdnode_router_port.",
        "ERROR port.8998='127.0.0.1:8998': the port pdnode_prefill_bootstrap_port needs is already in use (owner "
        "unknown, uid 0). Fix: stop that process or choose another port for pdnode_prefill_bootstrap_port.",
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
    exp = pf.expectations(None, {"ports": {"pdnode_decode_port": 30001}, "own_unit_prefix": "sglang-pd",
                                 "require_systemd": False, "supported_os": ["x"]})
    (p,) = [p for p in pf.judge(facts, exp) if p.check.startswith("port.")]
    assert "(pid 40 'python3 -m http.server 30001', unit foreign.service)" in p.line


def test_expectations_take_the_plans_unit_names():
    from pdnode.inventory import load_inventory
    from pdnode.plan import build_plan
    plan = build_plan(load_inventory(Path(__file__).resolve().parents[1] / "inventories" / "demo").variables)
    assert pf.expectations(plan.as_dict())["own_units"] == sorted(OWN)
