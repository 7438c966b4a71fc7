"""The deployed router's worker management answers to the admin key only (issue 9, item 6),
and the verifier on the node reads /workers with that key; a recovered kill -9 is a
warning, not a failure (item 7).

Runs after test_node.py (file order): the node serves again after its kill -9 tests.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PREFIX = "sglang-pd"
ROUTER = "http://127.0.0.1:8000"
ROUTER_UNIT = f"{PREFIX}-router.service"
ADMIN_KEY_ON_HOST = "/etc/sglang-pd/router-admin-key"
KEY_ON_HOST = "/etc/sglang-pd/api-key"
# The scenario's client key (molecule/node/host_vars/pdnode-mol-node.yml), not a secret.
KEY = (REPO / "molecule" / "node" / "files" / "test-api-key").read_text().strip()


def call(host, method, path, auth="", data=None, timeout=20):
    """curl on the host; auth: '' (no header), 'client', or 'admin' (read there, as root)."""
    cmd = f"curl -sS --max-time {timeout} -X {method} -w '\\n%{{http_code}}' "
    if auth == "client":
        cmd += f"-H 'Authorization: Bearer {KEY}' "
    elif auth == "admin":
        cmd += f"-H \"Authorization: Bearer $(cat {ADMIN_KEY_ON_HOST})\" "
    if data is not None:
        cmd += f"-H 'Content-Type: application/json' -d '{json.dumps(data)}' "
    result = host.run(cmd + f"'{ROUTER}{path}'")
    if result.rc != 0:
        return 0, result.stderr
    body, _, code = result.stdout.rpartition("\n")
    return int(code), body


def worker_ids(host):
    code, body = call(host, "GET", "/workers", "admin")
    assert code == 200, body
    return {w["worker_type"]: w["id"] for w in json.loads(body)["workers"]}


def chat(host, auth="client"):
    return call(host, "POST", "/v1/chat/completions", auth,
                {"model": "demo-moe", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def wait_serving(host, deadline_s=300):  # ends once it serves (seconds on a quiet machine)
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if chat(host)[0] == 200:
            return
        time.sleep(0.2)
    pytest.fail(f"node did not serve again within {deadline_s} s")


def test_admin_key_file_is_private(host):
    f = host.file(ADMIN_KEY_ON_HOST)
    assert f.exists and f.is_file
    assert f.mode == 0o400 and f.user == "sglang"
    assert host.check_output(f"cat {ADMIN_KEY_ON_HOST}").strip() != host.check_output(f"cat {KEY_ON_HOST}").strip()


def test_admin_key_is_on_no_command_line(host):
    key = host.check_output(f"cat {ADMIN_KEY_ON_HOST}").strip()
    pid = host.check_output(f"systemctl show -p MainPID --value {ROUTER_UNIT}")
    assert pid != "0"
    cmdlines = host.check_output("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' || true")
    assert key not in cmdlines
    assert key not in host.check_output(f"systemctl cat {ROUTER_UNIT}")
    assert "--admin-key-file" in host.check_output(f"systemctl show -p ExecStart --value {ROUTER_UNIT}")


@pytest.mark.parametrize("auth", ["", "client"], ids=["no key", "client key"])
def test_clients_cannot_manage_workers(host, auth):
    ids = worker_ids(host)
    assert set(ids) == {"prefill", "decode"}
    for method, path, data in [
        ("DELETE", f"/workers/{ids['decode']}", None),
        ("DELETE", f"/workers/{ids['prefill']}", None),
        ("POST", "/workers", {"url": "http://127.0.0.1:9", "worker_type": "decode"}),
        ("PUT", f"/workers/{ids['decode']}", {"priority": 1}),
        ("GET", "/workers", None),
        ("POST", "/flush_cache", None),
    ]:
        code, body = call(host, method, path, auth, data)
        assert code in (401, 403), (method, path, code, body)
    assert worker_ids(host) == ids  # nothing removed, nothing added
    code, body = chat(host)
    assert code == 200 and json.loads(body)["choices"][0]["message"]["content"], body


def test_admin_key_is_no_client_key(host):
    assert chat(host, "admin")[0] == 401


@pytest.fixture(scope="module")
def plan_file(host):
    plan = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "render", "inventories/demo", "--role", "plan"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout
    data = json.loads(plan)
    data["settings"]["pdnode_api_key_file"] = "molecule/node/files/test-api-key"
    host.run(f"cat > /tmp/plan-admin.json <<'EOF'\n{json.dumps(data)}\nEOF")
    return data


def run_verify(host, plan):
    venv = plan["install"]["venv"]
    r = host.run(f"{venv}/bin/python -m pdnode.verify --plan /tmp/plan-admin.json --on-node --json --timeout 5 "
                 f"--skip-burst --api-key-file {KEY_ON_HOST} --admin-key-file {ADMIN_KEY_ON_HOST}")
    report = json.loads(r.stdout)
    return r.rc, {c["id"]: c for c in report["checks"]}, report


def test_verifier_reads_workers_with_the_admin_key(host, plan_file):
    rc, checks, report = run_verify(host, plan_file)
    assert rc == 0, report["failures"]
    assert checks["router"]["status"] == "PASS" and "/workers: 1 prefill" in checks["router"]["evidence"]


def test_recovered_kill_9_is_a_warning_not_a_failure(host, plan_file):
    old = host.check_output(f"systemctl show -p MainPID --value {ROUTER_UNIT}")
    before = int(host.check_output(f"systemctl show -p NRestarts --value {ROUTER_UNIT}"))
    host.check_output(f"kill -9 {old}")
    wait_serving(host)
    end = time.monotonic() + 300  # the unit is 'active' once its readiness gate returned
    while host.check_output(f"systemctl show -p ActiveState --value {ROUTER_UNIT}") != "active":
        assert time.monotonic() < end
        time.sleep(0.2)
    rc, checks, report = run_verify(host, plan_file)
    assert int(host.check_output(f"systemctl show -p NRestarts --value {ROUTER_UNIT}")) == before + 1
    assert rc == 0, report["failures"]
    assert checks["services"]["status"] == "WARN", checks["services"]
    assert f"{ROUTER_UNIT}: active/running, restarted" in checks["services"]["evidence"]
    assert "recovered, not a loop" in checks["services"]["evidence"]
    assert report["warnings"] and report["summary"]["FAIL"] == 0
