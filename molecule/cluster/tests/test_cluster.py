"""One layout over three hosts (inventories/demo-cluster), checked from outside and
across the hosts after converge and idempotence (which proves a no-change re-run
changes nothing on any host).

Proves (issue 12): each host runs only its part; the router on its own host registers
and serves the workers on the other hosts (a real completion from a fourth container);
the firewall admits the layout's peers to the engines' ports and drops everyone else
(the router's port stays public); `playbooks/verify.yml` passes across the hosts;
`pdnode collect` and `pdnode bench` cover every host; the model comes from its name with one
download for the layout (issue 44); a kill -9 of the remote decode is
repaired by systemd and the node serves again; with the decode host cut off the
network, verify fails naming that host, and once it is back the node serves and
verifies again; `playbooks/upgrade.yml` switches the hosts one at a time, each verifying
the whole layout. The times are printed (`pytest -s`, the molecule log) and recorded in
docs/measurements.md.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import testinfra

REPO = Path(__file__).resolve().parents[3]
INVENTORY = REPO / "inventories" / "demo-cluster"
NETWORK = "pdnode-cluster"
ADDRESS = {"pd-prefill": "172.28.61.11", "pd-decode": "172.28.61.12", "pd-router": "172.28.61.13"}
ROUTER = f"http://{ADDRESS['pd-router']}:8000"
PREFIX = "sglang-pd"
KEY = (REPO / "molecule" / "node" / "files" / "test-api-key").read_text().strip()
LOAD = "/var/tmp/pdnode-upgrade-load"  # on pd-router: probe.py, loadgen.py, result.json, pid
# the per-pair probe's timer runs beside the router, and only there
RUNS = {"pd-prefill": [f"{PREFIX}-prefill-0.service"], "pd-decode": [f"{PREFIX}-decode-0.service"],
        "pd-router": [f"{PREFIX}-router.service", f"{PREFIX}-pair-probe.timer"]}


def on(name: str):
    return testinfra.get_host(f"docker://{name}")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    return env


def playbook(path: str, *extra: str, timeout: int = 900) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(["ansible-playbook", "-i", str(INVENTORY), str(REPO / path), *extra], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def recap(stdout: str) -> dict[str, dict[str, int]]:
    out = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.M):
        out[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    return out


def connect(src: str, address: str, port: int, timeout_s: float = 3.0) -> str:
    """What a TCP connect from container SRC meets: open, refused or timeout."""
    code = ("import socket\n"
            f"s = socket.socket(); s.settimeout({timeout_s})\n"
            f"try:\n    s.connect(({address!r}, {port})); print('open')\n"
            "except socket.timeout:\n    print('timeout')\n"
            "except ConnectionRefusedError:\n    print('refused')\n"
            "except OSError as e:\n    print('error', e.errno)\n")
    return on(src).check_output(f"python3 -c {shlex.quote(code)}")


def completion(src: str = "outsider", key: str | None = KEY, timeout_s: int = 20) -> tuple[int, str]:
    body = {"model": "demo-moe", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    cmd = f"curl -sS --max-time {timeout_s} -w '\\n%{{http_code}}' -H 'Content-Type: application/json' "
    if key:
        cmd += f"-H 'Authorization: Bearer {key}' "
    result = on(src).run(cmd + f"-d '{json.dumps(body)}' {ROUTER}/v1/chat/completions")
    if result.rc != 0:
        return 0, result.stderr
    text, _, code = result.stdout.rpartition("\n")
    return int(code), text


def serves_again(deadline_s: float) -> float:
    """Seconds until a completion through the router succeeds again (fails at the deadline)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        status, _ = completion(timeout_s=10)
        if status == 200:
            return time.monotonic() - t0
        time.sleep(1)
    pytest.fail(f"the node did not serve again within {deadline_s:.0f} s")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_host_runs_only_its_part(name):
    host = on(name)
    for unit in RUNS[name]:
        assert host.service(unit).is_running, unit
    others = {u for h, units in RUNS.items() if h != name for u in units}
    for unit in others:
        assert not host.file(f"/etc/systemd/system/{unit}").exists, f"{unit} rendered on {name}"
    assert host.service(f"{PREFIX}-firewall.service").is_running


def test_the_pair_probe_beside_the_router_serves_the_pair_across_hosts():
    router = on("pd-router")
    router.check_output(f"systemctl start {PREFIX}-pair-probe.service")  # a oneshot: returns when done
    text = router.check_output(f"cat /var/lib/{PREFIX}-metrics/pairs.prom")
    assert 'pdnode_pair_probe_success{prefill="prefill-0",decode="decode-0"} 1' in text, text


def test_workers_listen_on_their_hosts_address_only():
    assert on("pd-prefill").socket(f"tcp://{ADDRESS['pd-prefill']}:30000").is_listening
    assert on("pd-prefill").socket(f"tcp://{ADDRESS['pd-prefill']}:8998").is_listening
    assert on("pd-decode").socket(f"tcp://{ADDRESS['pd-decode']}:30001").is_listening
    assert not on("pd-prefill").socket("tcp://0.0.0.0:30000").is_listening


def test_a_client_elsewhere_is_served_through_the_router_with_the_key_only():
    status, text = completion()
    assert status == 200, text
    answer = json.loads(text)["choices"][0]["message"]["content"]
    assert answer.strip(), text
    status, _ = completion(key=None)
    assert status == 401


def test_the_firewall_admits_peers_and_drops_everyone_else():
    # the outsider: the router's port only
    assert connect("outsider", ADDRESS["pd-router"], 8000) == "open"
    for name, port in (("pd-prefill", 30000), ("pd-prefill", 8998), ("pd-decode", 30001)):
        assert connect("outsider", ADDRESS[name], port) == "timeout", f"outsider reached {name}:{port}"
    # the peers: the engines' ports
    assert connect("pd-router", ADDRESS["pd-prefill"], 30000) == "open"
    assert connect("pd-decode", ADDRESS["pd-prefill"], 8998) == "open"
    assert connect("pd-router", ADDRESS["pd-decode"], 30001) == "open"


def test_verify_passes_across_hosts():
    proc, took = playbook("playbooks/verify.yml")
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.loads((REPO / ".cache" / "verify" / "pd-router.json").read_text())
    ids = {c["id"]: c["status"] for c in report["checks"]}
    assert ids["prefill-0"] == "PASS" and ids["decode-0"] == "PASS" and ids["completion"] == "PASS", ids
    assert ids["disaggregation.prefill-0"] == "PASS" and ids["disaggregation.decode-0"] == "PASS", ids
    # the other hosts checked their own units only
    assert set(recap(proc.stdout)) == set(RUNS)
    print(f"\nthree-host cluster: verify {took:.0f} s")


def _env_for_pdnode() -> dict:
    env = _env()
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def _inventory_with(tmp_path: Path, **variables) -> Path:
    """inventories/demo-cluster with more variables on every host (host_vars)."""
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "group_vars").symlink_to(INVENTORY / "group_vars")
    (inv / "hosts.yml").write_text((INVENTORY / "hosts.yml").read_text())
    extra = "".join(f"{k}: {json.dumps(v)}\n" for k, v in variables.items())
    for name in RUNS:
        (inv / "host_vars" / f"{name}.yml").write_text((INVENTORY / "host_vars" / f"{name}.yml").read_text() + extra)
    return inv


def test_collect_gathers_every_host_of_the_layout(tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "pdnode"), "collect", str(INVENTORY), "--out", str(tmp_path)],
                          cwd=REPO, env=_env_for_pdnode(), capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (bundle,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(bundle) as tar:
        root = bundle.name.removesuffix(".tar.gz")
        manifest = json.loads(tar.extractfile(f"{root}/MANIFEST.json").read())
        names = set(tar.getnames())
    assert sorted((h["host"], h["status"]) for h in manifest["hosts"]) == [
        (h, "collected") for h in sorted(RUNS)]
    for name, units in RUNS.items():
        for unit in units:
            assert f"{root}/{name}/journal/{unit}.txt" in names, (name, unit)
    print(f"\npdnode collect over three hosts: {took:.1f} s")


def test_bench_drives_the_router_host_and_counts_work_on_every_host(tmp_path):
    # pdnode bench refuses a key file others can read (git checks it out 0644): a private copy
    key = tmp_path / "api-key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    inv = _inventory_with(tmp_path, pdnode_api_key_file=str(key))
    out = tmp_path / "bench.json"
    # the per-pair probe's one request a minute is other traffic to the engines' counters:
    # stopped for the run, as docs/bench.md tells an operator who wants exact counts
    probe = f"{PREFIX}-pair-probe"
    on("pd-router").check_output(f"systemctl stop {probe}.timer {probe}.service")
    try:
        proc = subprocess.run([str(REPO / ".venv" / "bin" / "pdnode"), "bench", str(inv), "--requests", "24",
                               "--concurrency", "4", "--input-len", "128", "--output-len", "8", "--json", "--out",
                               str(out)], cwd=REPO, env=_env_for_pdnode(), capture_output=True, text=True, timeout=600)
    finally:
        on("pd-router").check_output(f"systemctl start {probe}.timer")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    report = json.loads(out.read_text())
    assert report["host"] == "pd-router" and report["results"]["completed"] == 24
    work = report["instances"]
    assert work["prefill-0"]["requests"] == 24 and work["decode-0"]["requests"] == 24, work
    assert report["notes"] == [], report["notes"]


def test_kill_9_of_the_remote_decode_is_repaired():
    decode = on("pd-decode")
    unit = RUNS["pd-decode"][0]
    pid = decode.check_output(f"systemctl show -p MainPID --value {unit}")
    assert pid != "0"
    t0 = time.monotonic()
    decode.run(f"kill -9 {pid}")
    back = serves_again(120)
    new = decode.check_output(f"systemctl show -p MainPID --value {unit}")
    assert new not in ("0", pid)
    print(f"\nkill -9 of decode-0 on pd-decode: serving again after {time.monotonic() - t0:.0f} s "
          f"(first good completion {back:.0f} s after the kill)")


def _docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=60)


def test_verify_names_the_unreachable_host_and_the_node_recovers_when_it_is_back():
    _docker("network", "disconnect", NETWORK, "pd-decode")
    try:
        proc, took = playbook("playbooks/verify.yml", "-e", "verify_skip_burst=true")
        assert proc.returncode != 0, "verify passed with the decode host cut off"
        report = json.loads((REPO / ".cache" / "verify" / "pd-router.json").read_text())
        failed = [c for c in report["checks"] if c["status"] == "FAIL"]
        decode = next((c for c in failed if c["id"] == "decode-0"), None)
        assert decode is not None, [c["id"] for c in failed]
        assert "on pd-decode" in decode["evidence"], decode
        print(f"\ndecode host cut off: verify failed in {took:.0f} s naming it: {decode['evidence']}")
    finally:
        _docker("network", "connect", "--ip", ADDRESS["pd-decode"], NETWORK, "pd-decode")
    back = serves_again(180)
    proc, took = playbook("playbooks/verify.yml", "-e", "verify_skip_burst=true")
    assert proc.returncode == 0, proc.stdout[-3000:]
    print(f"decode host back: serving after {back:.0f} s, verify passed in {took:.0f} s")


def test_one_download_per_layout_the_other_engine_host_copies_from_the_first(tmp_path):
    """The model from its name on the three hosts (issue 44): olah on the network's gateway
    serves the repository; pd-decode (the first engine host by name) downloads it, serves
    it to pd-prefill, which copies and verifies it; the router's host gets none. The
    server counts one download of each file for the whole layout."""
    import random

    from pdnode.core.inventory import model_source
    from pdnode.standin.model_hub import Hub, commit_files

    # the controller as the hosts reach it: their network's gateway (as the container sees it)
    gateway = subprocess.run(["docker", "inspect", "-f", f"{{{{(index .NetworkSettings.Networks \"{NETWORK}\").Gateway}}}}",
                              "pd-decode"], capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert gateway, f"pd-decode has no gateway on {NETWORK}"
    rng = random.Random(7)  # noqa: S311 -- reproducible test bytes, not a secret
    demo = REPO / "playbooks" / "files" / "demo-moe"
    files = {n: demo / n for n in ("config.json", "tokenizer.json", "tokenizer_config.json")}
    files["model.safetensors"] = rng.randbytes(3_000_000)
    commit_files(tmp_path / "hub" / "mirrors", "pdnode/demo-moe", files, "first")
    path = "/var/lib/sglang-pd-models/hub/demo-moe"
    with Hub(tmp_path / "hub", host=gateway) as hub:
        inv = _inventory_with(tmp_path, pdnode_model_source="hf://pdnode/demo-moe@main",
                              pdnode_model_endpoint=hub.url, pdnode_model_path=path)
        env = {**_env(), "PDNODE_CACHE_DIR": str(tmp_path / "cache")}
        lock_run = subprocess.run([str(REPO / ".venv/bin/pdnode"), "model", "lock", str(inv)], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=300)
        assert lock_run.returncode == 0, lock_run.stderr
        lock = model_source.read_lock(inv / ".model.lock.json")
        before = hub.downloads()  # the lock fetched config.json for the controller's cache
        t0 = time.monotonic()
        for book in ("playbooks/firewall.yml", "playbooks/deploy.yml"):  # the share port opens on the seed
            proc = subprocess.run(["ansible-playbook", "-i", str(inv), str(REPO / book)], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, proc.stdout[-5000:]
        took = time.monotonic() - t0
        after = hub.downloads()
        assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} == {
            f.path: 1 for f in lock.files}
    shard = next(f for f in lock.files if f.path == "model.safetensors")
    for name in ("pd-decode", "pd-prefill"):
        host = on(name)
        assert host.check_output(f"readlink {path}").endswith(f"/pdnode--demo-moe/{lock.commit}"), name
        assert host.check_output(f"sha256sum {path}/model.safetensors").split()[0] == shard.sha256, name
    assert not on("pd-router").file(path).exists
    assert not on("pd-decode").run(f"systemctl is-active {PREFIX}-model-share.service").succeeded
    print(f"one download for the layout, copied to the other engine host and verified: {took:.0f} s "
          "(firewall and deploy)")
    # the layout's own description back for the tests after this one
    for book in ("playbooks/firewall.yml", "playbooks/deploy.yml"):
        proc, _ = playbook(book)
        assert proc.returncode == 0, proc.stdout[-5000:]


# Last: it leaves the hosts on another release.
def test_upgrade_switches_one_host_at_a_time_verifying_the_layout_from_each(tmp_path):
    from pdnode.core.inventory.fields import BY_NAME

    # A new release: another Mooncake CUDA 13 pin (the stand-in does not install it), so a
    # new release directory on every host with the serving release's packages.
    new_pin = BY_NAME["pdnode_mooncake_cuda13_version"].default + ".post1"
    inv = _inventory_with(tmp_path, pdnode_mooncake_cuda13_version=new_pin)
    router_unit = RUNS["pd-router"][0]
    router_since = on("pd-router").check_output(f"systemctl show -p MainPID -p ActiveEnterTimestamp {router_unit}")
    # Steady load beside the upgrade's own prober: 3 loops through the router, one
    # completion every 0.5 s each, every second streaming (as the day-2 scenario's; 4 loops
    # every 0.1 s cost ~200 CPU-s of the three containers' for a number not asserted);
    # the probe with the load generator it imports beside it, as the upgrade lays them.
    for name, src in (("probe.py", "upgrade_probe.py"), ("loadgen.py", "loadgen.py")):
        data = base64.b64encode((REPO / "src" / "pdnode" / "node" / src).read_bytes()).decode()
        on("pd-router").check_output(f"mkdir -p {LOAD} && echo {data} | base64 -d > {LOAD}/{name}")
    on("pd-router").check_output(f"rm -f {LOAD}/result.json; "
                                 f"nohup python3 {LOAD}/probe.py --url http://127.0.0.1:8000 --model demo-moe "
                                 f"--key-file /etc/sglang-pd/api-key --out {LOAD}/result.json --clients 3 --stream "
                                 f"--interval 0.5 --timeout 60 > /dev/null 2>&1 & echo $! > {LOAD}/pid")
    t0 = time.monotonic()
    try:
        # the prober every 0.25 s (its outages are printed, not asserted): CPU the CI lacks;
        # the layout's one prefill and one decode restart: a window accepted (issue 45)
        proc = subprocess.run(["ansible-playbook", "-i", str(inv), str(REPO / "playbooks" / "upgrade.yml"),
                               "-e", "upgrade_probe_interval_s=0.25", "-e", '{"pdnode_allow_unavailable": true}'],
                              cwd=REPO, env=_env(), capture_output=True, text=True, timeout=1500)
    finally:
        on("pd-router").run(f"kill -TERM $(cat {LOAD}/pid)")
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-5000:]
    # serial: 1 -- the play runs once per host, one batch after the other
    assert proc.stdout.count("PLAY [Upgrade the PD node, rolling back on failure]") == 3
    for name in RUNS:
        report = json.loads((REPO / ".cache" / "upgrade" / f"{name}.json").read_text())
        assert report["outcome"] == "upgraded", (name, report)
        assert report["verify"]["verify"] == {"passed": True, "failed_checks": []}, (name, report["verify"])
        assert report["to_venv"].endswith(f"-cu13-{new_pin}"), report["to_venv"]
        for unit in RUNS[name]:
            # a timer runs nothing itself: the per-pair probe's service is what it starts
            unit = unit.removesuffix(".timer") + ".service" if unit.endswith(".timer") else unit
            exec_start = on(name).check_output(f"systemctl show -p ExecStart --value {unit}")
            if unit in (router_unit, f"{PREFIX}-pair-probe.service"):
                # the router (and the probe beside it) runs from its own venv (package and
                # version): the release that keeps the router leaves it running, the same process
                assert "/venvs/router-" in exec_start, exec_start
                continue
            assert f"-cu13-{new_pin}/bin/python" in exec_start, (name, unit)
        print(f"\nupgrade of {name}: failed probe requests {report['failed_requests']} of "
              f"{report['probe']['requests']}, longest outage {report['longest_outage_s']} s")
    print(f"upgrade of the three hosts, one at a time: {took:.0f} s")
    end = time.monotonic() + 120  # the load writes its result once its last requests end
    while not on("pd-router").run(f"test -s {LOAD}/result.json").succeeded:
        assert time.monotonic() < end, "the load wrote no result"
        time.sleep(0.5)
    load = json.loads(on("pd-router").check_output(f"cat {LOAD}/result.json"))
    # 1P1D: the prefill's and the decode's switches are outages; a benchmark, not asserted
    print("load during the upgrade (3 clients every 0.5 s, half streaming): " + json.dumps(
        {k: load[k] for k in ("requests", "ok", "failed", "failures", "codes", "duration_s", "longest_gap_s",
                              "outages")}))
    assert load["requests"] > 0
    assert on("pd-router").check_output(
        f"systemctl show -p MainPID -p ActiveEnterTimestamp {router_unit}") == router_since
    status, text = completion()
    assert status == 200, text
