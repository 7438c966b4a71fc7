"""The managed-path list's own decisions (pdnode.core.plan.managed), fast: which drop-ins a
service gets, what a re-run restores for a directory and for the install root, and which
units are the plan's own. tests/test_managed_paths.py holds the whole list to what the
roles write (an Ansible run); these are the branches a mutant of the module could flip
without that test's minute."""

from __future__ import annotations

import pytest

from pdnode.core.plan.managed import ASPECTS, dropins, own_units, paths

INSTALL = {"user": "sglang", "config_dir": "/etc/pd", "root": "/opt/pd", "venv": "/opt/pd/venvs/r1",
           "router_venv": "/opt/pd/venvs/router", "applied_dir": "/var/lib/pd", "target": "pd.target",
           "api_key_path": "/etc/pd/api-key", "admin_key_path": "/etc/pd/admin-key"}


def _svc(sid: str, role: str, **extra) -> dict:
    return {"id": sid, "role": role, "unit": f"pd-{sid}.service", "config": f"/etc/pd/{sid}.json",
            "env_file": f"/etc/pd/{sid}.env", **extra}


@pytest.mark.parametrize(("service", "names"), [
    (_svc("router", "router"), ["10-workers.conf"]),
    (_svc("decode-0", "decode"), []),
    (_svc("prefill-0", "prefill", upholds=["pd-decode-0.service"]), ["10-coupling.conf"]),
    (_svc("decode-0", "decode", bound_to="pd-prefill-0.service"), ["10-coupling.conf"]),
    (_svc("prefill-0", "prefill", restart_delay_s=12), ["10-coupling.conf"]),
    (_svc("prefill-0", "prefill", upholds=[], bound_to=None, restart_delay_s=None), []),
])
def test_drop_ins_follow_the_role_and_each_coupling_alone(service, names):
    assert dropins(service) == names


def test_what_a_rerun_restores_per_kind_of_path():
    services = {"decode-0": _svc("decode-0", "decode"),
                "router": _svc("router", "router", reconcile_spec_file="/etc/pd/workers.json")}
    entries = {e["path"]: e for e in paths(INSTALL, services, api_key=True)}
    assert entries["/opt/pd"]["restores"] == ["mode", "owner", "group"]  # never removed, no content
    assert entries["/etc/pd"]["restores"] == ["mode", "owner", "group", "presence"]
    assert entries["/etc/pd/admin-key"]["restores"] == ["mode", "owner", "group", "presence"]
    assert entries["/etc/pd/api-key"]["restores"] == list(ASPECTS)
    assert entries["/etc/systemd/system/pd-router.service.d/10-workers.conf"]["restores"] == list(ASPECTS)
    assert "/etc/systemd/system/pd-decode-0.service.d" not in entries


def test_own_units_are_the_services_and_the_probe_sorted():
    plan = {"services": {"router": {"unit": "pd-router.service", "pair_probe": {"service": "pd-probe.service"}},
                         "decode-0": {"unit": "pd-decode-0.service"}}}
    assert own_units(plan) == ["pd-decode-0.service", "pd-probe.service", "pd-router.service"]
    assert own_units({"services": None}) == []
