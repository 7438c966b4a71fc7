"""Limits on what an inventory file may hold, checked before Ansible reads it.

A YAML alias bomb (billion laughs) is a few hundred bytes that expand to billions of
nodes in whatever walks the loaded value (templating, the plan's checks); a 20,000-deep
nesting ends parsers in a RecursionError; a multi-megabyte file takes seconds. A node
description is a few kilobytes, so each of these is refused with one line (exit 2) long
before it costs time: file size, total size, nesting depth and the number of nodes after
aliases are expanded. The files held to them are every file Ansible could read as
inventory or variables under the inventory's directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000  # per file, counting every alias as the whole value it stands for
# what Ansible reads as YAML/JSON variables or inventory (YAML_FILENAME_EXTENSIONS, plus
# no extension; .ini inventories have no aliases or nesting, only their size counts)
_STRUCTURED = {"", ".yml", ".yaml", ".json"}


class InventoryError(Exception):
    """The inventory could not be read (as opposed to read and found invalid)."""


def _files(source: Path) -> list[Path]:
    root = source if source.is_dir() else source.parent
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [Path(dirpath) / n for n in sorted(filenames) if not n.startswith(".")]
    return found


def _walk_nodes(file: Path, root: yaml.Node) -> None:
    """Count nodes with aliases expanded (each alias shares its anchor's node object),
    and the depth, without recursion; stop at the first limit crossed."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise InventoryError(f"{file}: more than {MAX_NODES} values once its YAML aliases are expanded (an "
                                 "alias bomb?); write the values out or use fewer nested aliases")
        if depth > MAX_DEPTH:
            raise InventoryError(f"{file}: nested deeper than {MAX_DEPTH} levels; flatten the structure")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))


def _json_depth(value: object) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def _flow_depth(text: str) -> int:
    """The deepest nesting of YAML flow collections ([ and {), outside quotes and comments."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    quote = None
    previous = "\n"
    for ch in text:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"" and previous in " \t\n[{,:":
            quote = ch
        elif ch == "#" and previous in " \t\n":
            quote = "\n"  # a comment runs to the end of the line
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
        previous = ch
    return deepest


def _check_structure(file: Path, text: str) -> None:
    if file.suffix == ".json":
        try:
            value = json.loads(text)
        except RecursionError:
            raise InventoryError(f"{file}: nested deeper than {MAX_DEPTH} levels; flatten the structure") from None
        except ValueError:
            value = None  # not JSON: Ansible reads it as YAML, so it is held to the YAML limits below
        else:
            if _json_depth(value) > MAX_DEPTH:
                raise InventoryError(f"{file}: nested deeper than {MAX_DEPTH} levels; flatten the structure")
            return
    if _flow_depth(text) > MAX_DEPTH:  # before the parser spends a second on 20,000 brackets
        raise InventoryError(f"{file}: nested deeper than {MAX_DEPTH} levels; flatten the structure")
    try:
        # The pure-Python composer: it builds the node graph without expanding aliases
        # and raises RecursionError on deep nesting (the C one would recurse on the C stack).
        for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
            if document is not None:
                _walk_nodes(file, document)
    except RecursionError:
        raise InventoryError(f"{file}: nested deeper than {MAX_DEPTH} levels; flatten the structure") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise InventoryError(f"{file}{where}: not valid YAML ({problem}); fix the syntax there") from None


def check_limits(source: Path) -> None:
    """Raise InventoryError (one line) if a file under the inventory is too large, too
    deep or expands too far; otherwise return having read nothing into Ansible."""
    total = 0
    for file in _files(source):
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise InventoryError(f"cannot read {file}: {exc.strerror}") from None
        if size > MAX_FILE_BYTES:
            raise InventoryError(f"{file}: {size} bytes, more than the {MAX_FILE_BYTES} an inventory file may hold; "
                                 "a node description is a few kilobytes: keep large data out of the inventory")
        total += size
        if total > MAX_TOTAL_BYTES:
            raise InventoryError(f"{source}: its files hold more than {MAX_TOTAL_BYTES} bytes; keep large data out of "
                                 "the inventory")
        if file.suffix not in _STRUCTURED:
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise InventoryError(f"cannot read {file}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise InventoryError(f"{file}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                                 "save the file as UTF-8") from None
        _check_structure(file, text)
