"""Every free-form role variable is held to a rule, by its role and by `pdnode check`
(issue 17, section 5): pdnode.core.rules.values.ROLE_RULES is that rule, once.

- every option of a role's argument_specs is typed bool or int, has choices, is in
  ROLE_RULES, or is named below with the reason it needs no pattern;
- every ROLE_RULES variable is asserted in its role's tasks/validate.yml (through the
  pdnode_role_value_problem(s) filter, or inline);
- a pattern a role writes inline (`NAME | string is match('...')`) is the table's, so
  the role and `pdnode check` never disagree on a value.
What each rule refuses: tests/test_plan_hostile.py (check, one line each; the roles,
run by ansible-playbook on localhost).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pdnode.core.rules.values import ROLE_RULES, role_value_problem

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted(ROOT.glob("roles/*/meta/argument_specs.yml"))
# Free-form options that need no pattern of their own, and why.
EXEMPT = {
    "firewall_view": "plan.roles.firewall from the pdnode_plan filter (pdnode check validated every value)",
    "model_view": "plan.roles.model from the pdnode_plan filter (pdnode check validated every value)",
    "model_playbook_dir": "ansible-playbook's own playbook_dir, only resolved to a controller path",
    "monitoring_plan": "the plan from the pdnode_plan filter (pdnode check validated every value)",
    "pd_services_plan": "the plan from the pdnode_plan filter (pdnode check validated every value)",
    **{f"preflight_{n}": "the preflight changes nothing on the host: its values are compared with facts, stat'ed, "
                         "or passed through `quote` (preflight_disk_path); reports go to the controller"
       for n in ("plan", "gpu_model", "gpu_ids", "ports", "ib_devices", "transfer_backend", "model_path",
                 "service_prefix", "supported_os", "disk_path", "min_free_disk_gb", "facts_dir")},
}
INLINE = re.compile(r"^(\w+) \| string is match\('(.*)'\)$")


def _options() -> dict[str, tuple[str, dict]]:
    found = {}
    for spec in SPECS:
        role = spec.parts[-3]
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            for name, option in (entry.get("options") or {}).items():
                found[name] = (role, option)
    return found


def _validate_tasks(role: str) -> list[dict]:
    path = ROOT / "roles" / role / "tasks" / "validate.yml"
    return yaml.safe_load(path.read_text()) if path.is_file() else []


def test_every_free_form_role_option_has_a_rule_or_a_reason():
    options = _options()
    loose = sorted(name for name, (_, o) in options.items()
                   if o.get("type", "str") not in ("bool", "int") and "choices" not in o
                   and name not in ROLE_RULES and name not in EXEMPT)
    assert loose == [], "free-form role options without a rule: add them to pdnode.core.rules.values.ROLE_RULES"
    assert sorted(set(ROLE_RULES) - set(options)) == [], "rules for options no role declares"
    assert sorted(set(EXEMPT) - set(options)) == [], "exemptions for options no role declares"


@pytest.mark.parametrize("name", sorted(ROLE_RULES))
def test_every_rule_is_asserted_by_its_role_first(name):
    role = _options()[name][0]
    text = (ROOT / "roles" / role / "tasks" / "validate.yml").read_text()
    assert re.search(rf"\b{name}\b", text), f"roles/{role}/tasks/validate.yml does not check {name}"
    main = yaml.safe_load((ROOT / "roles" / role / "tasks" / "main.yml").read_text())
    assert main[0].get("ansible.builtin.import_tasks") == "validate.yml" and "always" in main[0]["tags"], (
        f"roles/{role}/tasks/main.yml: the values are checked first, with any tag")


def test_an_inline_pattern_of_a_role_is_the_tables():
    for spec in SPECS:
        role = spec.parts[-3]
        for task in _validate_tasks(role):
            check = task.get("ansible.builtin.assert") or {}
            that = check.get("that", [])
            for expression in [that] if isinstance(that, str) else that:
                m = INLINE.match(expression.strip())
                if m is None:
                    continue
                name, pattern = m.groups()
                if name == "item":  # a loop over one variable: loop: "{{ NAME }}"
                    name = re.fullmatch(r"\{\{ (\w+) \}\}", task["loop"]).group(1)
                assert ROLE_RULES[name].pattern == pattern.replace("''", "'"), f"roles/{role}: {name}"


@pytest.mark.parametrize(("name", "value"), [
    ("sglang_python", "python3"), ("sglang_python", "/usr/bin/python3.12"), ("mooncake_python", "python3.11"),
    ("rdma_limits_file", "/etc/security/limits.d/90-pdnode-rdma-memlock.conf"), ("rdma_packages", ["rdma-core"]),
    ("sglang_venv", "/opt/sglang-pd/venvs/sglang-0.5.23-router-0.3.2-mooncake-0.3.13.post1"),
    ("mooncake_versions", {"non-cuda": "0.3.13.post1", "cuda12": "0.3.13.post1", "cuda13": "0.3.14"}),
    ("sglang_wheelhouse", ""), ("mooncake_stack_cuda", ""), ("pd_services_ready_timeout_s", 1800),
])
def test_the_roles_defaults_and_plan_values_pass(name, value):
    assert role_value_problem(name, value) is None


def test_every_role_default_passes_its_rule():
    for spec in SPECS:
        defaults = yaml.safe_load((spec.parent.parent / "defaults" / "main.yml").read_text()) or {}
        for name, value in defaults.items():
            if name in ROLE_RULES:
                assert role_value_problem(name, value) is None, (name, value)
