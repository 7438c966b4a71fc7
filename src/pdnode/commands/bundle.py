"""Pack the pdnode package into a byte-for-byte reproducible tar.gz for the hosts.

    python -m pdnode.commands.bundle OUT.tar.gz

The package packed is this one, as imported: a checkout's src/pdnode, or the
installed wheel's (less the package data only the controller reads).

Same sources -> same bytes (sorted names, zero mtimes and owners, gzip without a
timestamp), so Ansible's copy stays unchanged on a re-run. OUT is rewritten only when
the content differs. Prints the sha256 of the bundle. The sglang role calls write() in
Ansible's own process (the lookup pdnode.sglang_pd.pdnode_bundle), once per run.
"""

import gzip
import hashlib
import io
import os
import sys
import tarfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]  # pdnode/, above commands/
# Package data that only the controller reads (the wheel's copies of checkout files:
# pyproject.toml, pdnode.core.resources).
CONTROLLER_ONLY = {"templates", "roles", "playbooks"}


def build() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(SRC.rglob("*")):
            rel = path.relative_to(SRC)
            if "__pycache__" in rel.parts or path.suffix == ".pyc" or not path.is_file() or rel.parts[0] in CONTROLLER_ONLY:
                continue
            info = tarfile.TarInfo(str(Path("pdnode") / rel))
            data = path.read_bytes()
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def write(out: Path) -> str:
    """Pack into OUT (rewritten only when its content differs); the bundle's sha256."""
    data = build()
    if not out.exists() or out.read_bytes() != data:
        # whole or not at all: a deploy running next to this one may be reading OUT
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, out)
    return hashlib.sha256(data).hexdigest()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m pdnode.commands.bundle OUT.tar.gz", file=sys.stderr)
        return 2
    print(write(Path(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
