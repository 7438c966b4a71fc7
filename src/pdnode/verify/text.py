"""Text from the node made safe to print (the one place evidence is cleaned).

Bodies, headers, metric lines and unit properties come from the node or from whatever
answers on its ports: a stray binary body, ANSI escape sequences or bidirectional
overrides must not reach an operator's terminal or the Ansible output raw. Every
character that is not printable (C0/C1 controls, DEL, ESC, format characters such as
U+202E, unassigned code points) is shown escaped (``\\x1b``, ``\\u202e``); runs of
whitespace, line breaks included, become one space, so evidence stays one line.
"""

from __future__ import annotations

import re

_SPACE = re.compile(r"[ \t\r\n\f\v\u0085\u2028\u2029]+")


def printable(text: object, limit: int | None = None) -> str:
    """``text`` as one printable line; cut to ``limit`` characters (then '...')."""
    s = text if isinstance(text, str) else str(text)
    s = _SPACE.sub(" ", s)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else _escape(c) for c in s)
    if limit is not None and len(s) > limit:
        s = s[:limit] + "..."
    return s


def _escape(c: str) -> str:
    n = ord(c)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"
