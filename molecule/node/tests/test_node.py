"""The whole node on the demo description, checked through its public surface.

Runs after converge and idempotence. The kill -9 tests come last (file order) and
print their recovery times (`pytest -s` or the molecule log shows them).
"""

import json
import time

import pytest

PREFIX = "sglang-pd"
UNITS = [f"{PREFIX}-prefill.service", f"{PREFIX}-decode.service", f"{PREFIX}-router.service"]
ROUTER = "http://127.0.0.1:8000"


def curl(host, url, data=None, timeout=20):
    cmd = f"curl -sS --max-time {timeout} -w '\\n%{{http_code}}' "
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


def test_router_ordered_after_both_workers(host):
    after = host.check_output(f"systemctl show -p After --value {PREFIX}-router.service").split()
    assert f"{PREFIX}-prefill.service" in after and f"{PREFIX}-decode.service" in after
    started = {u: int(host.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {u}"))
               for u in UNITS}
    assert started[UNITS[2]] > started[UNITS[0]] and started[UNITS[2]] > started[UNITS[1]]


@pytest.mark.parametrize("unit", UNITS)
def test_security_exposure_at_most_4(host, unit):
    out = host.check_output(f"systemd-analyze security --no-pager {unit} | tail -n 1")
    # e.g. "→ Overall exposure level for sglang-pd-prefill.service: 2.1 OK :-)"
    score = float(out.split(":")[1].split()[0])
    print(f"exposure {unit}: {score}")
    assert score <= 4.0, out


def test_api_key_never_on_a_command_line(host):
    for unit in UNITS:
        pid = host.check_output(f"systemctl show -p MainPID --value {unit}")
        cmdline = host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        assert "api-key " not in cmdline and "api_key" not in cmdline


def test_router_lists_one_prefill_and_one_decode(host):
    code, body = curl(host, f"{ROUTER}/workers")
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


def _wait_serving(host, deadline_s=60):
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
    unit = f"{PREFIX}-{role}.service"
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
    """Decision (docs/decisions.md): decode is PartOf prefill and restarts with it."""
    before = host.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {UNITS[1]}")
    host.check_output(f"systemctl restart {UNITS[0]}")
    after = host.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {UNITS[1]}")
    assert int(after) > int(before)
    _wait_serving(host)
