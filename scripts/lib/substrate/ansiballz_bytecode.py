"""Bytecode for the Python that Ansible sends to the test containers (the substrate image
only: scripts/substrate puts this file and a .pth that imports it into the image; real
hosts never get it).

Each module run is an AnsiballZ zip of sources under a new temporary path, and zipimport
never writes bytecode, so every run compiles ansible.module_utils again: about 60 ms of the
~190 ms a module costs a container, some 1,800 times a CI (docs/measurements.md, "Bytecode
for the modules on the test hosts"). This keeps each compiled file under a key made of its
path inside the payload and its source, and gives later runs the same code with their own
file name (tracebacks name the real path). Nothing else changes: a file whose source
differs compiles anew, an unreadable or broken cache entry compiles anew, a cache that
cannot be written is skipped, and files from any other zip are left to zipimport.

ANSIBALLZ_BYTECODE_CACHE overrides the cache directory (tests)."""

import os
import sys
import zipimport

_PAYLOAD = "_payload.zip" + os.sep  # AnsiballZ's ansible_<module>_payload.zip
_compile = getattr(zipimport, "_compile_source", None)  # pure-Python zipimport: 3.8 and later


def _cache_dir():
    return os.environ.get("ANSIBALLZ_BYTECODE_CACHE", "/var/cache/ansiballz-bytecode")


def _renamed(code, filename):
    """The code, and every function and class body inside it, with this file name."""
    code_type = type(code)
    consts = tuple(_renamed(c, filename) if isinstance(c, code_type) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _compile_cached(pathname, source):
    _archive, payload, inner = pathname.partition(_PAYLOAD)
    if not payload:
        return _compile(pathname, source)
    import hashlib
    import marshal

    key = hashlib.sha256(inner.encode() + b"\0" + source).hexdigest()
    entry = os.path.join(_cache_dir(), key + "." + sys.implementation.cache_tag)
    try:
        with open(entry, "rb") as f:
            # written only by this module, in a directory only root can write (0700)
            return _renamed(marshal.load(f), pathname)  # noqa: S302
    except (OSError, EOFError, ValueError, TypeError):
        pass  # not cached yet, or unreadable: compile
    code = _compile(pathname, source)
    try:
        os.makedirs(_cache_dir(), mode=0o700, exist_ok=True)
        partial = f"{entry}.{os.getpid()}"
        with open(partial, "wb") as f:
            marshal.dump(code, f)
        os.replace(partial, entry)  # whole entries only, whoever writes at the same time
    except OSError:
        pass
    return code


if _compile is not None:
    zipimport._compile_source = _compile_cached
