"""Read an Ansible inventory directory into the plain variables of one host.

No Ansible import: the CLI must answer in well under a second. Supported layout (the
one this bundle ships): ``hosts.yml`` (YAML inventory), ``group_vars/<group>/*.yml`` or
``group_vars/<group>.yml``, ``host_vars/<host>/*.yml`` or ``host_vars/<host>.yml``.
Precedence as in Ansible: ``all`` < other groups (alphabetical) < host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class InventoryError(Exception):
    """The inventory could not be read (as opposed to read and found invalid)."""


class _VaultValue(str):
    """An ``!vault`` scalar: kept opaque; the plan never needs a secret's value."""


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!vault", lambda loader, node: _VaultValue("<vault>"))
_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


@dataclass(frozen=True)
class HostVars:
    host: str
    groups: tuple[str, ...]
    variables: dict[str, Any]
    sources: dict[str, str]  # variable -> file it came from (for messages)


def _read_yaml(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except OSError as exc:
        raise InventoryError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                             f"{exc.start}); save the file as UTF-8") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise InventoryError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc


def _var_files(base: Path, name: str) -> list[Path]:
    single = [base / f"{name}{ext}" for ext in (".yml", ".yaml") if (base / f"{name}{ext}").is_file()]
    folder = base / name
    many = sorted(p for p in folder.glob("*") if p.suffix in (".yml", ".yaml")) if folder.is_dir() else []
    return single + many


def _walk_groups(name: str, node: Any, parents: tuple[str, ...], found: dict[str, set[str]]) -> None:
    node = node or {}
    if not isinstance(node, dict):
        raise InventoryError(f"hosts.yml: group {name!r} must be a mapping")
    for host in (node.get("hosts") or {}):
        found.setdefault(str(host), set()).update(parents + (name,))
    for child, child_node in (node.get("children") or {}).items():
        _walk_groups(str(child), child_node, parents + (name,), found)


def _host_inline_vars(node: Any, host: str) -> dict[str, Any]:
    node = node or {}
    out: dict[str, Any] = {}
    if host in (node.get("hosts") or {}):
        out.update(node["hosts"][host] or {})
    for child in (node.get("children") or {}).values():
        out.update(_host_inline_vars(child, host))
    return out


def _hosts(path: str | Path) -> tuple[Path, Path, dict[str, Any], dict[str, set[str]]]:
    """The inventory's directory, its hosts.yml, that file's tree and {host: its groups}."""
    root = Path(path)
    if root.is_file():
        root = root.parent
    hosts_file = next((root / n for n in ("hosts.yml", "hosts.yaml") if (root / n).is_file()), None)
    if not root.is_dir() or hosts_file is None:
        raise InventoryError(f"{path}: not an inventory directory (expected {root}/hosts.yml)")
    tree = _read_yaml(hosts_file) or {}
    if not isinstance(tree, dict) or "all" not in tree:
        raise InventoryError(f"{hosts_file}: expected a top-level 'all:' group")
    membership: dict[str, set[str]] = {}
    _walk_groups("all", tree["all"], (), membership)
    if not membership:
        raise InventoryError(f"{hosts_file}: no hosts defined")
    return root, hosts_file, tree, membership


def inventory_hosts(path: str | Path) -> list[str]:
    """Every host of the inventory's hosts.yml, sorted (load_inventory reads one)."""
    return sorted(_hosts(path)[3])


def load_inventory(path: str | Path, host: str | None = None) -> HostVars:
    """Return the merged variables of ``host`` (or of the only host) in an inventory."""
    root, hosts_file, tree, membership = _hosts(path)
    if host is None:
        if len(membership) > 1:
            names = ", ".join(sorted(membership))
            raise InventoryError(f"{hosts_file}: several hosts ({names}); choose one with --host")
        host = next(iter(membership))
    if host not in membership:
        raise InventoryError(f"{hosts_file}: no host {host!r} (hosts: {', '.join(sorted(membership))})")

    groups = ("all",) + tuple(sorted(membership[host] - {"all"}))
    variables: dict[str, Any] = {}
    sources: dict[str, str] = {}
    layers = [(root / "group_vars", g) for g in groups] + [(root / "host_vars", host)]
    for base, name in layers:
        for file in _var_files(base, name):
            data = _read_yaml(file) or {}
            if not isinstance(data, dict):
                raise InventoryError(f"{file}: expected a mapping of variables")
            variables.update(data)
            rel = str(file.relative_to(root.parent)) if root.parent in file.parents else str(file)
            sources.update({k: rel for k in data})
    inline = _host_inline_vars(tree["all"], host)
    variables.update(inline)
    sources.update({k: str(hosts_file.name) for k in inline})
    return HostVars(host=host, groups=groups, variables=variables, sources=sources)


def inventory_variables(path: str | Path) -> dict[str, dict[str, Any]]:
    """Every host of the inventory -> its merged variables: what a layout spanning
    hosts reads of its other hosts (``build_plan(..., inventory=...)``)."""
    return {host: load_inventory(path, host).variables for host in inventory_hosts(path)}
