"""The scenarios' create and destroy playbooks (molecule/create.yml, molecule/destroy.yml)
are ours, named once in the base config. create.yml passes on only the platform keys it
knows and refuses the others when it runs; this checks, without Docker, that every
scenario's platforms (the base config's where a scenario has none) use only those keys,
so that a key added to a scenario fails here first."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / ".config" / "molecule" / "config.yml"


def _known_keys() -> set[str]:
    play = yaml.safe_load((ROOT / "molecule" / "create.yml").read_text())[0]
    return set(play["vars"]["_known_keys"])


def _scenarios() -> dict[str, dict]:
    return {p.parent.name: yaml.safe_load(p.read_text()) or {} for p in sorted(ROOT.glob("molecule/*/molecule.yml"))}


def test_the_base_config_names_our_create_and_destroy_for_every_scenario():
    playbooks = yaml.safe_load(BASE.read_text())["provisioner"]["playbooks"]
    assert playbooks == {"create": "../create.yml", "destroy": "../destroy.yml"}
    for name, config in _scenarios().items():
        own = (config.get("provisioner") or {}).get("playbooks") or {}
        # a scenario's own create or destroy would replace ours (dicts merge key by key)
        assert not {"create", "destroy"} & set(own), (name, own)
        for step in ("create", "destroy"):
            assert (ROOT / "molecule" / name / playbooks[step]).resolve().is_file(), (name, step)


def test_every_scenarios_platforms_use_only_the_keys_create_passes_on():
    known = _known_keys()
    base_platforms = yaml.safe_load(BASE.read_text())["platforms"]
    scenarios = _scenarios()
    assert len(scenarios) >= 9, sorted(scenarios)
    for name, config in scenarios.items():
        for platform in config.get("platforms") or base_platforms:
            assert set(platform) <= known, (name, platform["name"], sorted(set(platform) - known))


def test_no_scenario_runs_the_syntax_step_that_the_lint_stage_already_runs():
    for name, config in _scenarios().items():
        sequence = (config.get("scenario") or {}).get("test_sequence")
        if sequence is not None:  # the substrate scenario keeps molecule's default sequence
            assert "syntax" not in sequence, name
            assert sequence[0] == "destroy" and sequence[-1] == "destroy", (name, sequence)
