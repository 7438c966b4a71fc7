"""A role's file list from the plan (paths, modes, owners, readers, validators: computed in
Python) with each file's content: given, or rendered from the role's template."""

from __future__ import annotations

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible.template import trust_as_template
from ansible._internal._templating import _template_vars
from ansible._internal._templating._engine import TemplateOptions

DOCUMENTATION = r"""
name: role_files
short_description: Fill in the content of a plan's file entries, rendering the role's templates
description:
  - Each term is one file entry of a role's view of the plan (for example
    C(_pdnode_plan.roles.pd_services.files)). An entry with C(template) gets its content
    rendered from that template of the calling role, with the task's variables and C(svc)
    (the entry's C(service) looked up in O(services)); an entry with C(content) keeps it.
    Either comes after the ansible_managed comment when the entry has C(header) true.
  - What comes back is the entry as the pd_services_files module takes it (path, content,
    mode, owner, group, roles, unit, validate, digest); C(kind), C(template), C(service)
    and C(header) are dropped, and so are keys whose value is null.
  - Rendered as the template lookup renders (ansible_managed included), in the controller's
    process. The plan decides which files exist and who reads them; the templates only
    write their text.
options:
  _terms:
    description: The file entries.
    required: true
    type: list
    elements: dict
  services:
    description: Service id -> what its templates read (the view's C(services)).
    type: dict
    default: {}
  probe:
    description: What the pair probe's templates read (the view's C(probe)), or null.
    type: raw
"""

RETURN = r"""
_raw:
  description: The entries, each with its content.
  type: list
  elements: dict
"""

# The header of a file whose text the plan gives (header: true), as the role's templates open
HEADER = "{{ ansible_managed | comment }}\n"
MODULE_KEYS = ("path", "content", "mode", "owner", "group", "roles", "unit", "validate", "digest", "converged")


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        services, probe = self.get_option("services"), self.get_option("probe")
        # one shallow copy for every template of the call: they add to it, never change a value
        scope = dict(variables)
        out = []
        # query('...', entries) hands the list as one term; entries one by one, as terms
        entries = [e for term in terms for e in (term if isinstance(term, list) else [term])]
        for entry in entries:
            if not isinstance(entry, dict) or "path" not in entry:
                raise AnsibleLookupError(f"role_files: {entry!r} is not a file entry (a mapping with a path)")
            item = dict(entry)
            if item.get("template"):
                service = item.get("service")
                if service is not None and service not in services:
                    raise AnsibleLookupError(f"role_files: {item['path']}: service {service!r} is not in services")
                item["content"] = self._render(item["template"], scope,
                                               {"svc": services.get(service), "probe": probe})
            elif item.get("content") is None:
                raise AnsibleLookupError(f"role_files: {item['path']} has neither content nor template")
            if item.get("header"):
                # the ansible_managed comment every file a person may open starts with
                item["content"] = self._text(HEADER, "ansible_managed", scope, {}) + item["content"]
            # null and false (the module's defaults) are left out
            out.append({key: item[key] for key in MODULE_KEYS if item.get(key) not in (None, False)})
        return out

    def _render(self, name: str, scope: dict, extra: dict) -> str:
        path = self.find_file_in_search_path(scope, "templates", name)
        if not path:
            raise AnsibleLookupError(f"role_files: template {name} not found")
        text = self._loader.get_text_file_contents(path)
        # A template's final newline is dropped, as Jinja drops it from an included template:
        # the files stay byte for byte what the role wrote when it rendered them by include
        # (a changed unit would restart its service on the next deploy).
        return self._text(text[:-1] if text.endswith("\n") else text, name, scope, extra, path)

    def _text(self, text: str, name: str, scope: dict, extra: dict, path: str | None = None) -> str:
        found = scope.get("ansible_search_path", [])
        searchpath = ([os.path.dirname(path)] if path else []) + [
            p for base in found for p in (os.path.join(base, "templates"), base)]
        # (the header of a text the plan gives names this plugin as its source)
        added = _template_vars.generate_ansible_template_vars(
            path=name, fullpath=path or __file__, include_ansible_managed="ansible_managed" not in scope)
        templar = self._templar.copy_with_new_env(available_variables={**scope, **added, **extra}, searchpath=searchpath)
        # the template lookup's own call: no top-level finalization of the text
        return templar._engine.template(trust_as_template(text), options=TemplateOptions(escape_backslashes=False))
