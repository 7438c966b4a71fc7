"""The nvidia_driver role's repository, packages, supported-host problem and fabric manager
(pdnode.core.host.roles.nvidia_driver), case by case as the role's Jinja computed them."""

from __future__ import annotations

import pytest

from pdnode.core.host.roles import nvidia_driver as nd

NVSWITCH_PCI = "/sys/bus/pci/devices/0000:05:00.0 0x10de 0x068000 0x22a3\n"


def host(**over):
    values = {"distribution": "Ubuntu", "version": "24.04", "major_version": "24", "architecture": "x86_64",
              "base_url": "https://developer.download.nvidia.com/compute/cuda/repos", "branch": 580,
              "driver_version": "", "flavor": "open", "fabricmanager": "auto", "extra_packages": [],
              "allow_branch_switch": False}
    return nd.host(**{**values, **over})


@pytest.mark.parametrize(("facts", "url"), [
    ({}, "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"),
    ({"version": "22.04", "major_version": "22"}, "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"),
    ({"distribution": "Debian", "version": "12.7", "major_version": "12", "architecture": "aarch64"},
     "https://developer.download.nvidia.com/compute/cuda/repos/debian12/sbsa/"),
])
def test_the_repository_path_is_named_after_the_os_and_architecture(facts, url):
    r = host(**facts)
    assert r["repo_url"] == url and r["problem"] == ""


@pytest.mark.parametrize("over", [
    {"version": "20.04"}, {"distribution": "Debian", "major_version": "11"}, {"distribution": "CentOS"},
    {"architecture": "ppc64le"}, {"flavor": "closed"}, {"branch": 470}, {"branch": "x"}, {"fabricmanager": "yes"},
])
def test_an_unsupported_host_or_option_is_one_problem_naming_the_host(over):
    problem = host(**over)["problem"]
    assert problem.startswith("nvidia_driver supports ubuntu 22.04, ubuntu 24.04, debian 12 on x86_64/aarch64, "
                              "flavor open|proprietary, fabric manager auto|always|never; this host is ")
    assert problem.endswith(".")


def test_the_problem_names_what_the_host_is():
    assert host(architecture="ppc64le", flavor="open")["problem"].endswith(
        "this host is ubuntu 24.04 ppc64le, flavor open, fabric manager auto.")


def test_the_branch_is_pinned_first_then_the_flavor_then_the_extras():
    assert host(extra_packages=["datacenter-gpu-manager"])["packages"] == [
        "nvidia-driver-pinning-580", "nvidia-open", "datacenter-gpu-manager"]
    assert host(flavor="proprietary", driver_version="580.159.04")["packages"] == [
        "nvidia-driver-pinning-580.159.04", "cuda-drivers"]


def test_branches_before_590_name_their_fabric_manager_packages_after_the_branch():
    assert host(branch=580)["fm_packages"] == ["nvidia-fabricmanager-580", "libnvidia-nscq-580"]
    assert host(branch=590)["fm_packages"] == ["nvidia-fabricmanager", "libnvidia-nscq"]
    assert host(branch="575")["fm_packages"] == ["nvidia-fabricmanager-575", "libnvidia-nscq-575"]


def test_a_branch_switch_asks_apt_for_the_latest():
    assert host()["install_state"] == "present"
    assert host(allow_branch_switch=True)["install_state"] == "latest"


def fabric(setting="auto", **over):
    values = {"pci": "", "nvswitches": [], "driver_version": "", "modversion": "",
              "fm_packages": ["nvidia-fabricmanager-580", "libnvidia-nscq-580"]}
    return nd.fabric(setting, **{**values, **over})


def test_the_fabric_manager_goes_where_nvswitches_show_or_always():
    assert fabric()["want"] is False and fabric("always")["want"] is True
    assert fabric(pci=NVSWITCH_PCI)["want"] is True and fabric(pci=NVSWITCH_PCI)["nvswitch_count"] == 1
    assert fabric(nvswitches=["0", "1"])["nvswitch_count"] == 2
    assert fabric("never", nvswitches=["0"])["want"] is False


def test_the_fabric_manager_is_pinned_to_the_exact_or_the_installed_version():
    assert fabric(driver_version="580.159.04", modversion="580.1.1\n")["pinned"] == [
        "nvidia-fabricmanager-580=580.159.04-*", "libnvidia-nscq-580=580.159.04-*"]
    assert fabric(modversion="580.95.05\n")["exact_version"] == "580.95.05"
    assert fabric()["exact_version"] == ""
