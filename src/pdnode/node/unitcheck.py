"""Check a unit file with `systemd-analyze verify` under its real name (Ansible validate),
and write an argv into an `Exec*=` line so that systemd reads back exactly that argv.

    python -m pdnode.node.unitcheck TEMPFILE UNITNAME

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
from collections.abc import Sequence
from pathlib import Path

# systemd.syntax(7), systemd.service(5) "Command lines": in a double-quoted word a
# backslash starts a C escape ("\x2f" is "/"), '%' is a specifier wherever it stands
# (expanded before the line is split), '$' an environment variable at exec time; a lone
# ';' outside quotes ends the command and the next word may carry a '+' (run as root).
_EXEC_ESCAPES = {"\\": "\\\\", '"': '\\"', "%": "%%", "$": "$$"}
# The prefixes systemd reads on the first word (systemd.service(5), table 1).
EXEC_PREFIXES = frozenset("-@:+!")


def exec_arg(value: str) -> str:
    """One argument as a double-quoted word that systemd reads back as ``value``."""
    if not isinstance(value, str):
        raise TypeError(f"an Exec argument must be a string, not {type(value).__name__}: {value!r}")
    if "\x00" in value:
        raise ValueError(f"an Exec argument cannot hold a NUL character: {value!r}")
    out = []
    for ch in value:
        if ch in _EXEC_ESCAPES:
            out.append(_EXEC_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")  # a newline would end the directive
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def exec_line(argv: Sequence[str], prefix: str = "", sep: str = " ") -> str:
    """The value of an ``Exec*=`` line running ``argv``: every argument quoted, the
    executable an absolute path (a prefix character systemd reads on the first word
    comes only from ``prefix``), arguments joined by ``sep`` (e.g. " \\\\\\n    ")."""
    if isinstance(argv, str) or not argv:
        raise ValueError(f"an Exec line needs a non-empty list of arguments, not {argv!r}")
    if not isinstance(argv[0], str) or not argv[0].startswith("/"):
        raise ValueError(f"the executable of an Exec line must be an absolute path, not {argv[0]!r}")
    if set(prefix) - EXEC_PREFIXES:
        raise ValueError(f"{prefix!r} is not a systemd Exec prefix ({''.join(sorted(EXEC_PREFIXES))})")
    return prefix + sep.join(exec_arg(str(a) if isinstance(a, int) and not isinstance(a, bool) else a) for a in argv)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m pdnode.node.unitcheck TEMPFILE UNITNAME", file=sys.stderr)
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
