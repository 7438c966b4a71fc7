"""Reading a secret file the way every pdnode process on the host does (stdlib only).

One key per file, one trailing newline allowed; files that others can read, empty
files, FIFOs and multi-line content are refused with one clear line.
"""

from __future__ import annotations

import os
import stat


class SecretError(Exception):
    pass


def read_secret_file(path: str) -> str:
    """The key in PATH: one trailing newline stripped; refuses unsafe or empty files."""
    try:
        # O_NONBLOCK: a FIFO planted at PATH must not hang the launcher
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise SecretError(f"cannot read secret file {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretError(f"secret file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise SecretError(
                f"secret file {path} is accessible by group/other "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(65537)
    finally:
        os.close(fd)
    if len(raw) > 65536:
        raise SecretError(f"secret file {path} is too large to hold one key")
    try:
        key = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"secret file {path} is not UTF-8 text") from None
    if key.endswith("\n"):
        key = key[:-1]
        if key.endswith("\r"):
            key = key[:-1]
    if not key:
        raise SecretError(f"secret file {path} is empty")
    if any(c.isspace() or not c.isprintable() for c in key):
        raise SecretError(
            f"secret file {path}: the key contains whitespace or control characters "
            "(one key, optionally followed by one newline)"
        )
    return key
