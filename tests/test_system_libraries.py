"""Every compiled extension in .venv/ resolves its shared libraries (issue: a library
installed by hand on one machine made CI pass there and fail on a new one)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from system_libraries import explain, provided_sonames, shared_objects, unresolved  # noqa: E402


def test_every_shared_object_in_the_venv_resolves():
    site = Path(sysconfig.get_paths()["purelib"])
    objects = shared_objects(site)
    assert any("mooncake" in str(p) for p in objects), f"no Mooncake engine under {site}: wrong environment?"
    problems = explain(unresolved(objects), site)
    assert not problems, "\n".join(problems)


def test_the_package_list_names_what_mooncake_links():
    assert provided_sonames()["libibverbs.so.1"] == "libibverbs1"


def test_a_missing_library_is_named_with_its_package(tmp_path):
    # A real ELF object linking a library that is gone by the time ldd looks: the
    # detector must report it and name the package the list maps it to.
    soname = "libpdnode-probe.so.1"
    (tmp_path / "dep.c").write_text("int dep(void) { return 1; }\n")
    (tmp_path / "ext.c").write_text("int dep(void); int ext(void) { return dep(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / soname), str(tmp_path / "dep.c"),
                    f"-Wl,-soname,{soname}"], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "ext.cpython-312.so"), str(tmp_path / "ext.c"),
                    str(tmp_path / soname)], check=True)
    (tmp_path / soname).unlink()
    missing = unresolved(shared_objects(tmp_path))
    assert list(missing) == [soname]
    [named] = explain(missing, tmp_path, {soname: "pdnode-probe1"})
    assert named.startswith(f"{soname} not found (needed by ext.cpython-312.so): install the Debian package pdnode-probe1")
    [unnamed] = explain(missing, tmp_path, {})
    assert "no package in scripts/lib/system-packages provides it" in unnamed
