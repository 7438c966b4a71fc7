"""The incident bundle on the deployed node (issue 11, item 4): `pdnode collect` runs
playbooks/collect.yml against the scenario's instance and must

- write one tar.gz whose MANIFEST.json lists every member with its size and sha256,
  and nothing that is not a member;
- hold neither the API key nor the router's admin key in any member, nor in the
  playbook's output (the keys are read from the host: they are what is deployed);
- hold what an incident needs: each unit's journal, state and restart count, the
  router's workers (read on the host with the admin key), /metrics of every instance
  and the router, the key files' mode and size, the release's pip freeze;
- change nothing (same main PIDs and restart counts, no directory left on the host).

How long it takes is a benchmark, not an assertion (a busy CI machine must not fail it):
printed here (`pytest -s`) and recorded in docs/measurements.md (goal: under 30 s). The
command's own time limit, and each of its commands', is the product's; a collect that
hangs ends at subprocess.run's deadline and fails.
Read-only, so it runs in any order with the other files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")
PREFIX = "sglang-pd"
UNITS = [f"{PREFIX}-prefill-0.service", f"{PREFIX}-decode-0.service", f"{PREFIX}-router.service"]
KEY_FILES = {"API key": "/etc/sglang-pd/api-key", "admin key": "/etc/sglang-pd/router-admin-key"}


@pytest.fixture(scope="module")
def keys(host):
    """The keys as deployed (read as root on the host), by name."""
    got = {name: host.check_output(f"cat {path}").strip() for name, path in KEY_FILES.items()}
    assert all(len(v) >= 16 for v in got.values()), "the node runs without its keys"
    return got


def leaked(keys: dict[str, str], data: bytes) -> list[str]:
    """Names of the keys DATA holds (never the values: a failing assert prints this)."""
    return [name for name, value in keys.items() if value.encode() in data]


def units_state(host) -> dict[str, str]:
    return {u: host.check_output(f"systemctl show -p MainPID -p NRestarts --value {u}").replace("\n", " ")
            for u in UNITS}


@pytest.fixture(scope="module")
def run(host, inventory, keys, tmp_path_factory):
    """`pdnode collect INVENTORY --out DIR`, timed; (process, seconds, bundle, state before)."""
    out = tmp_path_factory.mktemp("bundle")
    # molecule's ANSIBLE_* (its own ansible.cfg) must not leak in; pdnode sets the repo's
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env["ANSIBLE_NOCOLOR"] = "1"
    before = units_state(host)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "collect", str(inventory), "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, timeout=300, check=False)
    took = time.monotonic() - t0
    print(f"\npdnode collect on the node: {took:.1f} s")
    bundles = sorted(out.glob("*.tar.gz"))
    return proc, took, bundles, before


def test_collect_exits_0_and_prints_the_bundle(run, keys):
    proc, took, bundles, _ = run
    output = proc.stdout + proc.stderr
    assert leaked(keys, output) == []  # first: a failure message below shows the output
    assert proc.returncode == 0, output.decode(errors="replace")[-4000:]
    assert len(bundles) == 1
    assert proc.stdout.decode().strip().splitlines()[-1].startswith(f"bundle: {bundles[0]}")
    print(f"pdnode collect: {took:.1f} s (a benchmark: docs/measurements.md, goal under 30 s)")


def test_no_key_in_the_bundle_and_the_manifest_lists_every_member(run, keys):
    *_, bundles, _ = run
    with tarfile.open(bundles[0]) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert members
    holding = {name: leaked(keys, data) for name, data in members.items() if leaked(keys, data)}
    assert holding == {}
    root = bundles[0].name.removesuffix(".tar.gz")
    manifest = json.loads(members.pop(f"{root}/MANIFEST.json"))
    listed = {f"{root}/{f['path']}": f for f in manifest["files"]}
    assert sorted(listed) == sorted(members)
    bad = [name for name, data in members.items()
           if listed[name]["sha256"] != hashlib.sha256(data).hexdigest() or listed[name]["size"] != len(data)]
    assert bad == []
    assert manifest["schema"] == "pdnode.collect" and manifest["version"] == 1
    assert [(h["host"], h["status"]) for h in manifest["hosts"]] == [(CONTAINER, "collected")]
    # no key leaked into any text on the host either (the collector would have stripped it)
    assert [f["path"] for f in manifest["files"] if f.get("secret_values_removed")] == []
    print(f"bundle: {len(members)} files, {bundles[0].stat().st_size} bytes; not collected: "
          + "; ".join(f"{m['item']} ({m['reason']})" for m in manifest["missing"]))


def test_the_bundle_holds_what_an_incident_needs(run):
    *_, bundles, _ = run
    with tarfile.open(bundles[0]) as tar:
        root = bundles[0].name.removesuffix(".tar.gz")
        files = {m.name.removeprefix(f"{root}/{CONTAINER}/"): tar.extractfile(m).read().decode(errors="replace")
                 for m in tar if m.isfile()}
        manifest = json.loads(tar.extractfile(f"{root}/MANIFEST.json").read())
    status = {f["path"].removeprefix(f"{CONTAINER}/"): f.get("exit_status") for f in manifest["files"]}
    for unit in UNITS:
        assert "Started" in files[f"journal/{unit}.txt"] or "Starting" in files[f"journal/{unit}.txt"], unit
        show = dict(line.split("=", 1) for line in files[f"systemd/{unit}.show.txt"].splitlines() if "=" in line)
        assert show["ActiveState"] == "active" and show["NRestarts"].isdigit(), unit
        assert "Max open files" in files[f"limits/{unit}.proc-limits.txt"], unit
        assert "[Service]" in files[f"units/{unit}"], unit
    # the router's workers, asked on the host with the admin key: 200 and both workers
    assert status["http/router.workers.json"] == 200
    workers = json.loads(files["http/router.workers.json"])["workers"]
    assert sorted(w["worker_type"] for w in workers) == ["decode", "prefill"]
    for name in ("prefill-0", "decode-0", "router"):
        assert status[f"http/{name}.metrics.txt"] == 200 and "# TYPE" in files[f"http/{name}.metrics.txt"], name
    key_files = {k["path"]: k for k in json.loads(files["config/key-files.json"])["files"]}
    assert {k["mode"] for k in key_files.values()} == {"0400"} and all(k["size"] > 0 for k in key_files.values())
    assert json.loads(files["config/prefill-0.json"])["disaggregation_mode"] == "prefill"
    # what the node runs, as the deploy recorded it (converged: no change under way)
    layout = json.loads(files["state/layout.json"])
    assert set(layout["engines"]) == {"prefill-0", "decode-0"} and "from" not in layout
    assert "==" in files["release/pip-freeze.txt"] and status["release/pip-freeze.txt"] == 0
    assert status["host/ss-ltnp.txt"] == 0 and ":8000" in files["host/ss-ltnp.txt"]
    missing = {m["item"]: m["reason"] for m in manifest["missing"]}
    assert "nvidia-smi is not installed" in missing["gpu/"]  # recorded as absent, not an error


def test_collect_changed_nothing_on_the_node(host, run):
    *_, before = run
    assert units_state(host) == before
    assert host.run("ls -d /tmp/pdnode-collect-*").rc != 0, "the collector's directory was left on the host"
