"""nvidia_driver on a GPU-less container: the repository, its key, apt's view of it,
and the configuration files. Installs are gated (README.md), so they are checked absent."""

import os
from pathlib import Path

REPO = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
SOURCES = "/etc/apt/sources.list.d/cuda-nvidia.sources"


def _fields(text: str) -> dict:
    out, key = {}, None
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and key:
            out[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
    return out


def test_deb822_repository_file(host):
    f = host.file(SOURCES)
    assert f.exists and f.user == "root" and f.mode == 0o644
    fields = _fields(f.content_string)
    assert fields["Types"] == "deb"
    assert fields["URIs"] == REPO
    assert fields["Suites"] == "/"          # flat repository
    assert "Components" not in fields       # ... so no components
    assert fields["Signed-By"]


def _key_body(armoured: str) -> list[str]:
    lines = [l.strip() for l in armoured.splitlines()]
    return [l for l in lines if l and l != "." and not l.startswith("-----") and ":" not in l]


def test_signing_key_is_the_one_given(host):
    """The key handed over (nvidia_driver_repo_key_file) is the one apt trusts for the repo."""
    signed_by = _fields(host.file(SOURCES).content_string)["Signed-By"]
    key = host.file(signed_by).content_string if signed_by.startswith("/") else signed_by
    assert "BEGIN PGP PUBLIC KEY BLOCK" in key
    given = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "test-key", "test-key.asc").read_text()
    assert _key_body(key) == _key_body(given)


def test_apt_reads_the_repository(host):
    # apt parses the file and tries the URL; the fetch itself fails from this network
    # (only package registries are reachable): that failure is expected, not hidden.
    out = host.run("apt-get update 2>&1")
    assert REPO in out.stdout, out.stdout
    lines = [l for l in out.stdout.splitlines() if REPO in l]
    assert any(l.startswith(("Err:", "Ign:", "W:", "E:")) for l in lines), lines
    assert "Malformed" not in out.stdout and "not valid" not in out.stdout
    assert "deb.debian.org" in out.stdout  # the distribution's own repositories still work


def test_gated_installs_did_not_happen(host):
    for pkg in ("nvidia-open", "nvidia-driver-pinning-580.159.04", "nvidia-fabricmanager-580"):
        assert not host.package(pkg).is_installed


def test_prerequisites_installed(host):
    assert host.package("python3-debian").is_installed


def test_persistenced_dropin(host):
    f = host.file("/etc/systemd/system/nvidia-persistenced.service.d/50-pdnode.conf")
    assert f.exists and f.mode == 0o644
    text = f.content_string
    assert "[Service]" in text
    lines = text.splitlines()
    assert "ExecStart=" in lines  # resets the packaged ExecStart
    assert any(l.startswith("ExecStart=/usr/bin/nvidia-persistenced") and "--persistence-mode" in l for l in lines)


def test_peermem_loaded_at_boot(host):
    f = host.file("/etc/modules-load.d/nvidia-peermem.conf")
    assert f.exists
    assert [l for l in f.content_string.splitlines() if l and not l.startswith("#")] == ["nvidia-peermem"]
