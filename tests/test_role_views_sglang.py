"""The sglang role's release and drift (pdnode.core.plan.roles.sglang), as the role's Jinja
computed them before: the packages of each engine, the markers (Ansible's to_nice_json),
the node_state questions, and every way a venv's read differs."""

from __future__ import annotations

import copy
import hashlib

import pytest
from ansible.plugins.filter.core import to_nice_json

from pdnode.core.plan.roles import sglang

VENV, ROUTER, ROOT = "/opt/sglang-pd/venvs/rel", "/opt/sglang-pd/venvs/router", "/opt/sglang-pd"
SHA = "0123456789abcdef" * 4


def release(**over):
    values = {"engine": "sglang", "python": "python3", "version": "0.5.23", "mooncake_version": "0.3.13.post1",
              "router_requirement": "smg==1.0.0", "sim_packages": ["aiohttp", "prometheus-client"],
              "sim_system_packages": ["libibverbs1", "libnuma1"], "venv": VENV, "router_venv": ROUTER,
              "install_root": ROOT, "wheelhouse": "index", "bundle_sha256": SHA}
    return sglang.release(**{**values, **over})


def test_the_real_engine_installs_sglang_and_the_router():
    r = release()
    assert r["system_packages"] == ["python3-venv", "python3-packaging"]
    # huggingface_hub: the model role's download client, pinned in either venv
    assert r["packages"] == ["smg==1.0.0", "sglang==0.5.23", "huggingface_hub==1.33.0"]


def test_the_stand_in_installs_its_packages_and_mooncakes_non_cuda_build():
    r = release(engine="sim")
    assert r["system_packages"] == ["python3-venv", "python3-packaging", "libibverbs1", "libnuma1"]
    assert r["packages"] == ["smg==1.0.0", "aiohttp", "prometheus-client",
                             "mooncake-transfer-engine-non-cuda==0.3.13.post1", "huggingface_hub==1.33.0"]


@pytest.mark.parametrize("engine", ["sglang", "sim"])
@pytest.mark.parametrize("wheelhouse", ["index", "sha256:abc wheels-x86_64 é"])
def test_the_markers_are_the_bytes_ansibles_to_nice_json_wrote(engine, wheelhouse):
    r = release(engine=engine, wheelhouse=wheelhouse)
    assert r["release_marker"] == to_nice_json(
        {"system": r["system_packages"], "packages": r["packages"], "wheelhouse": wheelhouse}, sort_keys=True)
    assert r["router_marker"] == to_nice_json({"python": "python3", "packages": ["smg==1.0.0"]}, sort_keys=True)
    assert r["managed_files"] == [
        {"path": f"{VENV}/.pdnode-release", "sha256": hashlib.sha256(r["release_marker"].encode()).hexdigest(),
         "mode": "0644", "owner": "root", "group": "root"},
        {"path": f"{ROUTER}/.pdnode-release", "sha256": hashlib.sha256(r["router_marker"].encode()).hexdigest(),
         "mode": "0644", "owner": "root", "group": "root"}]


def test_a_new_wheelhouse_changes_the_release_marker_and_not_the_routers():
    a, b = release(), release(wheelhouse="stamp-2")
    assert a["release_marker"] != b["release_marker"] and a["router_marker"] == b["router_marker"]


def test_the_bundle_and_the_questions_are_named_after_its_checksum():
    r = release()
    assert (r["bundle_id"], r["bundle_dir"], r["bundle_tarball"]) == (
        "0123456789ab", "pdnode-0123456789ab", "/opt/sglang-pd/pdnode-0123456789ab.tar.gz")
    assert r["managed_directories"] == [{"path": ROOT, "mode": "0755", "owner": "root", "group": "root"}]
    assert r["read"] == [f"{VENV}/.pdnode-release", f"{ROUTER}/.pdnode-release"]
    assert r["find"]["release_bundle"] == {"path": f"{VENV}/src/pdnode-0123456789ab/pdnode", "pattern": "__init__[.]py"}
    assert r["find"]["router_src"] == {"path": f"{ROUTER}/src", "pattern": "pdnode-.*"}
    assert r["find"]["tarballs"] == {"path": ROOT, "pattern": "pdnode-.*[.]tar[.]gz"}
    assert r["commands"]["router_pth"]["argv"] == ["find", f"{ROUTER}/lib", "-mindepth", "3", "-maxdepth", "3",
                                                   "-name", "pdnode.pth", "-type", "f", "-exec", "cat", "{}", "+"]


def converged(r: dict) -> dict:
    """node_state's answer on a host that holds this release and bundle."""
    d = r["bundle_dir"]
    return {"drift": [], "read": {r["release_marker_path"]: r["release_marker"] + "\n",
                                  r["router_marker_path"]: r["router_marker"]},
            "found": {"release_src": [d], "router_src": [d], "release_bundle": ["__init__.py"],
                      "router_bundle": ["__init__.py"], "tarballs": [f"{d}.tar.gz"]},
            "commands": {"release_pth": {"rc": 0, "stdout": f"{VENV}/src/{d}\n", "stderr": ""},
                         "router_pth": {"rc": 0, "stdout": f"{ROUTER}/src/{d}\n", "stderr": ""}}}


def drift(state):
    return sglang.drift(state, release(), VENV, ROUTER)


def test_a_converged_host_differs_in_nothing():
    assert drift(converged(release())) == {
        "lines": [], "managed": [], "install": False, "release_outdated": False, "router_outdated": False,
        "write_release_marker": False, "write_router_marker": False}


@pytest.mark.parametrize("content", [None, "", "old", "{}"])
def test_a_missing_or_other_release_marker_reinstalls_the_release_only(content):
    state = converged(release())
    state["read"][f"{VENV}/.pdnode-release"] = content
    d = drift(state)
    assert d["lines"] == ["release venv: marker differs"]
    assert d["release_outdated"] and d["write_release_marker"] and d["install"]
    assert not d["router_outdated"] and not d["write_router_marker"]


def test_trailing_line_ends_of_a_marker_are_not_a_difference():
    state = converged(release())
    state["read"][f"{ROUTER}/.pdnode-release"] += "\r\n\n"
    assert drift(state)["lines"] == []


def test_a_marker_file_whose_mode_drifted_is_written_without_a_reinstall():
    state = converged(release())
    state["drift"] = [f"file {ROUTER}/.pdnode-release: mode 0600, wants 0644"]
    d = drift(state)
    assert d["lines"] == state["drift"] and d["install"]
    assert d["write_router_marker"] and not d["write_release_marker"]
    assert not d["router_outdated"] and not d["release_outdated"]


def test_a_drift_of_the_install_root_installs_but_writes_no_marker():
    state = converged(release())
    state["drift"] = [f"directory {ROOT}: mode 0700, wants 0755"]
    d = drift(state)
    assert d["install"] and not d["write_release_marker"] and not d["write_router_marker"]


def test_a_path_that_only_starts_like_the_marker_is_not_it():
    state = converged(release())
    state["drift"] = [f"file {VENV}/.pdnode-release.bak: missing"]
    assert not drift(state)["write_release_marker"]


@pytest.mark.parametrize(("change", "line"), [
    (lambda s: s["found"].update(release_src=["pdnode-0123456789ab", "pdnode-old"]),
     "release venv: does not hold bundle 0123456789ab"),
    (lambda s: s["found"].update(router_bundle=[]), "router venv: does not hold bundle 0123456789ab"),
    (lambda s: s["commands"]["release_pth"].update(stdout=""), "release venv: does not hold bundle 0123456789ab"),
    (lambda s: s["commands"]["router_pth"].update(stdout=f"{ROUTER}/src/pdnode-old\n"),
     "router venv: does not hold bundle 0123456789ab"),
    (lambda s: s["found"].update(tarballs=["pdnode-0123456789ab.tar.gz", "pdnode-old.tar.gz"]),
     "bundle tarball: not only pdnode-0123456789ab.tar.gz"),
    (lambda s: s["found"].update(tarballs=[]), "bundle tarball: not only pdnode-0123456789ab.tar.gz"),
])
def test_a_venv_without_this_bundle_or_another_tarball_is_named(change, line):
    state = copy.deepcopy(converged(release()))
    change(state)
    d = drift(state)
    assert d["lines"] == [line]
    assert not d["install"]  # the bundle alone: packages.yml is skipped, bundle.yml runs


def test_the_lines_come_in_the_order_the_role_printed_them():
    state = converged(release())
    state["drift"] = [f"directory {ROOT}: missing"]
    state["read"] = {}
    state["found"] = {k: [] for k in state["found"]}
    assert drift(state)["lines"] == [
        f"directory {ROOT}: missing", "release venv: marker differs", "router venv: marker differs",
        "release venv: does not hold bundle 0123456789ab", "router venv: does not hold bundle 0123456789ab",
        "bundle tarball: not only pdnode-0123456789ab.tar.gz"]


def test_an_empty_answer_differs_in_everything():
    d = drift({})
    assert d["release_outdated"] and d["router_outdated"] and d["install"]
    assert d["lines"][-1] == "bundle tarball: not only pdnode-0123456789ab.tar.gz" and len(d["lines"]) == 5
