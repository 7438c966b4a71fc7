"""Reading secret files the way the services expect them (stdlib only)."""

from __future__ import annotations

import os
import stat


class SecretError(Exception):
    pass


def read_secret_file(path: str) -> str:
    """Return the secret in ``path``; refuse files others can read, and empty ones."""
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as fh:
            value = fh.read()
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(f"secret file {path} is readable by group or others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 0400 it")
    value = value[:-1] if value.endswith("\n") else value
    if not value.strip():
        raise SecretError(f"secret file {path} is empty")
    return value
