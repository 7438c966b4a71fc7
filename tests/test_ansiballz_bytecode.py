"""The substrate image's bytecode cache for Ansible's module payloads
(scripts/lib/substrate/ansiballz_bytecode.py): a later payload runs the code compiled for an
earlier one only when the file and its source are the same, under its own file name, and
nothing but AnsiballZ payloads is touched. Each case runs in a fresh interpreter (the
hook patches zipimport for the whole process); molecule/substrate shows it active in the
image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parents[1] / "scripts" / "lib" / "substrate"

# Imports the module from the zip with the hook active and reports what happened: the
# compiles the hook passed on to zipimport, the module's value, and the file a traceback
# from inside one of its functions names.
RUN = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import ansiballz_bytecode
compiled = []
original = ansiballz_bytecode._compile
def counting(pathname, source):
    compiled.append(pathname)
    return original(pathname, source)
ansiballz_bytecode._compile = counting
sys.path.insert(0, sys.argv[2])
import payload_mod
try:
    payload_mod.boom()
except ValueError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename
print(json.dumps({"compiled": compiled, "value": payload_mod.VALUE, "traceback_file": where}))
"""

SOURCE = "VALUE = {value}\n\ndef boom():\n    raise ValueError('boom')\n"


def payload(tmp: Path, run: str, value: int = 1, name: str = "ansible_command_payload.zip") -> Path:
    """A zip like AnsiballZ's: a new temporary directory for each run, the same inner paths."""
    where = tmp / f"ansible_command_payload_{run}"
    where.mkdir()
    archive = where / name
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("payload_mod.py", SOURCE.format(value=value))
    return archive


def run(archive: Path, cache: Path) -> dict:
    env = {**os.environ, "ANSIBALLZ_BYTECODE_CACHE": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", RUN, str(HOOK_DIR), str(archive)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_later_payload_runs_the_cached_code_under_its_own_file_name(tmp_path):
    cache = tmp_path / "cache"
    first = run(payload(tmp_path, "a"), cache)
    # (zipimport compiles a module for its spec's file name and again for its code: the
    # second comes from the cache already)
    assert len(first["compiled"]) == 1 and len(list(cache.iterdir())) == 1, first
    second_zip = payload(tmp_path, "b")
    second = run(second_zip, cache)
    assert second["compiled"] == [], second  # from the cache
    assert second["value"] == 1
    # the function inside the module names the second payload, not the first
    assert second["traceback_file"] == f"{second_zip}{os.sep}payload_mod.py", second


def test_a_changed_source_compiles_anew(tmp_path):
    cache = tmp_path / "cache"
    run(payload(tmp_path, "a", value=1), cache)
    changed = run(payload(tmp_path, "b", value=2), cache)
    assert len(changed["compiled"]) == 1 and changed["value"] == 2, changed
    assert len(list(cache.iterdir())) == 2


def test_a_broken_cache_entry_compiles_anew(tmp_path):
    cache = tmp_path / "cache"
    run(payload(tmp_path, "a"), cache)
    (entry,) = cache.iterdir()
    entry.write_bytes(b"\x00not marshal data")
    again = run(payload(tmp_path, "b"), cache)
    assert len(again["compiled"]) == 1 and again["value"] == 1, again


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    result = run(payload(tmp_path, "a"), blocked / "cache")
    assert result["compiled"] and result["value"] == 1, result


def test_other_zips_are_left_to_zipimport(tmp_path):
    cache = tmp_path / "cache"
    runs = [run(payload(tmp_path, n, name="library.zip"), cache) for n in ("a", "b")]
    # every compile of both runs went to zipimport's own: nothing kept, nothing reused
    assert runs[0]["compiled"] and len(runs[1]["compiled"]) == len(runs[0]["compiled"]), runs
    assert not cache.exists()
