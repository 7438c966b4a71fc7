"""Ansible's inventory reading and templating, held to running none of the inventory's code.

`pdnode check` (and render, explain, plan) resolves an inventory with ansible-core's own
inventory and variable managers and templates its values as the playbooks' hostvars do
(pdnode.core.inventory.read). Left alone, that templating runs whatever a value asks for on
the controller: ``"{% set x = lookup('pipe', 'touch ran') %}hi"`` runs ``touch``. Someone
who checks an inventory to review it must not run its code (pdnode.core.inventory.deferred says
what happens to such a value instead).

ansible-core 2.21 has no switch for it: ``Templar.template(disable_lookups=...)`` is
deprecated and ignored, and the inventory plugins' ``disable_lookups`` "has no effect".
So while pdnode reads an inventory, ``guard()`` closes the doors its templating has:

- every lookup (the Jinja globals ``lookup``, ``query`` and ``q``) goes through
  ``ansible._internal._templating._jinja_plugins._invoke_lookup``: replaced by one that
  loads and runs nothing;
- filters and tests are resolved by ``JinjaPluginIntercept.__getitem__`` (each
  environment's ``filters`` and ``tests``): a collection's name is refused before its
  Python is imported; a plugin that is not ansible-core's (a plugin directory's) and
  ansible-core's filters and tests that read the controller's filesystem
  (``READS_FILES``) are refused before they run. Jinja's and ansible-core's others
  compute from their arguments alone and stay;
- ``{% include %}``, ``{% import %}`` and ``{% extends %}`` load a file through
  ``jinja2.Environment._load_template``: refused;
- the inventory plugins that run code are not enabled: ``script`` executes any
  executable file of the inventory (an executable ``hosts.yml`` too), ``auto`` loads the
  plugin a YAML file names (a cloud's, or ``constructed``, which templates). Only
  ``host_list``, ``yaml`` (YAML and JSON), ``ini`` and ``toml`` parse.

Each refusal is recorded (what the value needed) before it is raised; the record, not
the error, is what counts: a ``default`` filter or a ``{% set %}`` can swallow the error.
The guard is active only in the calling process, only while pdnode reads: ansible-playbook
templates the same values normally at deploy time. If this ansible-core is not shaped as
read here, ``guard()`` refuses to read the inventory rather than template with lookups on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from .limits import InventoryError

# ansible-core's filters and tests whose answer is the controller's filesystem
# (ansible/plugins/filter/core.py, ansible/plugins/test/files.py)
READS_FILES = {
    "filter": frozenset({"fileglob", "realpath"}),
    "test": frozenset({"exists", "link_exists", "file", "is_file", "directory", "is_dir", "link", "is_link",
                       "mount", "is_mount", "same_file", "is_same_file"}),
}
# the inventory plugins that parse files and run nothing
SAFE_INVENTORY_PLUGINS = frozenset({"host_list", "yaml", "ini", "toml"})


class Refused(KeyError):
    """A template needed something that runs code on the controller. A KeyError: Jinja
    reads one from a filter or test lookup as "no such plugin" (its own message)."""


@functools.cache
def _shape_problem() -> str | None:
    """Why this ansible-core cannot be guarded as written here (None: it can)."""
    import jinja2
    from ansible._internal._templating import _jinja_bits, _jinja_plugins

    env = _jinja_bits.AnsibleEnvironment()
    if not all(env.globals.get(name) is fn for name, fn in
               (("lookup", _jinja_plugins._lookup), ("query", _jinja_plugins._query), ("q", _jinja_plugins._query))):
        return "its Jinja globals lookup/query/q are not the functions pdnode intercepts"
    if not all("_invoke_lookup" in fn.__code__.co_names for fn in (_jinja_plugins._lookup, _jinja_plugins._query)):
        return "its lookups no longer run through _invoke_lookup"
    if not all(isinstance(m, _jinja_plugins.JinjaPluginIntercept) for m in (env.filters, env.tests)):
        return "its filters and tests are no longer resolved by JinjaPluginIntercept"
    if not callable(getattr(jinja2.Environment, "_load_template", None)):
        return "its Jinja loads included templates another way"
    return None


@contextlib.contextmanager
def guard() -> Iterator[list[str]]:
    """While active: no lookup, include, foreign or file-reading filter/test, and no
    code-running inventory plugin. Yields the record: what templates needed since the
    caller last cleared it (``lookup('pipe')``, ``the filter community.general.x``, ...)."""
    import jinja2
    from ansible import constants
    from ansible._internal._templating import _jinja_plugins

    why = _shape_problem()
    if why is not None:
        import ansible
        raise InventoryError(f"ansible-core {ansible.__version__}: pdnode cannot template the inventory without "
                             f"running its lookups ({why}); use the ansible-core pyproject.toml pins")
    record: list[str] = []

    def refuse(what: str) -> None:
        record.append(what)
        raise Refused(what)

    def no_lookup(**kwargs: Any) -> Any:
        wanted = kwargs.get("lookup_kwargs") or {}
        refuse(f"{'query' if wanted.get('wantlist') else 'lookup'}({kwargs.get('plugin_name')!r})")

    resolve = _jinja_plugins.JinjaPluginIntercept.__getitem__

    def plugin(self: Any, key: str) -> Any:
        kind = self._plugin_loader.type  # filter | test
        short = key.removeprefix("ansible.builtin.").removeprefix("ansible.legacy.")
        if "." in short:
            refuse(f"the {kind} {key} (a collection's)")
        if short in READS_FILES.get(kind, ()):
            refuse(f"the {kind} {key} (it reads the controller's files)")
        try:
            found = self._plugin_loader.get(key)
        except Exception:  # noqa: BLE001 - not a plugin's name (a test alias such as '=='): resolve() says
            found = None
        if found is not None and not str(found.ansible_name).startswith("ansible.builtin."):
            refuse(f"the {kind} {key} (not ansible-core's)")
        return resolve(self, key)

    def no_include(self: Any, name: Any, globals: Any) -> Any:  # noqa: A002 - Jinja's parameter name
        refuse(f"an include of {name!r}")

    load_template = jinja2.Environment._load_template
    invoke_lookup = _jinja_plugins._invoke_lookup
    enabled = constants.INVENTORY_ENABLED
    _jinja_plugins._invoke_lookup = no_lookup
    _jinja_plugins.JinjaPluginIntercept.__getitem__ = plugin
    jinja2.Environment._load_template = no_include
    constants.INVENTORY_ENABLED = [
        n for n in enabled if n.removeprefix("ansible.builtin.").removeprefix("ansible.legacy.") in SAFE_INVENTORY_PLUGINS]
    try:
        yield record
    finally:
        constants.INVENTORY_ENABLED = enabled
        jinja2.Environment._load_template = load_template
        _jinja_plugins.JinjaPluginIntercept.__getitem__ = resolve
        _jinja_plugins._invoke_lookup = invoke_lookup


def needs(record: list[str]) -> str:
    """What a value needed, once each, in order."""
    return " and ".join(dict.fromkeys(record))
