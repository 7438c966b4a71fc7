"""Check a unit file with `systemd-analyze verify` under its real name (Ansible validate).

    python -m pdnode.unitcheck TEMPFILE UNITNAME

Ansible's `validate` hands over a temporary file without the unit's suffix, which
systemd-analyze refuses; this copies it into a private directory under UNITNAME first.
Fails on any output of systemd-analyze, not only on its exit code: it reports many
problems (unknown keys, bad values) on stderr and still exits 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m pdnode.unitcheck TEMPFILE UNITNAME", file=sys.stderr)
        return 2
    src, name = args
    with tempfile.TemporaryDirectory(prefix="pdnode-unitcheck-") as tmp:
        unit = Path(tmp) / name
        shutil.copyfile(src, unit)
        proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or output:
        print(f"{name}: systemd-analyze verify: {output or f'exit {proc.returncode}'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
