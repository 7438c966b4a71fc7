"""Changing the layout of a running node: 1P1D -> 2P1D -> 1P1D on the same container.

Each step is a real deploy from the controller (playbooks/deploy.yml) with the demo
description's instances replaced in host_vars. Proves: units are added and removed
(none orphaned), only what changed restarts, the router registers every prefill, both
prefills serve, and a kill -9 of one prefill under steady load costs a bounded number
of requests while the other prefill and the decode keep serving
(docs/decisions.md, "Restart coupling"). Ends on the scenario's own description.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "instance")
PREFIX = "sglang-pd"
KEY = (REPO / "molecule" / "node" / "files" / "test-api-key").read_text().strip()
TWO_PREFILLS = {
    "pdnode_prefill_instances": [{"gpus": [0, 1], "tp_size": 2}, {"gpus": [2, 3], "tp_size": 2}],
}
# Requests a kill -9 of one of two prefills may cost under the steady load below: those
# in flight on it when it dies (at most the load's concurrency) plus those the router
# sends it before its circuit opens; measured and documented in docs/decisions.md.
LOAD_CONCURRENCY = 4
MAX_FAILED_ON_PREFILL_KILL = 2 * LOAD_CONCURRENCY

LOAD = r"""
import json, sys, threading, time, urllib.request
url, key, seconds, workers = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
ok, failed, codes, lock = [0], [0], {}, threading.Lock()
end = time.monotonic() + seconds
def run():
    while time.monotonic() < end:
        body = json.dumps({"model": "demo-moe", "prompt": "steady load " * 16, "max_tokens": 8}).encode()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json", "Authorization": "Bearer " + key})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                code = resp.status
        except urllib.error.HTTPError as exc:
            code = exc.code
        except Exception:
            code = 0
        with lock:
            (ok if code == 200 else failed)[0] += 1
            codes[code] = codes.get(code, 0) + 1
threads = [threading.Thread(target=run) for _ in range(workers)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"ok": ok[0], "failed": failed[0], "codes": codes}))
"""


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    return env


def playbook(inventory: Path, name: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    cmd = ["ansible-playbook", "-i", str(inventory), str(REPO / "playbooks" / name)]
    if extra:
        (inventory / "extra.json").write_text(json.dumps(extra))
        cmd += ["-e", f"@{inventory / 'extra.json'}"]
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)


def units_on_disk(host) -> set[str]:
    out = host.check_output(f"ls /etc/systemd/system | grep -E '^{PREFIX}-(prefill|decode)' || true")
    return set(out.split())


def main_pids(host, units) -> dict[str, str]:
    return {u: host.check_output(f"systemctl show -p MainPID --value {u}") for u in units}


def counters(host, port: int) -> float:
    text = host.check_output(f"curl -sS --max-time 5 http://127.0.0.1:{port}/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sglang:num_requests_total"))


@pytest.fixture(scope="module")
def two_prefills(inventory, host):
    """The node re-deployed as 2P1D; the scenario's own 1P1D deployed again after."""
    before = main_pids(host, [f"{PREFIX}-prefill-0.service", f"{PREFIX}-decode-0.service", f"{PREFIX}-router.service"])
    t0 = time.monotonic()
    proc = playbook(inventory, "deploy.yml", TWO_PREFILLS)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    print(f"re-deploy 1P1D -> 2P1D: {took:.1f} s")
    yield before
    back = playbook(inventory, "deploy.yml")
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-2000:]


def test_units_added_none_orphaned(host, two_prefills):
    assert units_on_disk(host) == {f"{PREFIX}-prefill-0.service", f"{PREFIX}-prefill-1.service",
                                   f"{PREFIX}-decode-0.service"}
    for unit in ("prefill-0", "prefill-1", "decode-0", "router"):
        assert host.service(f"{PREFIX}-{unit}.service").is_running, unit
    # Two prefills: the decode is bound to none of them (its coupling drop-in is gone).
    assert not host.file(f"/etc/systemd/system/{PREFIX}-decode-0.service.d/10-coupling.conf").exists
    assert host.check_output(f"systemctl show -p BindsTo --value {PREFIX}-decode-0.service") == ""


def test_only_what_changed_restarted(host, two_prefills):
    after = main_pids(host, list(two_prefills))
    # decode-0's ServerArgs, environment and unit are the same: a reload re-coupled it.
    assert after[f"{PREFIX}-decode-0.service"] == two_prefills[f"{PREFIX}-decode-0.service"]
    # prefill-0 moved to GPUs 0-1 at TP 2 and the router gained a prefill: both restarted.
    assert after[f"{PREFIX}-prefill-0.service"] != two_prefills[f"{PREFIX}-prefill-0.service"]
    assert after[f"{PREFIX}-router.service"] != two_prefills[f"{PREFIX}-router.service"]


def test_router_registers_both_prefills(host, two_prefills):
    admin = host.check_output("cat /etc/sglang-pd/router-admin-key")
    workers = json.loads(host.check_output(
        f"curl -sS --max-time 5 -H 'Authorization: Bearer {admin}' http://127.0.0.1:8000/workers"))
    urls = sorted((w["url"], w.get("bootstrap_port")) for w in workers["workers"] if w["worker_type"] == "prefill")
    assert urls == [("http://127.0.0.1:30000", 8998), ("http://127.0.0.1:30010", 8999)], workers


def test_verify_passes_and_both_prefills_served(inventory, host, two_prefills):
    before = {p: counters(host, p) for p in (30000, 30010)}
    proc = playbook(inventory, "verify.yml", TWO_PREFILLS)
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = json.loads((REPO / ".cache" / "verify" / f"{CONTAINER}.json").read_text())
    assert report["status"] in ("PASS", "WARN"), report
    text = json.dumps(report)
    assert "prefill-0" in text and "prefill-1" in text, "the report does not name each prefill"
    served = {p: counters(host, p) - before[p] for p in before}
    assert all(n > 0 for n in served.values()), f"requests served per prefill port during verify: {served}"


def test_kill_9_of_one_prefill_under_load(host, two_prefills):
    decode = f"{PREFIX}-decode-0.service"
    decode_pid = host.check_output(f"systemctl show -p MainPID --value {decode}")
    victim = f"{PREFIX}-prefill-0.service"
    pid = host.check_output(f"systemctl show -p MainPID --value {victim}")
    script = base64.b64encode(LOAD.encode()).decode()
    host.check_output(f"echo {script} | base64 -d > /var/tmp/pdnode-load.py")
    host.check_output(f"rm -f /var/tmp/pdnode-load.json; nohup python3 /var/tmp/pdnode-load.py "
                      f"http://127.0.0.1:8000/v1/completions {KEY} 25 {LOAD_CONCURRENCY} "
                      f"> /var/tmp/pdnode-load.json 2>/dev/null &")
    time.sleep(5)
    other_before = counters(host, 30010)
    host.check_output(f"kill -9 {pid}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not host.run("test -s /var/tmp/pdnode-load.json").succeeded:
        time.sleep(1)
    result = json.loads(host.check_output("cat /var/tmp/pdnode-load.json"))
    print(f"kill -9 of one of two prefills under load ({LOAD_CONCURRENCY} concurrent, 25 s): {result}")
    assert result["ok"] > 0
    assert result["failed"] <= MAX_FAILED_ON_PREFILL_KILL, result
    # The other prefill kept serving, the decode was not taken down, the victim is back.
    assert counters(host, 30010) > other_before
    assert host.check_output(f"systemctl show -p MainPID --value {decode}") == decode_pid
    new = host.check_output(f"systemctl show -p MainPID --value {victim}")
    assert new not in ("0", pid)


def test_back_to_one_prefill_removes_the_second(inventory, host, two_prefills):
    proc = playbook(inventory, "deploy.yml")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert units_on_disk(host) == {f"{PREFIX}-prefill-0.service", f"{PREFIX}-decode-0.service"}
    assert not host.file("/etc/sglang-pd/prefill-1.json").exists
    assert not host.file("/etc/sglang-pd/prefill-1.env").exists
    assert host.run(f"systemctl is-active {PREFIX}-prefill-1.service").stdout.strip() != "active"
    # One prefill again: decode is bound to it.
    assert host.check_output(f"systemctl show -p BindsTo --value {PREFIX}-decode-0.service") == \
        f"{PREFIX}-prefill-0.service"
