"""mooncake: the non-CUDA engine in the release virtualenv, importable, and moving real
bytes between two engines on loopback (tcp, P2PHANDSHAKE) at a measured bandwidth."""

import json
import os
import subprocess
import tarfile
from pathlib import Path

VENV = "/opt/sglang-pd/venvs/test-release"
TOOL = f"{VENV}/bin/pdnode-mooncake-loopback-check.py"


def test_system_libraries(host):
    assert host.package("libibverbs1").is_installed
    assert host.package("libnuma1").is_installed


def test_installed_build_and_version(host):
    out = host.run(f"{VENV}/bin/python -m pip list --format=json")
    pkgs = {p["name"]: p["version"] for p in json.loads(out.stdout)}
    assert pkgs.get("mooncake-transfer-engine-non-cuda") == "0.3.13.post1"
    assert "mooncake-transfer-engine" not in pkgs and "mooncake-transfer-engine-cuda13" not in pkgs


def test_engine_imports(host):
    out = host.run(f"{VENV}/bin/python -c 'from mooncake.engine import TransferEngine; TransferEngine()'")
    assert out.rc == 0, out.stderr


def test_the_roles_load_check_passes_and_names_the_build(host):
    """What the role ran before any engine could start (files/mooncake_import_check.py)."""
    script = (Path(__file__).resolve().parents[3] / "roles/mooncake/files/mooncake_import_check.py").read_text()
    out = host.run(f"{VENV}/bin/python - <<'PDNODE_EOF'\n{script}\nPDNODE_EOF")
    assert out.rc == 0, out.stdout + out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"ok": True, "mooncake": "mooncake-transfer-engine-non-cuda 0.3.13.post1", "torch": None,
                   "torch_cuda": None}


def test_loopback_transfer_measures_bandwidth(host):
    out = host.run(f"{VENV}/bin/python {TOOL} --bytes 33554432 --iterations 3")
    assert out.rc == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] is True and result["intact"] is True
    assert result["package"] == "mooncake-transfer-engine-non-cuda" and result["protocol"] == "tcp"
    assert result["write_gb_s_best"] > 0 and result["read_gb_s"] > 0
    print(f"mooncake loopback (tcp, 32 MiB x 3): write {result['write_gb_s_best']} GB/s best, "
          f"{result['write_gb_s_mean']} GB/s mean, read {result['read_gb_s']} GB/s")


# The wheelhouse role (shared with the sglang role): one host directory, unpacked once per
# content, recorded by the controller's stamp (scripts/wheelhouse).
REPO = Path(__file__).resolve().parents[3]
WHEELHOUSE = REPO / ".cache/wheelhouse/cp311-sim"
HOST_WHEELHOUSE = "/opt/sglang-pd/wheelhouse"
MARKER = f"{HOST_WHEELHOUSE}/.pdnode-wheelhouse"
CONTAINER = "pdnode-mol-mooncake"


def _run_converge(tmp_path, *extra: str) -> tuple[int, dict]:
    """The scenario's converge from the controller (the loopback check left out): its exit
    status and its JSON report."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"hosts": {CONTAINER: {
        "ansible_connection": "community.docker.docker", "ansible_host": CONTAINER}}}}))
    env = {**os.environ, "MOLECULE_PROJECT_DIRECTORY": str(REPO), "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".venv/collections"), "ANSIBLE_PIPELINING": "true",
           "ANSIBLE_STDOUT_CALLBACK": "json"}
    out = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inv),
                          str(REPO / "molecule/mooncake/converge.yml"), "-e", "mooncake_loopback_check=false", *extra],
                         cwd=REPO, env=env, capture_output=True, text=True, check=False)
    return out.returncode, json.loads(out.stdout)


def _changed(tmp_path) -> int:
    """A converge that succeeds: how many tasks changed the host."""
    rc, report = _run_converge(tmp_path)
    assert rc == 0, report["stats"]
    return report["stats"][CONTAINER]["changed"]


def _archive_names() -> list[str]:
    with tarfile.open(f"{WHEELHOUSE}.tar") as tar:
        return sorted(tar.getnames())


def _host_names(host) -> list[str]:
    return sorted(host.run(f"ls -A {HOST_WHEELHOUSE}").stdout.split())


def _listing(host) -> str:
    """Each entry's name, size, mode and mtime: what a change would alter. Not `ls`'s block
    total: the filesystem may still be trimming the blocks of files the last test unpacked."""
    return host.run(f"find {HOST_WHEELHOUSE} -printf '%P %s %m %T@\\n' | sort").stdout


def test_the_host_holds_the_controllers_wheelhouse_once(host):
    stamp = (WHEELHOUSE / ".stamp").read_text().strip()
    assert host.file(MARKER).content_string == stamp
    # exactly the archive's wheels and the marker; the archive itself is not kept
    assert _host_names(host) == sorted([*_archive_names(), ".pdnode-wheelhouse"])
    assert any(n.startswith("mooncake_transfer_engine_non_cuda-") for n in _archive_names())
    assert not host.file(f"{HOST_WHEELHOUSE}.tar").exists


def test_the_same_wheelhouse_is_not_unpacked_again_and_another_is(host, tmp_path):
    stamp = (WHEELHOUSE / ".stamp").read_text().strip()
    sentinel = f"{HOST_WHEELHOUSE}/planted.whl"
    host.run(f"touch {sentinel}")
    # same content: nothing copied, nothing unpacked (the planted file survives)
    assert _changed(tmp_path) == 0
    assert host.file(sentinel).exists
    # the host holds another wheelhouse: emptied, unpacked, recorded
    host.run(f"printf another > {MARKER}")
    assert _changed(tmp_path) > 0
    assert not host.file(sentinel).exists
    assert host.file(MARKER).content_string == stamp
    assert _host_names(host) == sorted([*_archive_names(), ".pdnode-wheelhouse"])
    assert _changed(tmp_path) == 0


def test_a_host_converged_by_an_earlier_release_loses_the_old_copies(host, tmp_path):
    """Earlier releases left the mooncake role's own copy of the wheels and the sglang role's
    archive, and no marker: the first run with the wheelhouse role removes both, once."""
    old_copy = HOST_WHEELHOUSE.rsplit("/", 1)[0] + "/wheelhouse-mooncake"
    host.run(f"mkdir -p {old_copy} && touch {old_copy}/old.whl {HOST_WHEELHOUSE}.tar && rm -f {MARKER}")
    assert _changed(tmp_path) > 0
    assert not host.file(old_copy).exists and not host.file(f"{HOST_WHEELHOUSE}.tar").exists
    assert _host_names(host) == sorted([*_archive_names(), ".pdnode-wheelhouse"])
    assert _changed(tmp_path) == 0


def test_a_directory_of_wheels_alone_is_refused_before_any_change(host, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_text("")
    before = _listing(host)
    assert ".pdnode-wheelhouse " in before, before
    rc, report = _run_converge(tmp_path, "-e", f"mooncake_wheelhouse={wheels}")
    assert rc != 0
    failed = [(task["task"]["name"], result.get("msg", "")) for task in report["plays"][0]["tasks"]
              for result in task["hosts"].values() if result.get("failed")]
    assert len(failed) == 1, failed
    assert failed[0][0] == "pdnode.sglang_pd.wheelhouse : Check that the wheelhouse is one scripts/wheelhouse made"
    msg = failed[0][1]
    assert msg.startswith(f"wheelhouse_src='{wheels}' (pdnode_wheelhouse, or the role's *_wheelhouse): its .stamp"), msg
    assert "fix: build it with scripts/wheelhouse" in msg and "\n" not in msg, msg
    assert report["stats"][CONTAINER]["changed"] == 0
    assert _listing(host) == before
