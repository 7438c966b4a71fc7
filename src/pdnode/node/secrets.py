"""Reading a secret file the way every pdnode process on the host does (stdlib only).

One key per file, one trailing newline allowed; files that others can read, empty
files, FIFOs and multi-line content are refused with one clear line.

``key_problem`` is the stricter rule for a key the deploy installs (`pdnode_api_key_file`):
exactly one key of 16 to 4096 printable ASCII characters other than space, on one line
with an optional trailing newline. The plan applies it on the controller and the
pd_services role again on the host before anything is written
(``python -m pdnode.node.secrets FILE``). No message ever quotes the file's content.
"""

from __future__ import annotations

import os
import re
import stat
import sys


KEY_MIN, KEY_MAX = 16, 4096
_KEY = re.compile(rb"[!-~]+")  # printable ASCII, no space
MAX_READ = 65536


class SecretError(Exception):
    pass


def key_problem(raw: bytes) -> str | None:
    """Why RAW (a key file's bytes) is not exactly one key, or None (never quotes RAW)."""
    body = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
    if not body:
        return "is empty"
    if b"-----BEGIN" in body or b"PRIVATE KEY" in body:
        return "holds a private key or a certificate (PEM), not an API key"
    lines = body.count(b"\n") + 1
    if lines > 1:
        return f"holds {lines} lines; a key file holds one key on one line"
    if not _KEY.fullmatch(body):
        return "holds a character that is not printable ASCII or a space (a key is one word)"
    if len(body) < KEY_MIN:
        return f"holds a key of {len(body)} characters; a key has at least {KEY_MIN}"
    if len(body) > KEY_MAX:
        return f"holds {len(body)} characters; a key has at most {KEY_MAX}"
    return None


def key_file_problem(path: str) -> str | None:
    """Why the file at PATH does not hold exactly one key, or None: a regular file (no FIFO
    wait, links followed), bounded read, ``key_problem`` on its bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "is not a regular file"
        raw = os.read(fd, MAX_READ + 1)
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    finally:
        os.close(fd)
    if len(raw) > MAX_READ:
        return f"is larger than {MAX_READ} bytes; a key file holds one key"
    return key_problem(raw)


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


def main(argv: list[str] | None = None) -> int:
    """python -m pdnode.node.secrets FILE...: exit 0 when each file holds exactly one key;
    else one line per file naming it and the problem (never its content), exit 1."""
    paths = sys.argv[1:] if argv is None else argv
    bad = 0
    for path in paths:
        problem = key_file_problem(path)
        if problem:
            print(f"{path}: {problem}", file=sys.stderr)
            bad += 1
    return 1 if bad or not paths else 0


if __name__ == "__main__":
    sys.exit(main())
