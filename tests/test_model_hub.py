"""The model's way from a name to the hosts, against a real HF-compatible server (olah,
offline, on the loopback) serving repositories the tests make: `pdnode model lock`
(huggingface_hub on the controller) and pdnode.node.model_fetch (huggingface_hub on the
host). The server's own access log counts what was downloaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdnode.core.inventory import model_source
from pdnode.standin.model_hub import CutRelay, Hub, commit_files, free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(__file__).parent / "fixtures" / "models"
PDNODE = [sys.executable, "-m", "pdnode.commands.cli"]


def _shards(seed: int) -> dict[str, bytes]:
    rng = __import__("random").Random(seed)
    return {"config.json": (MODELS / "meta-llama--Meta-Llama-3.1-8B" / "config.json").read_bytes(),
            "tokenizer.json": b'{"version": "1.0"}',
            "model-00001-of-00002.safetensors": rng.randbytes(3_000_000),
            "model-00002-of-00002.safetensors": rng.randbytes(2_000_000)}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    first = commit_files(root / "mirrors", "org/tiny", _shards(1), "first")
    with Hub(root) as server:
        server.first = first
        yield server


def _run(*argv, env=None):
    return subprocess.run([*argv], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def inventory(tmp_path, hub):
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "gpu01", inv)
    (inv / "group_vars" / "all" / "model.yml").write_text(
        f"pdnode_model_source: hf://org/tiny@main\npdnode_model_endpoint: {hub.url}\n")
    return inv


def test_lock_pins_the_branch_and_fills_the_cache(inventory, hub, tmp_path):
    env = {"PDNODE_CACHE_DIR": str(tmp_path / "cache")}
    r = _run(*PDNODE, "model", "lock", str(inventory), env=env)
    assert r.returncode == 0, r.stderr
    lock = model_source.read_lock(inventory / ".model.lock.json")
    assert lock is not None and lock.commit == hub.first and "wrote" in r.stdout
    sizes = {f.path: (f.size, f.sha256 is not None) for f in lock.files}
    assert sizes["model-00001-of-00002.safetensors"] == (3_000_000, True)
    assert sizes["config.json"][1] is False  # not an LFS file: checked by size
    cache = tmp_path / "cache" / "models" / "org--tiny" / hub.first
    assert (cache / "config.json").read_bytes() == _shards(1)["config.json"]
    # a second run needs nothing from the endpoint's files
    before = hub.downloads()
    again = _run(*PDNODE, "model", "lock", str(inventory), env=env)
    assert again.returncode == 0 and again.stdout.startswith("current:")
    assert hub.downloads() == before


def test_a_moved_branch_moves_the_lock_only_when_asked(inventory, hub, tmp_path):
    env = {"PDNODE_CACHE_DIR": str(tmp_path / "cache")}
    assert _run(*PDNODE, "model", "lock", str(inventory), env=env).returncode == 0
    second = commit_files(hub.mirrors, "org/tiny", {"tokenizer.json": b'{"version": "2.0"}'}, "second")
    try:
        assert _run(*PDNODE, "model", "lock", str(inventory), env=env).stdout.startswith("current:")
        assert model_source.read_lock(inventory / ".model.lock.json").commit == hub.first
        r = _run(*PDNODE, "model", "lock", "--update", str(inventory), env=env)
        assert r.returncode == 0 and f"was {hub.first}" in r.stdout
        assert model_source.read_lock(inventory / ".model.lock.json").commit == second
    finally:  # the branch back where the other tests expect it
        subprocess.run(["git", "reset", "-q", "--hard", hub.first], cwd=hub.mirrors / "models" / "org/tiny",
                       check=True)


@pytest.mark.parametrize(("source", "says"), [
    ("hf://org/nothing@main", "has no repository org/nothing"),
    ("hf://org/tiny@no-such-branch", "has no revision 'no-such-branch'"),
])
def test_unknown_repositories_and_revisions_are_refused_in_one_line(inventory, hub, tmp_path, source, says):
    (inventory / "group_vars" / "all" / "model.yml").write_text(
        f"pdnode_model_source: {source}\npdnode_model_endpoint: {hub.url}\n")
    r = _run(*PDNODE, "model", "lock", str(inventory), env={"PDNODE_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr and not (inventory / ".model.lock.json").exists()


def test_a_repository_refused_to_the_caller_says_what_to_give_and_never_shows_the_token(inventory, hub, tmp_path):
    commit_files(hub.mirrors, "gated/model", {"config.json": b"{}"}, "gated")
    (inventory / "group_vars" / "all" / "model.yml").write_text(
        f"pdnode_model_source: hf://gated/model@main\npdnode_model_endpoint: {hub.url}\n")
    env = {"PDNODE_CACHE_DIR": str(tmp_path / "cache")}
    r = _run(*PDNODE, "model", "lock", str(inventory), env=env)
    assert r.returncode == 1 and "give pdnode_model_token_file" in r.stderr, r.stderr
    token = tmp_path / "hf-token"
    token.write_text("hf_notAcceptedHere123\n")
    token.chmod(0o600)
    with (inventory / "group_vars" / "all" / "model.yml").open("a") as fh:
        fh.write(f"pdnode_model_token_file: {token}\n")
    r = _run(*PDNODE, "model", "lock", str(inventory), env=env)
    assert r.returncode == 1 and "the token cannot see it" in r.stderr, r.stderr
    assert "hf_notAcceptedHere123" not in r.stderr + r.stdout
    assert not (inventory / ".model.lock.json").exists()


def test_an_unreachable_endpoint_is_named(inventory, tmp_path):
    (inventory / "group_vars" / "all" / "model.yml").write_text(
        f"pdnode_model_source: hf://org/tiny@main\npdnode_model_endpoint: http://127.0.0.1:{free_port()}\n")
    r = _run(*PDNODE, "model", "lock", str(inventory), env={"PDNODE_CACHE_DIR": str(tmp_path / "cache"),
                                                            "HF_HUB_ETAG_TIMEOUT": "2"})
    assert r.returncode == 1 and "pdnode_model_endpoint=" in r.stderr and "reaches it" in r.stderr


# --- the host side ------------------------------------------------------------------------

def _lock_of(hub, tmp_path, commit):
    from pdnode.commands.model import resolve
    return resolve(model_source.parse(f"hf://org/tiny@{commit}"), hub.url, False)


def _fetch(tmp_path, spec):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-m", "pdnode.node.model_fetch", str(path)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "HF_HUB_ETAG_TIMEOUT": "5"})
    return r.returncode, json.loads(r.stdout)


def _new(counter_after, counter_before):
    return {k: counter_after[k] - counter_before.get(k, 0) for k in counter_after if counter_after[k] != counter_before.get(k, 0)}


def test_download_rerun_repair_and_switch(hub, tmp_path):
    lock = _lock_of(hub, tmp_path, hub.first)
    path = tmp_path / "host" / "models" / "tiny"
    spec = {"lock": lock.as_dict(), "path": str(path), "endpoint": hub.url}
    before = hub.downloads()
    rc, out = _fetch(tmp_path, spec)
    assert rc == 0 and out["changed"] and out["switched"] and out["verified"] == "sha256"
    assert _new(hub.downloads(), before) == {f.path: 1 for f in lock.files}
    shard = path / "model-00001-of-00002.safetensors"
    assert shard.read_bytes() == _shards(1)["model-00001-of-00002.safetensors"]
    assert path.is_symlink() and oct(shard.stat().st_mode & 0o777) == "0o640"

    # nothing changed: the stamp answers, the server is not asked
    before = hub.downloads()
    rc, out = _fetch(tmp_path, spec)
    assert (rc, out["changed"], out["verified"]) == (0, False, "stamp") and hub.downloads() == before

    # a flipped byte with the mtime kept: the stamp cannot see it, a deep run finds and repairs it
    real = shard.resolve()
    st = real.stat()
    data = bytearray(real.read_bytes())
    data[12345] ^= 0x01
    real.write_bytes(bytes(data))
    os.utime(real, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _fetch(tmp_path, spec)[1]["changed"] is False
    rc, out = _fetch(tmp_path, {**spec, "deep": True})
    assert rc == 0 and out["repaired"] == {"model-00001-of-00002.safetensors": "sha256 differs from the lock's"}
    assert shard.read_bytes() == _shards(1)["model-00001-of-00002.safetensors"]

    # a deleted shard: the stamp no longer holds, the plain run repairs that file only
    (path / "model-00002-of-00002.safetensors").unlink()
    before = hub.downloads()
    rc, out = _fetch(tmp_path, spec)
    assert rc == 0 and out["repaired"] == {"model-00002-of-00002.safetensors": "missing"}
    assert _new(hub.downloads(), before) == {"model-00002-of-00002.safetensors": 1}

    # a new commit: downloaded beside, switched, the old one kept for a rollback
    second = commit_files(hub.mirrors, "org/tiny", _shards(2), "second")
    third = None
    try:
        rc, out = _fetch(tmp_path, {**spec, "lock": _lock_of(hub, tmp_path, second).as_dict()})
        assert rc == 0 and out["switched"] and out["previous"] == hub.first
        assert os.readlink(path).endswith(second) and (path.parent / ".pdnode-models" / "org--tiny" / hub.first).is_dir()
        third = commit_files(hub.mirrors, "org/tiny", _shards(3), "third")
        rc, out = _fetch(tmp_path, {**spec, "lock": _lock_of(hub, tmp_path, third).as_dict()})
        assert rc == 0 and hub.first in out["removed"] and out["previous"] == second
        assert sorted(p.name for p in (path.parent / ".pdnode-models" / "org--tiny").iterdir()) == sorted(
            [second, third, f"{second}.stamp.json", f"{third}.stamp.json", "state.json"])
    finally:
        subprocess.run(["git", "reset", "-q", "--hard", hub.first], cwd=hub.mirrors / "models" / "org/tiny",
                       check=True)


def test_a_disk_too_small_is_refused_before_any_byte_moves(hub, tmp_path):
    lock = _lock_of(hub, tmp_path, hub.first)
    path = tmp_path / "host" / "tiny"
    free = shutil.disk_usage(tmp_path).free
    before = hub.downloads()
    rc, out = _fetch(tmp_path, {"lock": lock.as_dict(), "path": str(path), "endpoint": hub.url,
                                "reserve_bytes": free})
    assert rc == 1 and "needs 0.01 GB" in out["error"] and "free space there" in out["error"]
    assert hub.downloads() == before and not path.exists()


def test_an_interrupted_download_resumes_with_what_is_missing(hub, tmp_path):
    lock = _lock_of(hub, tmp_path, hub.first)
    path = tmp_path / "host" / "tiny"
    relay = CutRelay(hub.port, "model-00002-of-00002.safetensors")
    try:
        rc, out = _fetch(tmp_path, {"lock": lock.as_dict(), "path": str(path), "endpoint": relay.url, "retries": 2})
    finally:
        relay.close()
    assert rc == 1 and "model-00002-of-00002.safetensors" in out["error"] and "files already downloaded" in out["error"]
    assert not path.exists()  # never a half-written model at the path
    before = hub.downloads()
    rc, out = _fetch(tmp_path, {"lock": lock.as_dict(), "path": str(path), "endpoint": hub.url})
    # the files before the cut are kept; the cut one and those after it are fetched
    rest = ["model-00002-of-00002.safetensors", "tokenizer.json"]
    assert rc == 0 and out["downloaded"] == rest
    assert _new(hub.downloads(), before) == dict.fromkeys(rest, 1)


def test_the_service_users_group_is_made_when_the_host_has_none_yet(hub, tmp_path):
    import grp

    name = "pdnode-mdl-test"
    subprocess.run(["groupdel", name], capture_output=True, check=False)
    lock = _lock_of(hub, tmp_path, hub.first)
    path = tmp_path / "host" / "tiny"
    try:
        rc, out = _fetch(tmp_path, {"lock": lock.as_dict(), "path": str(path), "endpoint": hub.url, "group": name})
        assert rc == 0 and out["changed"], out
        gid = grp.getgrnam(name).gr_gid
        assert (path / "config.json").resolve().stat().st_gid == gid
        # the group there, nothing else changed: no change
        rc, out = _fetch(tmp_path, {"lock": lock.as_dict(), "path": str(path), "endpoint": hub.url, "group": name})
        assert (rc, out["changed"]) == (0, False)
    finally:
        subprocess.run(["groupdel", name], capture_output=True, check=False)
