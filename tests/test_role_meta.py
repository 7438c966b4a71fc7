"""Every role's meta platforms are exactly the OS releases the preflight accepts.

The preflight (pdnode.core.host.preflight.DEFAULT_SUPPORTED_OS, and the role default
preflight_supported_os that overrides it in a play) is where a host is accepted or
refused; a role that advertises more (Debian trixie once) promises what a run refuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pdnode.core.host.preflight import DEFAULT_SUPPORTED_OS

ROOT = Path(__file__).resolve().parents[1]
ROLE_METAS = sorted(ROOT.glob("roles/*/meta/main.yml"))

# Galaxy names releases by codename; the preflight by "<os id> <version>" as Ansible's
# facts give them. Add a row here before adding a release to either side.
CODENAMES = {
    ("ubuntu", "jammy"): "ubuntu 22.04",
    ("ubuntu", "noble"): "ubuntu 24.04",
    ("debian", "bookworm"): "debian 12",
    ("debian", "trixie"): "debian 13",
}


def meta_platforms(path: Path) -> set[str]:
    meta = yaml.safe_load(path.read_text())
    out = set()
    for platform in meta["galaxy_info"]["platforms"]:
        for version in platform["versions"]:
            key = (platform["name"].lower(), str(version).lower())
            assert key in CODENAMES, f"{path}: unknown platform {key}; add it to CODENAMES"
            out.add(CODENAMES[key])
    return out


def test_every_role_has_a_meta():
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    assert [p.parts[-3] for p in ROLE_METAS] == roles


def test_preflight_default_list_is_the_module_list():
    defaults = yaml.safe_load((ROOT / "roles/preflight/defaults/main.yml").read_text())
    assert sorted(defaults["preflight_supported_os"]) == sorted(DEFAULT_SUPPORTED_OS)


@pytest.mark.parametrize("meta", ROLE_METAS, ids=lambda p: p.parts[-3])
def test_role_platforms_are_what_preflight_accepts(meta):
    got = meta_platforms(meta)
    assert got == set(DEFAULT_SUPPORTED_OS), (
        f"{meta.relative_to(ROOT)} lists {sorted(got)}, the preflight accepts {sorted(DEFAULT_SUPPORTED_OS)}")
