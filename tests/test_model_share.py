"""One download per layout spanning hosts (issue 44): the plan names the first engine
host as the seed, which fetches from the endpoint and serves the verified commit on its
layout address to the other engine hosts (the firewall admits them there); a host with
the router alone gets no model. On the loopback: a peer copies from a real seed's
``--serve`` and verifies it as it would the endpoint's, the server asked nothing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdnode.core.inventory.model_source import Lock, ManifestFile
from pdnode.core.inventory.read import inventory_dirs, inventory_variables
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "9" * 40


@pytest.fixture
def cluster(tmp_path):
    """inventories/demo-cluster naming an hf:// source, its lock beside it."""
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "demo-cluster", inv)
    (inv / "group_vars" / "all" / "zz-model.yml").write_text(
        "pdnode_model_source: hf://pdnode/demo-moe@main\npdnode_model_path: /var/lib/sglang-pd-models/hub/demo-moe\n")
    (inv / ".model.lock.json").write_text(Lock("hf://pdnode/demo-moe@main", "pdnode/demo-moe", "main", COMMIT, (
        ManifestFile("config.json", 800, None), ManifestFile("model.safetensors", 1_000_000, "a" * 64))).text())
    peers, dirs = inventory_variables(inv), inventory_dirs(inv)
    return {h: build_plan(peers[h], h, peers, dirs[h]).as_dict() for h in peers}


def test_the_first_engine_host_downloads_and_serves_the_others(cluster):
    seed, peer, router = cluster["pd-decode"], cluster["pd-prefill"], cluster["pd-router"]
    share = seed["model"]["share"]
    assert (share["seed"], share["peers"], share["port"]) == ("pd-decode", ["pd-prefill"], 29100)
    view = seed["roles"]["model"]
    assert view["enabled"] and not view["peer"] and view["spec"]["endpoint"] is None  # the hub's default
    start = view["share"]["start"]
    assert start[:2] == ["systemd-run", "--unit=sglang-pd-model-share.service"]
    assert start[-4:] == ["--serve", share["address"], "29100",
                          f"/var/lib/sglang-pd-models/hub/.pdnode-models/pdnode--demo-moe/{COMMIT}"]
    assert "--property=DynamicUser=yes" in start and "--property=SupplementaryGroups=sglang" in start
    # the peers reach the share port on the seed only
    assert 29100 in seed["firewall"]["tcp_ports"] and 29100 not in peer["firewall"]["tcp_ports"]
    pview = peer["roles"]["model"]
    assert pview["peer"] and pview["share"] is None and pview["token"] is None
    assert pview["spec"]["peer"] == f"http://{share['address']}:29100" and pview["spec"]["endpoint"] is None
    assert router["roles"]["model"] == {"enabled": False}


def test_one_host_has_no_share(tmp_path, gpu01_vars):
    v = {**gpu01_vars, "pdnode_model_source": "hf://o/m@main", "pdnode_model_kind": "moe",
         "pdnode_model_weights_gb": 50.0}
    (tmp_path / ".model.lock.json").write_text(Lock("hf://o/m@main", "o/m", "main", COMMIT, (
        ManifestFile("config.json", 800, None),)).text())
    plan = build_plan(v, "gpu01", None, str(tmp_path)).as_dict()
    assert "share" not in plan["model"] and "model.share_port" not in plan["ports"]
    assert plan["roles"]["model"]["share"] is None and not plan["roles"]["model"]["peer"]


@pytest.mark.integration
def test_a_peer_copies_from_the_seed_and_verifies(tmp_path):
    from pdnode.commands.model import resolve
    from pdnode.core.inventory.model_source import parse
    from pdnode.standin.model_hub import Hub, commit_files, free_port

    root = tmp_path / "hub"
    commit_files(root / "mirrors", "org/tiny", {"config.json": b'{"a": 1}', "model.safetensors": os.urandom(2_000_000),
                                                "sub/extra.json": b"{}"}, "first")
    with Hub(root) as hub:
        lock = resolve(parse("hf://org/tiny@main"), hub.url, False)

        def fetch(spec):
            r = subprocess.run([sys.executable, "-m", "pdnode.node.model_fetch", "-"], input=json.dumps(spec),
                               capture_output=True, text=True, timeout=300)
            return r.returncode, json.loads(r.stdout)

        seed_path = tmp_path / "seed" / "models" / "tiny"
        assert fetch({"lock": lock.as_dict(), "path": str(seed_path), "endpoint": hub.url})[0] == 0
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "pdnode.node.model_fetch", "--serve", "127.0.0.1", str(port),
                                   str(seed_path.resolve())], stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            before = hub.downloads()
            peer_path = tmp_path / "peer" / "models" / "tiny"
            rc, out = fetch({"lock": lock.as_dict(), "path": str(peer_path), "peer": f"http://127.0.0.1:{port}"})
            assert rc == 0 and out["from"] == f"http://127.0.0.1:{port}" and out["verified"] == "sha256", out
            assert sorted(out["downloaded"]) == sorted(f.path for f in lock.files)
            assert hub.downloads() == before  # the endpoint was not asked
            for f in lock.files:
                assert (peer_path / f.path).read_bytes() == (seed_path / f.path).read_bytes()
            # nothing outside the commit: a path that climbs out is not served
            import urllib.error
            import urllib.request
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/..%2F..%2F..%2Fetc%2Fpasswd", timeout=5)
        finally:
            server.terminate()
            server.wait(10)
        # the seed gone: the peer's next fetch of what it lacks says where it copies from
        (peer_path / "model.safetensors").resolve().unlink()
        rc, out = fetch({"lock": lock.as_dict(), "path": str(peer_path), "peer": f"http://127.0.0.1:{port}",
                         "retries": 1})
        assert rc == 1 and "first engine host" in out["error"] and "model.safetensors" in out["error"]
