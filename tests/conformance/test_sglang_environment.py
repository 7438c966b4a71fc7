"""pdnode's table of how SGLang parses its environment variables (pdnode.core.rules.environment_types)
against SGLang's own parsers: the pinned SGLang's EnvField of every SGLang variable the table
reads from environ.py is asked about every generated value, and pdnode's verdict on the kind
(its bounds aside: those are pdnode's own rule) must be the same. pdnode never passes a value
SGLang refuses; it refuses only the spellings listed below, which SGLang's int()/float()
take and a person does not write."""

from __future__ import annotations

import itertools
import json

import pytest

from pdnode.core.rules import environment_types as et

pytestmark = pytest.mark.conformance

# What the pinned SGLang says of each value, per variable: its field's class and whether its
# parse() takes the value (EnvField.get warns and uses the default when it does not).
ASK = """
import json, sys
import sglang.srt.environ as e
names, values = json.loads(sys.stdin.read())
out = {}
for name in names:
    field = getattr(e.envs, name)
    verdicts = []
    for value in values:
        try:
            field.parse(value)
            verdicts.append(True)
        except (ValueError, TypeError):
            verdicts.append(False)
    out[name] = {"class": type(field).__name__, "parses": verdicts}
print(json.dumps(out))
"""

# Values as an environment file hands them over (the plan refuses spaces at the ends, so none here).
CASINGS = ["true", "false", "yes", "no", "y", "n", "on", "off", "t", "f"]
VALUES = sorted(set(
    [c for word in CASINGS for c in (word, word.upper(), word.capitalize())]
    + ["0", "1", "2", "-1", "+5", "007", "10", "600", "65535", "-0", "1.5", ".5", "5.", "1e3", "1E-3", "-2.5e+2",
       "three", "", "1,5", "0x10", "1 000", "true1", "yes!"]
    + ["1_000", "1_0.5", "inf", "-inf", "nan", "Infinity"]))
# Spellings Python's int()/float() take and pdnode refuses on purpose (they are not how a
# number is written in an environment file); any other disagreement fails.
STRICTER = {"1_000", "1_0.5", "inf", "-inf", "nan", "Infinity"}
KIND_OF_CLASS = {"EnvInt": "int", "EnvFloat": "float", "EnvBool": "bool", "EnvStr": "str",
                 "EnvIntWithAlias": "int", "EnvBoolWithAlias": "bool", "EnvStrWithAlias": "str"}


def sglang_variables() -> list[str]:
    """The table's SGLang variables that environ.py's EnvField classes read."""
    return sorted(n for n, t in et.TYPES.items() if t.library == "SGLang" and "environ.py" in t.source)


@pytest.fixture(scope="module")
def sglang_says(sglang_run) -> dict:
    r = sglang_run(["-c", ASK.replace("sys.stdin.read()", repr(json.dumps([sglang_variables(), VALUES])))])
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_table_names_sglangs_own_kind(sglang_says):
    assert len(sglang_variables()) >= 10
    wrong = {n: (et.TYPES[n].kind, a["class"]) for n, a in sglang_says.items()
             if KIND_OF_CLASS.get(a["class"]) != et.TYPES[n].kind}
    assert wrong == {}, wrong


def test_pdnode_parses_each_value_as_sglang_does(sglang_says, monkeypatch):
    disagree = []
    for name, answer in sglang_says.items():
        # the kind alone: the table's bounds are pdnode's own rule, not SGLang's parser
        monkeypatch.setitem(et.TYPES, name, et.TYPES[name]._replace(low=None, high=None, gap=None))
        for value, sglang_ok in zip(VALUES, answer["parses"]):
            ours = et.parses(name, value)
            if ours != sglang_ok and not (sglang_ok and not ours and value in STRICTER):
                disagree.append((name, value, "SGLang takes it" if sglang_ok else "SGLang refuses it", ours))
    assert disagree == [], disagree[:20]
    # the comparison has teeth: SGLang refuses some of these values for every kind
    kinds = {et.TYPES[n].kind for n, a in sglang_says.items() if not all(a["parses"])}
    assert {"int", "bool"} <= kinds
    assert list(itertools.compress(VALUES, sglang_says[sglang_variables()[0]]["parses"])) != VALUES
