"""Failed starts on the real node (issue 9, item 4): they end fast, say why, and a
dead node is never reported as deployed.

- a decode with a corrupt JSON makes `systemctl restart` fail at once (the readiness
  gate stops when the launcher exits), with the launcher's error in the journal;
- the deploy's start step fails naming the service that did not start and its own last
  journal lines (the target only Wants= the services);
- a foreign process on a port of the plan is named (pid, command, unit) by the deploy
  before anything restarts;
- a SIGSTOPped decode is killed by systemd's watchdog and restarted, and the node serves
  again.

Each test leaves the node as converge left it. Times are printed (`pytest -s`) and kept in
docs/measurements.md; what is asserted is why each one ended (the gate saw the launcher
exit, the deploy named the unit, the watchdog killed the process), which a busy machine
cannot change. Waits end as soon as their condition holds; their deadlines are far beyond
what a working node needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")
PREFIX = "sglang-pd"
UNITS = [f"{PREFIX}-prefill-0.service", f"{PREFIX}-decode-0.service", f"{PREFIX}-router.service"]
TARGET = f"{PREFIX}.target"
DECODE_JSON = "/etc/sglang-pd/decode-0.json"
KEY = (REPO / "molecule" / "node" / "files" / "test-api-key").read_text().strip()
DROPIN = f"/etc/systemd/system/{UNITS[1]}.d/pdnode-test-fail.conf"
WATCHDOG_S = 60  # pd_services_watchdog_s default


def serving(host) -> bool:
    r = host.run("curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "
                 f"-H 'Authorization: Bearer {KEY}' -H 'Content-Type: application/json' "
                 f"-d '{json.dumps({'model': 'demo-moe', 'prompt': 'ping', 'max_tokens': 2})}' "
                 "http://127.0.0.1:8000/v1/completions")
    return r.stdout.strip() == "200"


def wait_serving(host, deadline_s=300) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if serving(host):
            return time.monotonic() - t0
        time.sleep(0.5)
    pytest.fail(f"the node did not serve again within {deadline_s} s")


def restore(host):
    """Back to the converged node: every unit started (waits for readiness), serving."""
    host.run(f"rm -f {DROPIN}; systemctl daemon-reload")
    host.run(f"systemctl reset-failed {' '.join(UNITS)}")
    host.check_output(f"systemctl start {' '.join(UNITS)} {TARGET}")
    wait_serving(host)


def deploy(inventory) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(PATH=f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '')}", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_NOCOLOR="1")
    t0 = time.monotonic()
    r = subprocess.run(["ansible-playbook", "-i", str(inventory), str(REPO / "playbooks" / "deploy.yml")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    return r, time.monotonic() - t0


def test_corrupt_json_fails_the_restart_at_once_with_the_launchers_error(host):
    host.check_output(f"cp {DECODE_JSON} /var/tmp/decode.json.good")
    try:
        host.check_output(f"echo '{{not json' > {DECODE_JSON}")
        since = host.check_output("date '+%Y-%m-%d %H:%M:%S'")
        t0 = time.monotonic()
        r = host.run(f"systemctl restart {UNITS[1]}")
        took = time.monotonic() - t0
        journal = host.check_output(f"journalctl -u {UNITS[1]} --since '{since}' --no-pager -o cat")
    finally:
        host.check_output(f"cp /var/tmp/decode.json.good {DECODE_JSON}")
        restore(host)
    print(f"failed restart of decode with a corrupt JSON: {took:.1f} s")
    assert r.rc != 0
    assert f"{DECODE_JSON} is not valid JSON" in journal
    # the gate ended because the launcher exited, not at its timeout (the demo's 60 s), nor
    # did systemd stop a start that hung (TimeoutStartSec): a fact, whatever the load
    assert "pdnode.ready: the main process" in journal
    assert "not ready after" not in journal and "timed out" not in journal.lower(), journal[-3000:]


def test_deploy_fails_naming_the_service_that_did_not_start(host, inventory):
    host.check_output(f"systemctl stop {TARGET} {' '.join(UNITS)}")
    host.check_output(f"mkdir -p {Path(DROPIN).parent} && printf '[Service]\\nExecStartPre=/bin/sh -c "
                      f"\"echo pdnode-test: injected start failure >&2; exit 3\"\\n' > {DROPIN} "
                      "&& systemctl daemon-reload")
    try:
        r, took = deploy(inventory)
    finally:
        restore(host)
    print(f"deploy with a decode that cannot start: failed after {took:.1f} s")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert f"{UNITS[1]} did not start" in out, out[-3000:]
    assert "pdnode-test: injected start failure" in out
    assert "the router was not started: its workers did not start" in out


def test_foreign_listener_is_named_before_anything_restarts(host, inventory):
    host.check_output(f"systemctl stop {TARGET} {' '.join(UNITS)}")
    host.check_output("systemd-run --unit pdnode-test-squatter python3 -m http.server 30001 --bind 127.0.0.1")
    try:
        deadline = time.monotonic() + 120  # a second on a quiet machine
        while "30001" not in host.check_output("ss -ltnH") and time.monotonic() < deadline:
            time.sleep(0.2)
        r, took = deploy(inventory)
        states = host.run(f"systemctl is-active {' '.join(UNITS)}").stdout.split()
    finally:
        host.run("systemctl stop pdnode-test-squatter")
        restore(host)
    print(f"deploy with a foreign listener on decode's port: failed after {took:.1f} s")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    line = next((ln for ln in out.splitlines() if "port.30001=" in ln), "")
    assert "decode-0.port" in out and "http.server 30001" in out and "pdnode-test-squatter.service" in out, (
        out[-3000:])
    assert line, out[-3000:]
    assert states == ["inactive"] * 3, f"something started before the port check failed: {states}"


def test_sigstopped_decode_is_restarted_by_the_watchdog(host):
    pid = host.check_output(f"systemctl show -p MainPID --value {UNITS[1]}")
    since = host.check_output("date '+%Y-%m-%d %H:%M:%S'")
    host.check_output(f"kill -STOP {pid}")
    t0 = time.monotonic()
    try:
        # the watchdog fires after WATCHDOG_S by systemd's clock; the restart then takes
        # seconds (more on a busy machine): the deadline is far beyond both
        while time.monotonic() - t0 < WATCHDOG_S + 240:
            if host.check_output(f"systemctl show -p MainPID --value {UNITS[1]}") not in (pid, "0"):
                break
            time.sleep(1)
        replaced = time.monotonic() - t0
        serving_after = wait_serving(host)
    finally:
        host.run(f"kill -CONT {pid}")  # no-op once it was killed
    journal = host.check_output(f"journalctl -u {UNITS[1]} --since '{since}' --no-pager -o cat")
    print(f"SIGSTOPped decode replaced by the watchdog after {replaced:.1f} s, serving again "
          f"{serving_after:.1f} s later")
    assert replaced < WATCHDOG_S + 240, f"decode still the stopped process after {replaced:.0f} s"
    assert "Watchdog timeout" in journal
    assert "pdnode.watchdog: not pinging" in journal
