"""The whole node on the demo description, checked through its public surface.

Runs after converge and idempotence. The kill -9 tests come last (file order) and
print their recovery times (`pytest -s` or the molecule log shows them).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PREFIX = "sglang-pd"
UNITS = [f"{PREFIX}-prefill-0.service", f"{PREFIX}-decode-0.service", f"{PREFIX}-router.service"]
ROUTER = "http://127.0.0.1:8000"
# The scenario's test key (molecule/node/host_vars/pdnode-mol-node.yml), not a secret.
KEY = (REPO / "molecule" / "node" / "files" / "test-api-key").read_text().strip()
KEY_ON_HOST = "/etc/sglang-pd/api-key"


def curl(host, url, data=None, timeout=20, key=KEY):
    cmd = f"curl -sS --max-time {timeout} -w '\\n%{{http_code}}' "
    if key:
        cmd += f"-H 'Authorization: Bearer {key}' "
    if data is not None:
        cmd += f"-H 'Content-Type: application/json' -d '{json.dumps(data)}' "
    result = host.run(cmd + f"'{url}'")
    if result.rc != 0:  # connection refused, timed out: no HTTP status at all
        return 0, result.stderr
    body, _, code = result.stdout.rpartition("\n")
    return int(code), body


@pytest.mark.parametrize("unit", UNITS + [f"{PREFIX}.target"])
def test_unit_active_enabled_and_valid(host, unit):
    svc = host.service(unit)
    assert svc.is_running or unit.endswith(".target")
    assert svc.is_enabled
    assert svc.is_valid, host.run(f"systemd-analyze verify /etc/systemd/system/{unit}").stderr


@pytest.mark.parametrize("unit", UNITS)
def test_service_runs_as_the_service_user(host, unit):
    pid = host.check_output(f"systemctl show -p MainPID --value {unit}")
    assert pid != "0"
    user = host.check_output(f"ps -o user= -p {pid}")
    assert user == "sglang"


@pytest.mark.parametrize(("port", "addr"), [
    (30000, "127.0.0.1"), (8998, "127.0.0.1"), (30001, "127.0.0.1"),
    (8000, "0.0.0.0"), (29000, "127.0.0.1"),
])
def test_port_bound_on_intended_address(host, port, addr):
    assert host.socket(f"tcp://{addr}:{port}").is_listening
    if addr == "127.0.0.1":
        assert not host.socket(f"tcp://0.0.0.0:{port}").is_listening


def test_the_router_starts_after_every_engine_passed_its_readiness_gate(host):
    """Row 1 of docs/field-failures.md: a worker's unit is active only once its engine
    answers (its ExecStartPost gate: the stand-in answers after its configured start,
    PDNODE_SIM_STARTUP_S), and the router starts only after every worker is active. Without
    the gate a unit is active the moment its process runs, and the router starts beside a
    prefill that still loads: the first assertion below fails."""
    after = host.check_output(f"systemctl show -p After --value {PREFIX}-router.service").split()
    assert UNITS[0] in after and UNITS[1] in after
    # The order shows in a start of all three from stopped, as a boot or a first deploy does
    # it: earlier tests restart single workers under the running router (a deploy that
    # repairs a worker keeps the router), so the timestamps of the moment say nothing. One
    # systemctl call waits for all three jobs, each through its readiness gate.
    host.run_expect([0], "systemctl stop " + " ".join(reversed(UNITS)))
    host.run_expect([0], "systemctl start " + " ".join(UNITS))

    def us(unit: str, what: str) -> int:
        return int(host.check_output(f"systemctl show -p {what}TimestampMonotonic --value {unit}"))

    for worker, env in zip(UNITS[:2], ("prefill-0.env", "decode-0.env")):
        startup = float(host.check_output(f"sed -n 's/^PDNODE_SIM_STARTUP_S=//p' /etc/sglang-pd/{env}"))
        gated = (us(worker, "ActiveEnter") - us(worker, "ExecMainStart")) / 1e6
        assert gated >= startup, (worker, gated, startup)  # active only once its engine answered
        assert us(UNITS[2], "ExecMainStart") >= us(worker, "ActiveEnter"), worker


@pytest.mark.parametrize("unit", UNITS)
def test_security_exposure_at_most_4(host, unit):
    out = host.check_output(f"systemd-analyze security --no-pager {unit} | tail -n 1")
    # e.g. "→ Overall exposure level for sglang-pd-prefill.service: 2.1 OK :-)"
    score = float(out.split(":")[1].split()[0])
    print(f"exposure {unit}: {score}")
    assert score <= 4.0, out


def test_api_key_file_readable_by_the_service_user_only(host):
    f = host.file(KEY_ON_HOST)
    assert (f.user, f.group, f.mode) == ("sglang", "sglang", 0o400)
    assert f.content_string.strip() == KEY


def test_api_key_never_on_a_command_line(host):
    pids = host.check_output("pgrep -u sglang").split()
    assert len(pids) >= 3  # prefill, decode, router (and their children)
    for pid in pids:
        cmdline = host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        assert KEY not in cmdline, f"pid {pid}: {cmdline}"
    assert KEY not in host.check_output("journalctl -u 'sglang-pd-*' --no-pager")


def admin_key(host):
    # Made on the host by the role; read there, never copied to the controller's files.
    return host.check_output("cat /etc/sglang-pd/router-admin-key").strip()


def test_router_and_workers_require_the_key(host):
    # Generation and the workers' own endpoints take the client key; the router's
    # worker management takes only the admin key (test_router_admin.py has the details).
    for url in ("http://127.0.0.1:30000/server_info", "http://127.0.0.1:30001/server_info"):
        code, _ = curl(host, url, key=None)
        assert code == 401, url
        code, _ = curl(host, url)
        assert code == 200, url
    for key in (None, KEY):
        code, _ = curl(host, f"{ROUTER}/workers", key=key)
        assert code == 401, f"/workers with {'no key' if key is None else 'the client key'}"
    code, _ = curl(host, f"{ROUTER}/workers", key=admin_key(host))
    assert code == 200


def test_router_lists_one_prefill_and_one_decode(host):
    code, body = curl(host, f"{ROUTER}/workers", key=admin_key(host))
    assert code == 200
    stats = json.loads(body)["stats"]
    assert (stats["prefill_count"], stats["decode_count"]) == (1, 1)


def test_completion_through_the_router(host):
    code, body = curl(host, f"{ROUTER}/v1/chat/completions", {
        "model": "demo-moe", "messages": [{"role": "user", "content": "Say hello to the operator."}],
        "max_tokens": 8, "temperature": 0})
    assert code == 200, body
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] > 0


# --- The verification engine on the deployed node: each fault fails the right check ---

@pytest.fixture(scope="module")
def plan_on_host(host):
    plan = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "render", "inventories/demo", "--role", "plan"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout
    data = json.loads(plan)
    data["settings"]["pdnode_api_key_file"] = "molecule/node/files/test-api-key"
    put_plan(host, data)
    return data


def put_plan(host, plan):
    """The plan where run_verify reads it (the node's /tmp: gone after a reboot)."""
    host.run(f"cat > /tmp/plan.json <<'EOF'\n{json.dumps(plan)}\nEOF")


def run_verify(host, plan, args="--skip-burst", env="", key_file=KEY_ON_HOST):
    venv = plan["install"]["venv"]
    r = host.run(f"{env} {venv}/bin/python -m pdnode.verify --plan /tmp/plan.json --json --timeout 5 "
                 f"--api-key-file {key_file} {args}")
    report = json.loads(r.stdout)
    failed = [c["id"] for c in report["checks"] if c["status"] == "FAIL"]
    return r.rc, failed, report


def set_faults(host, port, faults):
    code, body = curl(host, f"http://127.0.0.1:{port}/sim/faults", {"faults": faults})
    assert code == 200, body


def test_verify_passes_on_the_healthy_node(host, plan_on_host):
    rc, failed, report = run_verify(host, plan_on_host, args="")
    assert (rc, failed) == (0, []), report["failures"]
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    # real systemd state, on the node. The demo turns the engines' device restriction off
    # (pd_services_device_policy: false: no device controller in the container), which the
    # services check reports as a warning, naming the engines (issue 17, section 5)
    assert statuses["services"] == "WARN"
    services = next(c for c in report["checks"] if c["id"] == "services")
    assert "hardening off: " in services["evidence"] and "DevicePolicy=auto" in services["evidence"], services
    assert "sglang-pd-router.service" not in services["evidence"].split("hardening off: ")[1], services
    assert any("pd_services_device_policy is false" in w for w in report["warnings"]), report["warnings"]
    print(f"verification on the node: {report['measurements']['timing']}")


@pytest.mark.parametrize(("role_port", "faults", "args", "expected"), [
    (30000, ["bootstrap_down"], "--skip-burst", "bootstrap.prefill-0"),
    (30001, ["rename_metric:sglang:generation_tokens_total=sglang:gen_tokens_total"], "--skip-burst", "metrics"),
    (30001, ["slow:30"], "", "threshold.itl_p50_max_s"),
])
def test_verify_fails_the_right_check(host, plan_on_host, role_port, faults, args, expected):
    set_faults(host, role_port, faults)
    try:
        rc, failed, report = run_verify(host, plan_on_host, args=args)
    finally:
        set_faults(host, role_port, [])
    assert rc == 1 and expected in failed, report["failures"]


# --- The per-pair probe (field failure 4): a pair that fails while both engines are healthy ---
PROBE = f"{PREFIX}-pair-probe"


def _probe_once(host) -> dict[str, str]:
    """Run the probe now (its oneshot unit: systemctl returns when it is done) and read
    what the node exporter serves of it, as Prometheus scrapes it."""
    host.check_output(f"systemctl start {PROBE}.service")
    metrics = host.check_output("curl -sS --max-time 10 http://127.0.0.1:9100/metrics")
    return {line.split(" ")[0]: line.split(" ")[1] for line in metrics.splitlines()
            if line.startswith("pdnode_pair_probe_")}


PAIR = '{decode="decode-0",prefill="prefill-0"}'  # the exporter sorts the labels


def test_the_pair_probe_timer_runs_and_the_node_exporter_serves_its_pairs(host):
    timer = host.service(f"{PROBE}.timer")
    assert timer.is_enabled and timer.is_running
    got = _probe_once(host)
    assert got[f"pdnode_pair_probe_success{PAIR}"] == "1" and got[f"pdnode_pair_probe_skipped{PAIR}"] == "0", got
    assert float(got["pdnode_pair_probe_last_run_timestamp_seconds"]) > time.time() - 120, got


def test_a_failing_pair_reads_0_while_both_engines_answer_health_then_1_once_it_serves(host):
    set_faults(host, 30000, ["transfer_fail"])  # every KV write of prefill-0 fails
    try:
        got = _probe_once(host)
        journal = host.check_output(f"journalctl -u {PROBE}.service --no-pager -n 5 --output cat")
    finally:
        set_faults(host, 30000, [])
    assert got[f"pdnode_pair_probe_success{PAIR}"] == "0", got
    assert "pair prefill-0 + decode-0 failed in " in journal and "HTTP 500" in journal, journal
    assert curl(host, "http://127.0.0.1:30001/health", key=None)[0] == 200
    # one failed write blacklisted the decode's session (sglang#13054): SGLang's failed-session
    # probe lifts it within its first interval (30 s), and the pair reads 1 again
    deadline = time.monotonic() + 180
    while (got := _probe_once(host))[f"pdnode_pair_probe_success{PAIR}"] != "1" and time.monotonic() < deadline:
        time.sleep(5)
    assert got[f"pdnode_pair_probe_success{PAIR}"] == "1", got
    _wait_serving(host)


def test_verify_diagnoses_a_wrong_key_and_a_proxy(host, plan_on_host):
    host.run("printf 'not-the-key\\n' > /tmp/wrong-key && chmod 600 /tmp/wrong-key")
    rc, failed, report = run_verify(host, plan_on_host, key_file="/tmp/wrong-key")
    assert rc == 1 and "access" in failed, report["failures"]
    rc, failed, report = run_verify(host, plan_on_host, env="http_proxy=http://127.0.0.1:9")
    assert rc == 1 and failed == ["proxy"], report["failures"]
    assert "http_proxy" in json.dumps(report["checks"])


def test_verify_sees_a_hung_decode(host, plan_on_host):
    pid = host.check_output(f"systemctl show -p MainPID --value {UNITS[1]}")
    host.check_output(f"kill -STOP {pid}")
    try:
        rc, failed, report = run_verify(host, plan_on_host)
    finally:
        host.check_output(f"kill -CONT {pid}")
    assert rc == 1 and "decode-0" in failed, report["failures"]
    _wait_serving(host)


def test_verify_names_an_engine_whose_mooncake_runs_another_transport(host, plan_on_host):
    """Field failure 8: the engines' transport is not the plan's path (here a drop-in sets
    MC_FORCE_TCP on decode-0 outside pdnode; with no usable RDMA device Mooncake falls back
    the same way, unasked). kv.transport reads what decode-0 logged at its start."""
    dropin = f"/etc/systemd/system/{UNITS[1]}.d/99-test-force-tcp.conf"
    host.check_output(f"printf '[Service]\\nEnvironment=MC_FORCE_TCP=1\\n' > {dropin} && systemctl daemon-reload "
                      f"&& systemctl restart {UNITS[1]}")
    try:
        _wait_serving(host)
        rc, failed, report = run_verify(host, plan_on_host)
        check = next(c for c in report["checks"] if c["id"] == "kv.transport")
        assert rc == 1 and "kv.transport" in failed, report["failures"]
        assert "decode-0 logged 'MC_FORCE_TCP is set, using TCP transport only': tcp, not the plan's nvlink" \
            in check["evidence"], check
        assert "prefill-0: nvlink" in check["evidence"] and f"systemctl show -p Environment {UNITS[1]}" in check["hint"]
    finally:
        host.run(f"rm -f {dropin} && systemctl daemon-reload && systemctl restart {UNITS[1]}")
        _wait_serving(host)
    rc, failed, report = run_verify(host, plan_on_host)
    assert (rc, failed) == (0, []), report["failures"]
    assert next(c for c in report["checks"] if c["id"] == "kv.transport")["status"] == "PASS"


def _wait_serving(host, deadline_s=300):  # ends once it serves (5-7 s, docs/measurements.md)
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        code, _ = curl(host, f"{ROUTER}/v1/completions",
                       {"model": "demo-moe", "prompt": "ping", "max_tokens": 2}, timeout=5)
        if code == 200:
            return time.monotonic() - t0
        time.sleep(0.2)
    pytest.fail(f"node did not serve again within {deadline_s} s")


@pytest.mark.parametrize("role", ["decode", "prefill", "router"])
def test_kill_9_recovers(host, role):
    unit = {"prefill": UNITS[0], "decode": UNITS[1], "router": UNITS[2]}[role]
    old = host.check_output(f"systemctl show -p MainPID --value {unit}")
    old_decode = host.check_output(f"systemctl show -p MainPID --value {UNITS[1]}")
    host.check_output(f"kill -9 {old}")
    took = _wait_serving(host)
    new = host.check_output(f"systemctl show -p MainPID --value {unit}")
    assert new not in ("0", old)
    if role == "prefill":  # decode is bound to prefill: it must have been restarted too
        assert host.check_output(f"systemctl show -p MainPID --value {UNITS[1]}") not in ("0", old_decode)
    print(f"recovery after kill -9 of {role}: {took:.1f} s")


def test_prefill_restart_restarts_decode(host):
    """Decision (docs/decisions.md): with one prefill, decode is PartOf it and restarts with it."""
    before = host.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {UNITS[1]}")
    host.check_output(f"systemctl restart {UNITS[0]}")
    after = host.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {UNITS[1]}")
    assert int(after) > int(before)
    _wait_serving(host)


def test_a_reboot_brings_every_worker_back_and_verify_passes_without_a_deploy(host, plan_on_host):
    """Field failure 11 (smg#752: workers gone from the router after a reboot). The
    container restarted is the host rebooted: a new systemd starts the enabled units in
    their order (the router after its workers), the router starts from its own file and its
    unit then reconciles the worker list with the plan's (ExecStartPost). No deploy runs;
    verify passes."""
    from conftest import CONTAINER

    def invocations() -> dict[str, str]:
        return {u: host.check_output(f"systemctl show -p InvocationID --value {u}") for u in UNITS}

    before = invocations()
    started = time.monotonic()
    subprocess.run(["docker", "restart", "--time", "60", CONTAINER], check=True, capture_output=True, timeout=180)
    deadline = time.monotonic() + 300  # ends once the target is active (about 30 s here)
    while host.run(f"systemctl is-active {PREFIX}.target").stdout.strip() != "active":
        assert time.monotonic() < deadline, host.run(f"systemctl list-units '{PREFIX}*' --no-pager").stdout
        time.sleep(1)
    took = _wait_serving(host)
    print(f"reboot to serving: {time.monotonic() - started:.1f} s (serving {took:.1f} s after the target)")
    after = invocations()
    assert all(after[u] and after[u] != before[u] for u in UNITS), (before, after)  # every unit started anew
    code, body = curl(host, f"{ROUTER}/workers", key=admin_key(host))
    assert code == 200, body
    assert sorted(w["url"] for w in json.loads(body)["workers"]) == \
        sorted(e["url"] for e in plan_on_host["cluster"]["engines"].values())
    # the router unit ran its reconcile at this start: its last line is the JSON result
    journal = host.check_output(f"journalctl _SYSTEMD_INVOCATION_ID={after[UNITS[2]]} --no-pager -o cat")
    results = [json.loads(line) for line in journal.splitlines() if line.startswith('{"changed"')]
    assert results and results[-1]["changed"] is False, journal[-3000:]
    put_plan(host, plan_on_host)
    rc, failed, report = run_verify(host, plan_on_host)
    assert (rc, failed) == (0, []), report["failures"]
