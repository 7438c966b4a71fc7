"""Install the pdnode bundle into a release virtualenv (run by the venv's own python).

    python - TARBALL BUNDLE_ID < install_bundle.py

Unpacks TARBALL into <venv>/src/pdnode-<BUNDLE_ID>, points <venv>'s site-packages at it
with pdnode.pth, and removes earlier bundles. Prints "changed" when it changed anything.
"""

import shutil
import sys
import sysconfig
import tarfile
from pathlib import Path

tarball, bundle_id = Path(sys.argv[1]), sys.argv[2]
src = Path(sys.prefix) / "src"
target = src / f"pdnode-{bundle_id}"
pth = Path(sysconfig.get_paths()["purelib"]) / "pdnode.pth"
changed = False

if not (target / "pdnode" / "__init__.py").is_file():
    partial = src / f".partial-{bundle_id}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    # Our own tarball; the "data" filter where this Python has it (3.11.4+; Debian 12 has 3.11.2).
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(tarball) as tar:
        tar.extractall(partial, **safe)  # noqa: S202 - our own bundle, built on the controller
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    changed = True
if not pth.is_file() or pth.read_text() != f"{target}\n":
    pth.write_text(f"{target}\n")
    changed = True
for old in src.glob("pdnode-*"):
    if old != target:
        shutil.rmtree(old)
        changed = True
for old in tarball.parent.glob("pdnode-*.tar.gz"):
    if old != tarball:
        old.unlink()
        changed = True
print("changed" if changed else "unchanged")
