"""Field failure 17 (sglang#27666): a decode that exits anyway is restarted by systemd,
because its unit says `Restart=always`. A unit line, so no Python mutant can break it:
this test breaks it itself (issue 46, item 1).

The units are rendered as the deploy renders them (the pd_services role's files,
`_pd_services_files`, through Ansible's template engine) and read back by systemd's own
manager: `systemd --test --system` loads them, with their drop-ins, as PID 1 would and
dumps what it loaded for each unit, `Restart:` included. Every engine of the plan restarts
on any exit, and the same check fails on a copy of the decode's unit with `Restart=no` and
on one without the line (systemd's default is no). Test mode refuses to run as root: as
root it runs as nobody.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from role_render import render_pd_services_files
from planvars import variables

from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]
UNIT_DIR = "/etc/systemd/system/"
RESTART_LINE = "\nRestart=always\n"


def _systemd() -> str:
    found = next((p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if Path(p).is_file()), None)
    # not a skip: scripts/setup installs it (systemd in scripts/lib/system-packages)
    assert found, "systemd is not installed: run scripts/setup (systemd, scripts/lib/system-packages)"
    return found


def systemd_loads(units: dict[str, str], unit: str) -> dict[str, str]:
    """What systemd's manager loads for UNIT from UNITS (file name under /etc/systemd/system
    -> text, drop-ins as "x.service.d/10-y.conf"): its dump's "Key: value" lines. A complaint
    of systemd's about one of these files fails here."""
    # test mode refuses root; nobody must read the files, so not under pytest's private tmp
    with tempfile.TemporaryDirectory(prefix="pdnode-unit-restart-") as tmp:
        where = Path(tmp)
        where.chmod(0o755)
        for name, text in units.items():
            path = where / name
            path.parent.mkdir(exist_ok=True)
            path.parent.chmod(0o755)
            path.write_text(text)
            path.chmod(0o644)
        argv = [_systemd(), "--test", "--system", f"--unit={unit}", "--no-pager"]
        if os.geteuid() == 0:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        # these units first, then the system's own (sysinit.target, the slices they need): the trailing ':'
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SYSTEMD_UNIT_PATH": f"{where}:"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=where, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        complaints = [line for line in done.stderr.splitlines() if tmp in line]
        assert not complaints, complaints
    blocks = re.split(r"^\t-> Unit ", done.stdout, flags=re.MULTILINE)
    [block] = [b for b in blocks if b.startswith(f"{unit}:\n")]
    loaded = dict(re.findall(r"^\t\t([\w ]+): (.*)$", block, flags=re.MULTILINE))
    assert loaded["Unit Load State"] == "loaded" and loaded["Fragment Path"] == f"{tmp}/{unit}", loaded
    return loaded


def restarts_on_every_exit(loaded: dict[str, str]) -> bool:
    """The check: systemd starts the service again however its process ended."""
    return loaded.get("Restart") == "always"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """gpu01's plan (real engines: a prefill and a decode) and its units as the deploy writes them."""
    plan = build_plan(variables("gpu01"), "gpu01").as_dict()
    files = render_pd_services_files(plan, tmp_path_factory.mktemp("engine-unit-restart"))
    units = {f["path"].removeprefix(UNIT_DIR): f["content"] for f in files if f["path"].startswith(UNIT_DIR)}
    return plan, units


def test_systemd_restarts_every_engine_that_exits_and_not_one_without_restart_always(rendered):
    plan, units = rendered
    engines = {s["role"]: s["unit"] for s in plan["services"].values() if s["role"] in ("prefill", "decode")}
    assert sorted(engines) == ["decode", "prefill"], engines
    for unit in engines.values():
        assert restarts_on_every_exit(systemd_loads(units, unit)), unit
    # the variant: the decode's unit broken two ways, each read by systemd and failing the check
    decode = engines["decode"]
    assert units[decode].count(RESTART_LINE) == 1, "the rendered unit has not one Restart=always line"
    for broken in (units[decode].replace(RESTART_LINE, "\nRestart=no\n"), units[decode].replace(RESTART_LINE, "\n")):
        loaded = systemd_loads({**units, decode: broken}, decode)
        assert not restarts_on_every_exit(loaded) and loaded["Restart"] == "no", loaded["Restart"]
