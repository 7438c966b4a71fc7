"""Every role's defaults/main.yml and meta/argument_specs.yml say the same thing.

The spec is what Ansible checks a role's variables against before the role runs, and
what `ansible-doc --type role` prints; the defaults are what the role runs with when a
playbook passes nothing. A default the spec does not list, a spec default the defaults
file lacks, or the two disagreeing on a value or a type is a lie in one of them. The
judge of "this value fits this spec" is Ansible's own ArgumentSpecValidator (what role
argument validation runs); this test adds what it cannot see: that both files list the
same names with the same defaults, and that no value fits only after a conversion.

A required option has no spec default (Ansible refuses both); its defaults entry, where
there is one, only documents the shape the playbook fills from the plan, and must fit
the spec as it is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())
# argument_specs type -> the Python types a YAML value of that type loads as (no conversion)
TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "path": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
    "list": (list,), "dict": (dict,),
}


def load(role: str) -> tuple[dict, dict]:
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return defaults, specs


def type_problem(name: str, option: dict, value: object) -> str | None:
    """The value is of the option's type as loaded (a bool is no int, a number no str)."""
    kind = option.get("type", "str")
    if kind == "raw" or value is None:
        return None
    want = TYPES.get(kind)
    if want is None:
        return f"{name}: type {kind!r} is not one this lint knows; add it to TYPES"
    if not isinstance(value, want) or (bool not in want and isinstance(value, bool)):
        return f"{name}: {value!r} is {type(value).__name__}, the spec says type {kind}"
    if kind == "list" and "elements" in option:
        for item in value:
            problem = type_problem(f"{name}[]", {"type": option["elements"]}, item)
            if problem:
                return problem
    return None


def test_every_role_has_a_spec():
    assert ROLES == sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_argument_specs_agree(role):
    defaults, specs = load(role)
    options = specs["main"].get("options") or {}
    bad = []
    for name, value in defaults.items():
        option = options.get(name)
        if option is None:
            bad.append(f"{name}: in defaults/main.yml, not in meta/argument_specs.yml")
            continue
        if "type" not in option:
            bad.append(f"{name}: the spec gives no type")
        if option.get("required"):
            pass  # no spec default possible; the value's type is checked below
        elif "default" not in option:
            bad.append(f"{name}: defaults/main.yml has {value!r}, the spec no default")
        elif option["default"] != value:
            bad.append(f"{name}: defaults/main.yml has {value!r}, the spec's default is {option['default']!r}")
        problem = type_problem(name, option, value)
        if problem:
            bad.append(problem)
    for name, option in options.items():
        if "default" in option and name not in defaults:
            bad.append(f"{name}: the spec's default {option['default']!r} is not in defaults/main.yml")
        if "default" in option and option.get("required"):
            bad.append(f"{name}: required and a default at once")
        if "default" in option:
            problem = type_problem(f"{name} (spec default)", option, option["default"])
            if problem:
                bad.append(problem)
    assert not bad, f"roles/{role}: " + "\n".join(bad)


@pytest.mark.parametrize("role", ROLES)
def test_ansible_accepts_the_defaults_unchanged(role):
    """Role argument validation over the defaults alone passes, and converts nothing."""
    defaults, specs = load(role)
    options = specs["main"].get("options") or {}
    # A required option the playbooks always pass (the release: the plan's) may have no
    # defaults entry at all, so that no copy of it can drift; the rest must validate.
    options = {k: {**o, "required": False} if o.get("required") and k not in defaults else o
               for k, o in options.items()}
    result = ArgumentSpecValidator(options).validate(dict(defaults))
    assert not result.error_messages, f"roles/{role}: {result.error_messages}"
    changed = {k: (v, result.validated_parameters[k]) for k, v in defaults.items()
               if k in options and options[k].get("type") != "path" and result.validated_parameters[k] != v}
    assert not changed, f"roles/{role}: Ansible converts these defaults (value, converted): {changed}"


def test_the_lint_catches_a_disagreement():
    """The checks above fail on the faults they are for (a test that cannot fail proves nothing)."""
    assert type_problem("x", {"type": "int"}, "1800")
    assert type_problem("x", {"type": "int"}, True)
    assert type_problem("x", {"type": "str"}, 1800)
    assert type_problem("x", {"type": "list", "elements": "int"}, ["a"])
    assert type_problem("x", {"type": "bool"}, True) is None
    result = ArgumentSpecValidator({"x": {"type": "int"}}).validate({"x": "1800"})
    assert result.validated_parameters["x"] != "1800"  # converted: what the second test refuses
