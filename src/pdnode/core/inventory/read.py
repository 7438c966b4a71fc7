"""Read an Ansible inventory into the variables of its hosts, exactly as Ansible does.

Ansible is the judge of what a host gets: its own inventory manager parses the
inventory and its own variable manager resolves precedence (group_vars and host_vars as
files or directories, .yml/.yaml/.json/no extension, inline vars, nested groups), and
values are templated through its hostvars, as the playbooks' ``pdnode_plan`` filter
sees them. So ``pdnode check`` validates the value the deploy will use, by construction
(tests/test_inventory_ansible.py compares with ``ansible-inventory`` over many layouts).

Before Ansible reads anything, every file it could read is held to size, nesting and
alias-expansion limits (limits.py): an alias bomb or a 20,000-deep nesting is
refused in one line instead of running for minutes or ending in a traceback.

Reading runs none of the inventory's code (guard.py): no lookup, no include, no
filter or test from outside ansible-core or that reads the controller's files, no inventory
script. A value that needs one is not computed: its variable (or the one string of a
mapping or list that needs it) holds a ``deferred.Deferred``, the value as written, which
the plan refuses or passes with a warning (pdnode.core.inventory.deferred).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .deferred import Deferred
from .guard import guard, needs
from .limits import InventoryError, check_limits

__all__ = ["HostVars", "InventoryError", "inventory_dirs", "inventory_hosts", "inventory_variables", "load_inventory"]

VAULT_PLACEHOLDER = "<vault>"  # the plan never needs a secret's value, only that it is set

# Variables Ansible adds to every host itself (magic variables): not part of the
# description, and some (groups, playbook_dir) differ between callers.
_MAGIC = frozenset({
    "ansible_config_file", "ansible_facts", "ansible_local", "ansible_playbook_python", "ansible_version",
    "group_names", "groups", "inventory_dir", "inventory_file", "inventory_hostname", "inventory_hostname_short",
    "playbook_dir", "omit", "ansible_check_mode", "ansible_diff_mode", "ansible_forks", "ansible_run_tags",
    "ansible_skip_tags", "ansible_verbosity", "ansible_inventory_sources", "ansible_limit", "ansible_play_batch",
    "ansible_play_hosts", "ansible_play_hosts_all", "ansible_play_name", "ansible_play_role_names",
    "ansible_role_names", "ansible_dependent_role_names", "role_names", "play_hosts",
})


@dataclass(frozen=True)
class HostVars:
    host: str
    groups: tuple[str, ...]
    variables: dict[str, Any]
    sources: dict[str, str]  # variable -> file it came from (for messages)
    inventory_dir: str | None = None  # Ansible's inventory_dir of the host (the model's lock file is there)


def _source_of(path: Path) -> Path:
    """What to hand Ansible: the path as given (a directory loads every inventory file
    in it, as ``-i DIR`` does)."""
    if not path.exists():
        raise InventoryError(f"{path}: no such inventory (give a directory such as inventories/gpu01)")
    return path


def _plain(value: Any, vault_type: type) -> Any:
    """Ansible's tagged values -> plain Python (the plan's JSON and type checks want
    exact types); a vaulted string -> a placeholder, never decrypted."""
    if isinstance(value, vault_type):
        return VAULT_PLACEHOLDER
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {_plain(k, vault_type): _plain(v, vault_type) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, vault_type) for v in value]
    return value


def _contains(value: Any, kind: type) -> bool:
    if isinstance(value, kind):
        return True
    if isinstance(value, dict):
        return any(_contains(v, kind) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains(v, kind) for v in value)
    return False


_PROBE = "__pdnode_probe__"  # the name one string of a variable is templated under, alone


def _templated(whole: Callable[[], Any], one: Callable[[Any], Any], raw: Any, record: list[str], where: str,
               vault_type: type, error_type: type) -> Any:
    """A variable's value as the playbooks see it (``whole()``), plain; where templating
    needed code (``record``, guard.py), a Deferred instead: of the whole value
    when it is one string, else of each string of the mapping or list that needs it
    (``one(string)`` templates that string alone), so a message names the very key."""
    record.clear()
    try:
        value = _plain(whole(), vault_type)
    except Exception as exc:
        if record:
            value = None
        elif isinstance(exc, error_type):
            raise InventoryError(f"{where}: {_first_line(exc)}") from None
        else:
            raise
    if not record:
        return value
    if isinstance(raw, dict):
        return {_plain(k, vault_type): _templated(lambda v=v: one(v), one, v, record, where, vault_type, error_type)
                for k, v in raw.items()}
    if isinstance(raw, (list, tuple)):
        return [_templated(lambda v=v: one(v), one, v, record, where, vault_type, error_type) for v in raw]
    return Deferred(str.__str__(raw) if isinstance(raw, str) else str(raw), needs(record))


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return " ".join(str(text).split("\n")[0].split())


@dataclass(frozen=True)
class _Resolved:
    hosts: dict[str, HostVars]


def _fingerprint(path: Path) -> tuple:
    """Every file under the inventory, with its size and mtime: a changed file is a new
    key of the in-process memo (tests write inventories and read them again)."""
    root = path if path.is_dir() else path.parent
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            entries.append((dirpath, name, st.st_size, st.st_mtime_ns))
    return (str(path.resolve()), tuple(entries))


def _resolve(path: str | Path) -> _Resolved:
    source = _source_of(Path(path))
    check_limits(source)
    return _resolve_cached(_fingerprint(source), str(source))


@lru_cache(maxsize=32)
def _resolve_cached(_key: tuple, source: str) -> _Resolved:
    # Ansible is imported only here: the commands that never read an inventory stay light.
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import EncryptedString
    from ansible.utils.display import Display
    from ansible.vars.hostvars import HostVars as AnsibleHostVars
    from ansible.vars.hostvars import HostVarsVars as AnsibleVarsView
    from ansible.vars.manager import VariableManager

    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # a later ansible-core moved it: messages lose the file, nothing else
        Origin = None  # noqa: N806

    # Ansible's host_group_vars plugin remembers, per process, which var files a
    # directory holds: a fresh process has none of that, and a re-read here must not
    # either (the planner writes host_vars and checks them in one process).
    from ansible.plugins.vars import host_group_vars
    for memo in (getattr(host_group_vars, "FOUND", None), getattr(host_group_vars, "NAK", None)):
        if memo is not None:
            memo.clear()

    warnings: list[str] = []
    display = Display()
    real_warning = display.warning
    display.warning = lambda msg, *a, **k: warnings.append(_first_line(Exception(msg)))  # type: ignore[method-assign]
    try:
        with guard() as record:  # none of the inventory's code runs (guard.py)
            # messages name a file as inventories/gpu01/group_vars/all/x.yml does: from the
            # folder that holds the inventory
            base = os.path.dirname(os.path.abspath(source if os.path.isdir(source) else os.path.dirname(source)))
            loader = DataLoader()
            inventory = InventoryManager(loader=loader, sources=[source])
            manager = VariableManager(loader=loader, inventory=inventory)
            hostvars = AnsibleHostVars(inventory=inventory, variable_manager=manager, loader=loader)
            hosts = inventory.get_hosts()
            if not hosts:
                why = "; ".join(w for w in warnings if w) or "it defines no hosts"
                raise InventoryError(f"{source}: Ansible read no hosts from it ({why}); "
                                     f"`ansible-inventory -i {source} --graph` shows what Ansible sees")
            out: dict[str, HostVars] = {}
            for host in hosts:
                raw = manager.get_vars(host=host, include_hostvars=False)
                view = hostvars[host.name]  # templates on access, as the playbooks' hostvars do

                def probe(text: Any, _host: str = host.name) -> Any:
                    """One string of a variable, templated alone among the host's variables."""
                    return AnsibleVarsView({**hostvars.raw_get(_host), _PROBE: text}, loader=loader, host=_host)[_PROBE]

                variables: dict[str, Any] = {}
                sources: dict[str, str] = {}
                for key in sorted(raw):
                    if key in _MAGIC:
                        continue
                    name, value = str.__str__(key), raw[key]
                    if _contains(value, EncryptedString):
                        variables[name] = _plain(value, EncryptedString)
                    else:  # templated, as the playbooks see it
                        variables[name] = _templated(
                            lambda n=name, vv=view: vv[n], probe, raw[key], record,
                            f"{source}: host {host.name}: variable {name}", EncryptedString, AnsibleError)
                    origin = Origin.get_tag(raw[key]) if Origin is not None else None
                    if origin is not None and origin.path:
                        sources[name] = _relative(origin.path, base)
                groups = ("all",) + tuple(sorted(str.__str__(g.name) for g in host.get_groups() if g.name != "all"))
                name = str.__str__(host.name)
                where = raw.get("inventory_dir")
                out[name] = HostVars(host=name, groups=groups, variables=variables, sources=sources,
                                     inventory_dir=str.__str__(where) if isinstance(where, str) else None)
            return _Resolved(hosts=out)
    except AnsibleError as exc:
        raise InventoryError(f"{source}: {_first_line(exc)}") from None
    finally:
        display.warning = real_warning  # type: ignore[method-assign]


def _relative(path: str, base: str) -> str:
    path = os.path.abspath(path)
    return os.path.relpath(path, base) if path.startswith(base + os.sep) else path


def inventory_hosts(path: str | Path) -> list[str]:
    """Every host of the inventory, sorted (load_inventory reads one)."""
    return sorted(_resolve(path).hosts)


def load_inventory(path: str | Path, host: str | None = None) -> HostVars:
    """The resolved variables of ``host`` (or of the only host) of an inventory."""
    hosts = _resolve(path).hosts
    if host is None:
        if len(hosts) > 1:
            raise InventoryError(f"{path}: several hosts ({', '.join(sorted(hosts))}); choose one with --host")
        host = next(iter(hosts))
    if host not in hosts:
        raise InventoryError(f"{path}: no host {host!r} (hosts: {', '.join(sorted(hosts))})")
    found = hosts[host]
    return HostVars(host=found.host, groups=found.groups, variables=copy.deepcopy(found.variables),
                    sources=dict(found.sources), inventory_dir=found.inventory_dir)


def inventory_dirs(path: str | Path) -> dict[str, str | None]:
    """Every host of the inventory -> Ansible's inventory_dir for it (where the model's
    lock file is: build_plan(..., inventory_dir=...))."""
    return {name: hv.inventory_dir for name, hv in sorted(_resolve(path).hosts.items())}


def inventory_variables(path: str | Path) -> dict[str, dict[str, Any]]:
    """Every host of the inventory -> its resolved variables: what a layout spanning
    hosts reads of its other hosts (``build_plan(..., inventory=...)``)."""
    return {name: copy.deepcopy(hv.variables) for name, hv in sorted(_resolve(path).hosts.items())}

