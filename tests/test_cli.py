"""The CLI loads an optional command's module only when that command runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdnode.commands.cli import OPTIONAL, OPTIONAL_HELP, build_parser


def _subparsers(parser):
    return next(a for a in parser._actions if a.dest == "command")


@pytest.mark.parametrize("name", sorted(OPTIONAL))
def test_stub_help_is_the_modules_own(name):
    """The one-line stub listed in `pdnode --help` says what the module's parser says."""
    real = {a.dest: a.help for a in _subparsers(build_parser(name))._choices_actions}
    assert OPTIONAL_HELP[name] == real[name]


@pytest.mark.parametrize("name", sorted(OPTIONAL))
def test_every_command_is_listed_and_runs_its_module(name):
    stubbed = _subparsers(build_parser("check")).choices[name]
    loaded = _subparsers(build_parser(name)).choices[name]
    assert stubbed.add_help is False and loaded is not stubbed and loaded.add_help is True
    out = subprocess.run([sys.executable, "-m", "pdnode.commands.cli", name, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: pdnode " + name in out.stdout, out.stderr


def test_check_loads_no_optional_module():
    code = ("import sys; from pdnode.commands.cli import main, OPTIONAL\n"
            "try:\n    main(['check', 'inventories/gpu01'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in OPTIONAL.values() if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
