"""The model role against a real HF-compatible server (scenario model, issue 44): olah in
its offline mode (pdnode.standin.model_hub) on the Docker network's gateway, serving a
repository these tests make; `pdnode model lock` pins it; deploy.yml's model role puts it
on the 2P2D node. The server's own access log counts every file it served.

In file order: the first download, the no-change rerun, a flipped byte (found by a deep
run) and a deleted shard repaired, a new commit under load with no request lost, and the
way back to the previous commit without a download. Every test takes testinfra's `host`
(parametrized per host): pytest runs tests of one parameter together, so a test without it
would run after all the others, not in its place."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
from pathlib import Path

import host_load
import pytest
import yaml

from pdnode.core.inventory import model_source
from pdnode.standin.model_hub import CutRelay, Hub, commit_files

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[3]
CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-model")
REPO_ID = "pdnode/demo-moe"
# Not the demo's own directory (a hand copy the demo host preparation made): the role
# refuses to replace a directory it did not make.
MODEL_PATH = "/var/lib/sglang-pd-models/hub/demo-moe"
STORE = f"/var/lib/sglang-pd-models/hub/.pdnode-models/{REPO_ID.replace('/', '--')}"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
LOAD_DIR = "/var/tmp/pdnode-model-load"
MIN_REQUESTS = 20  # the change takes tens of seconds at the load's pace of several a second


def _files(seed: int) -> dict[str, bytes | Path]:
    rng = random.Random(seed)  # noqa: S311 -- reproducible test bytes, not a secret
    demo = REPO / "playbooks" / "files" / "demo-moe"
    out: dict[str, bytes | Path] = {name: demo / name for name in ("config.json", "tokenizer.json",
                                                                   "tokenizer_config.json")}
    out.update({name: rng.randbytes(4_000_000 + i) for i, name in enumerate(SHARDS)})
    return out


def _env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(PATH=f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '')}", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               PDNODE_CACHE_DIR=str(cache))
    return env


def _gateway() -> str:
    out = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.Gateway}} {{end}}",
                          CONTAINER], capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out, f"{CONTAINER} has no network gateway"
    return out[0]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    first = commit_files(root / "mirrors", REPO_ID, _files(1), "first")
    with Hub(root, host=_gateway()) as server:
        server.first = first
        yield server


@pytest.fixture(scope="module")
def model_inv(hub, tmp_path_factory):
    """The scenario's description with the model's source, and its lock beside it."""
    inv = tmp_path_factory.mktemp("inv-model")
    (inv / "host_vars").mkdir()
    (inv / "group_vars").symlink_to(REPO / "inventories" / "demo" / "group_vars")
    (inv / "hosts.yml").write_text(json.dumps({"all": {"hosts": {CONTAINER: {
        "ansible_connection": "community.docker.docker", "ansible_host": CONTAINER}}}}))
    base = yaml.safe_load((REPO / "molecule" / "model" / "host_vars" / "pdnode-mol-model.yml").read_text())
    base.update(pdnode_model_source=f"hf://{REPO_ID}@main", pdnode_model_endpoint=hub.url,
                pdnode_model_path=MODEL_PATH)
    (inv / "host_vars" / f"{CONTAINER}.yml").write_text(json.dumps(base))
    _cache(inv).mkdir()
    lock(inv)
    return inv


def _cache(inv: Path) -> Path:
    """The controller's model cache of these tests (beside the inventory, not in it)."""
    return inv.with_name(f"{inv.name}-cache")


def run(inv: Path, *argv: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=REPO, env=_env(_cache(inv)), capture_output=True, text=True,
                          timeout=timeout)


def lock(inv: Path, *extra: str) -> str:
    r = run(inv, str(REPO / ".venv/bin/pdnode"), "model", "lock", *extra, str(inv))
    assert r.returncode == 0, r.stderr
    print(r.stdout.strip())
    return r.stdout


def deploy(inv: Path, *extra: str) -> dict[str, int]:
    """deploy.yml; the play recap of the host ({ok, changed, ...})."""
    t0 = time.monotonic()
    r = run(inv, "ansible-playbook", "-i", str(inv), str(REPO / "playbooks" / "deploy.yml"), *extra)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    m = re.search(rf"^{re.escape(CONTAINER)}\s*:\s*(.*)$", r.stdout, re.M)
    assert m, r.stdout[-2000:]
    recap = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
    print(f"deploy {' '.join(extra) or ''}: {time.monotonic() - t0:.1f} s, {recap}")
    return recap


def new_downloads(hub, before) -> dict[str, int]:
    after = hub.downloads()
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def sha256_on_host(host, path: str) -> str:
    return host.check_output(f"sha256sum {path}").split()[0]


def test_the_first_deploy_downloads_each_file_once(host, hub, model_inv):
    locked = model_source.read_lock(model_inv / ".model.lock.json")
    assert locked is not None and locked.commit == hub.first
    before = hub.downloads()
    deploy(model_inv)
    assert new_downloads(hub, before) == {f.path: 1 for f in locked.files}
    assert host.check_output(f"readlink {MODEL_PATH}") == f"{STORE}/{hub.first}"
    shard = host.file(f"{MODEL_PATH}/{SHARDS[0]}")
    assert (shard.user, shard.group, shard.mode) == ("root", "sglang", 0o640)
    by_path = {f.path: f for f in locked.files}
    assert sha256_on_host(host, f"{MODEL_PATH}/{SHARDS[0]}") == by_path[SHARDS[0]].sha256
    # the engines run on it, and say which commit they started with
    env = host.check_output("cat /etc/sglang-pd/prefill-0.env")
    assert f"PDNODE_MODEL_COMMIT={hub.first}" in env
    r = run(model_inv, "ansible-playbook", "-i", str(model_inv), str(REPO / "playbooks" / "verify.yml"))
    assert r.returncode == 0, r.stdout[-4000:]


def test_a_rerun_with_nothing_changed_changes_nothing(host, hub, model_inv):
    before = hub.downloads()
    assert deploy(model_inv)["changed"] == 0
    assert new_downloads(hub, before) == {}


def test_a_flipped_byte_is_found_by_a_deep_run_and_repaired(host, hub, model_inv):
    target = f"{STORE}/{hub.first}/{SHARDS[1]}"
    want = sha256_on_host(host, target)
    # one bit, the file's mtime kept: what a plain run's stamp cannot see
    host.check_output(f"python3 -c \"import os; p='{target}'; s=os.stat(p); f=open(p,'r+b'); f.seek(4096); "
                      f"b=f.read(1); f.seek(4096); f.write(bytes([b[0]^1])); f.close(); "
                      f"os.utime(p, ns=(s.st_atime_ns, s.st_mtime_ns))\"")
    assert sha256_on_host(host, target) != want
    assert deploy(model_inv)["changed"] == 0
    before = hub.downloads()
    assert deploy(model_inv, "-e", "model_deep=true")["changed"] >= 1
    assert sha256_on_host(host, target) == want
    assert new_downloads(hub, before) == {SHARDS[1]: 1}


def test_a_deleted_shard_is_repaired_by_the_next_run(host, hub, model_inv):
    host.check_output(f"rm {STORE}/{hub.first}/{SHARDS[0]}")
    before = hub.downloads()
    assert deploy(model_inv)["changed"] >= 1
    assert host.file(f"{MODEL_PATH}/{SHARDS[0]}").size == 4_000_000
    assert new_downloads(hub, before) == {SHARDS[0]: 1}


def variant(model_inv: Path, tmp_path: Path, **changes) -> Path:
    """The model inventory with other values (its own lock and cache, beside it)."""
    inv = tmp_path / "inv-variant"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "group_vars").symlink_to(REPO / "inventories" / "demo" / "group_vars")
    (inv / "hosts.yml").write_text((model_inv / "hosts.yml").read_text())
    description = json.loads((model_inv / "host_vars" / f"{CONTAINER}.yml").read_text())
    (inv / "host_vars" / f"{CONTAINER}.yml").write_text(json.dumps({**description, **changes}))
    _cache(inv).mkdir()
    return inv


def failed_deploy(inv: Path) -> str:
    r = run(inv, "ansible-playbook", "-i", str(inv), str(REPO / "playbooks" / "deploy.yml"))
    assert r.returncode != 0, r.stdout[-3000:]
    return r.stdout


def test_unknown_and_refused_repositories_are_refused_in_one_line_before_any_host(host, hub, model_inv, tmp_path):
    commit_files(hub.mirrors, "gated/demo-moe", {"config.json": b"{}"}, "refused to every caller")
    for i, (source, says) in enumerate((("hf://pdnode/nothing@main", "has no repository pdnode/nothing"),
                         (f"hf://{REPO_ID}@no-such-branch", "has no revision 'no-such-branch'"),
                         ("hf://gated/demo-moe@main", "give pdnode_model_token_file"))):
        inv = variant(model_inv, tmp_path / str(i), pdnode_model_source=source)
        r = run(inv, str(REPO / ".venv/bin/pdnode"), "model", "lock", str(inv))
        assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (inv / ".model.lock.json").exists()


def test_a_disk_too_small_is_refused_before_any_byte_moves(host, hub, model_inv, tmp_path):
    commit_files(hub.mirrors, "pdnode/demo-moe-big", _files(5), "a model the disk has no room for")
    path = "/var/lib/sglang-pd-models/big/demo-moe"
    inv = variant(model_inv, tmp_path, pdnode_model_source="hf://pdnode/demo-moe-big@main", pdnode_model_path=path,
                  pdnode_model_reserve_gb=1e6)  # keep a petabyte free: no disk has room
    lock(inv)
    before = hub.downloads()
    out = failed_deploy(inv)
    assert "free space there, or set pdnode_model_path on a larger disk" in out and CONTAINER in out
    assert new_downloads(hub, before) == {}
    assert not host.file(path).exists


def test_a_download_cut_half_way_is_resumed_with_what_is_missing(host, hub, model_inv, tmp_path):
    files = _files(6)
    commit_files(hub.mirrors, "pdnode/demo-moe-cut", files, "a model whose second shard the link cuts")
    path = "/var/lib/sglang-pd-models/cut/demo-moe"
    relay = CutRelay(hub.port, SHARDS[1], host=hub.host)
    try:
        inv = variant(model_inv, tmp_path, pdnode_model_source="hf://pdnode/demo-moe-cut@main",
                      pdnode_model_endpoint=relay.url, pdnode_model_path=path)
        lock(inv)
        out = failed_deploy(inv)
    finally:
        relay.close()
    assert SHARDS[1] in out and "files already downloaded are kept" in out
    assert not host.file(path).exists  # never a half-written model at the path
    description = json.loads((inv / "host_vars" / f"{CONTAINER}.yml").read_text())
    (inv / "host_vars" / f"{CONTAINER}.yml").write_text(json.dumps({**description, "pdnode_model_endpoint": hub.url}))
    before = hub.downloads()
    deploy(inv)
    got = new_downloads(hub, before)
    assert SHARDS[0] not in got and got.get(SHARDS[1]) == 1, got  # the first shard was kept
    assert host.check_output(f"sha256sum {path}/{SHARDS[1]}").split()[0] == next(
        f.sha256 for f in model_source.read_lock(inv / ".model.lock.json").files if f.path == SHARDS[1])
    deploy(model_inv)  # the scenario's own model back


def _engine_pids(host) -> dict[str, str]:
    units = ["prefill-0", "prefill-1", "decode-0", "decode-1"]
    return {u: host.check_output(f"systemctl show -p MainPID --value sglang-pd-{u}.service") for u in units}


def test_a_new_commit_under_load_loses_no_request(host, hub, model_inv):
    second = commit_files(hub.mirrors, REPO_ID, _files(2), "second")
    hub.second = second
    assert f"was {hub.first}" in lock(model_inv, "--update")
    pids = _engine_pids(host)
    host_load.start(host, LOAD_DIR, "--clients", "4", "--stream", "--interval", "0")
    try:
        time.sleep(host_load.CHANGE_AFTER_S)
        deploy(model_inv)
    finally:
        host_load.stop(host, LOAD_DIR)
    result = host_load.result(host, LOAD_DIR)
    print(f"the commit change under load: {result.get('counts', result)}")
    assert host_load.zero_drop(result, MIN_REQUESTS) == [], result
    assert host.check_output(f"readlink {MODEL_PATH}") == f"{STORE}/{second}"
    after = _engine_pids(host)
    assert all(after[u] != pids[u] for u in pids), (pids, after)  # every engine restarted on the new files
    assert host.file(f"{STORE}/{hub.first}").is_directory  # the previous commit stays for the way back


def test_back_to_the_previous_commit_downloads_nothing(host, hub, model_inv):
    vars_file = model_inv / "host_vars" / f"{CONTAINER}.yml"
    description = json.loads(vars_file.read_text())
    description["pdnode_model_source"] = f"hf://{REPO_ID}@{hub.first}"
    vars_file.write_text(json.dumps(description))
    lock(model_inv)
    before = hub.downloads()
    deploy(model_inv)
    assert host.check_output(f"readlink {MODEL_PATH}") == f"{STORE}/{hub.first}"
    shards = {k: v for k, v in new_downloads(hub, before).items() if k.endswith(".safetensors")}
    assert shards == {}
    assert f"PDNODE_MODEL_COMMIT={hub.first}" in host.check_output("cat /etc/sglang-pd/decode-1.env")


def test_the_checksums_on_the_host_are_the_locks(host, model_inv):
    locked = model_source.read_lock(model_inv / ".model.lock.json")
    for f in locked.files:
        if f.sha256:
            assert sha256_on_host(host, f"{MODEL_PATH}/{f.path}") == f.sha256, f.path


def test_a_model_change_that_does_not_start_is_rolled_back_by_the_upgrade(host, hub, model_inv):
    """A new commit whose config.json SGLang refuses (the stand-in refuses it the same way):
    playbooks/upgrade.yml downloads it beside, switches, the first engine does not start,
    and it goes back to the commit that served, kept on the host (nothing downloaded)."""
    serving = host.check_output(f"readlink {MODEL_PATH}").rsplit("/", 1)[-1]
    broken = commit_files(hub.mirrors, REPO_ID, {"config.json": b"{broken"}, "a config SGLang refuses")
    vars_file = model_inv / "host_vars" / f"{CONTAINER}.yml"
    description = json.loads(vars_file.read_text())
    description["pdnode_model_source"] = f"hf://{REPO_ID}@main"
    vars_file.write_text(json.dumps(description))
    assert f"is commit {broken}" in lock(model_inv, "--update")
    t0 = time.monotonic()
    r = run(model_inv, "ansible-playbook", "-i", str(model_inv), str(REPO / "playbooks" / "upgrade.yml"))
    took = time.monotonic() - t0
    report = json.loads((REPO / ".cache" / "upgrade" / f"{CONTAINER}.json").read_text())
    print(f"the bad commit's upgrade: {report['outcome']} in {took:.0f} s, steps "
          f"{[(s['name'], s['ok']) for s in report['steps']]}, failed requests {report['failed_requests']}")
    assert r.returncode != 0 and report["outcome"] == "rolled_back", r.stdout[-4000:]
    assert (report["from_model"], report["to_model"]) == (serving, broken)
    assert host.check_output(f"readlink {MODEL_PATH}") == f"{STORE}/{serving}"
    assert f"PDNODE_MODEL_COMMIT={serving}" in host.check_output("cat /etc/sglang-pd/prefill-0.env")
    assert report["verify"]["reverify"]["passed"], report["verify"]
