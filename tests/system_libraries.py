"""Unresolved shared libraries of the compiled code in a Python environment.

A wheel's extension module can link a system library that pip does not install
(mooncake-transfer-engine-non-cuda needs libibverbs.so.1 from Debian's libibverbs1).
It imports on the machine where someone installed that package by hand and fails
everywhere else, so the tests ask `ldd` about every shared object and name the
package from scripts/lib/system-packages that provides what is missing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE_LIST = REPO / "scripts" / "lib" / "system-packages"
_NOT_FOUND = re.compile(r"^\s*(\S+) => not found", re.MULTILINE)


def provided_sonames() -> dict[str, str]:
    """soname -> Debian package, from the `provides:` notes of scripts/lib/system-packages."""
    out: dict[str, str] = {}
    for line in PACKAGE_LIST.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        note = line.split("#", 1)[1] if "#" in line else ""
        if words and "provides:" in note:
            for soname in note.split("provides:", 1)[1].split():
                out[soname.strip(",;")] = words[0]
    return out


def shared_objects(site_packages: Path) -> list[Path]:
    """Every ELF shared object under site_packages (extension modules and bundled libs)."""
    found = []
    for path in sorted(site_packages.rglob("*.so*")):
        if path.is_file() and not path.is_symlink() and re.search(r"\.so(\.\d+)*$", path.name):
            with path.open("rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def unresolved(paths: list[Path]) -> dict[str, list[Path]]:
    """soname -> the shared objects that need it and cannot find it."""
    missing: dict[str, list[Path]] = {}
    carried = {p.name for p in paths}
    for chunk in (paths[i:i + 200] for i in range(0, len(paths), 200)):
        # One ldd call per chunk: it prints "FILE:" before each file's dependencies
        # (but no such line when it was given one file).
        proc = subprocess.run(["ldd", *map(str, chunk)], capture_output=True, text=True, check=False)
        current: Path | None = chunk[0] if len(chunk) == 1 else None
        for line in proc.stdout.splitlines():
            if not line.startswith(("\t", " ")) and line.endswith(":"):
                current = Path(line[:-1])
                continue
            m = _NOT_FOUND.match(line)
            # A library that the same environment carries (triton's plugins link
            # triton/_C/libtriton.so without an rpath) is loaded by its package first.
            if m and current is not None and m.group(1) not in carried:
                missing.setdefault(m.group(1), []).append(current)
    return missing


def explain(missing: dict[str, list[Path]], root: Path, packages: dict[str, str] | None = None) -> list[str]:
    """One line per missing library, naming the package that provides it."""
    packages = provided_sonames() if packages is None else packages
    lines = []
    for soname, users in sorted(missing.items()):
        needed_by = ", ".join(str(p.relative_to(root)) for p in users[:3]) + (" ..." if len(users) > 3 else "")
        if soname in packages:
            fix = (f"install the Debian package {packages[soname]} (scripts/setup does: it is in "
                   "scripts/lib/system-packages; run scripts/setup)")
        else:
            fix = ("no package in scripts/lib/system-packages provides it: find the package "
                   f"(`dpkg -S {soname}` where it is installed) and add it there with `provides: {soname}`")
        lines.append(f"{soname} not found (needed by {needed_by}): {fix}")
    return lines
