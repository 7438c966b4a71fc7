"""Ansible filters over pdnode.core.plan.roles and pdnode.core.host.roles for what a role computes from its own values (its
defaults, which an inventory may override) rather than reading from the plan's view. No
rule lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from pdnode.core.host.roles import mooncake, nvidia_driver
    from pdnode.core.plan.roles import host, preflight, sglang
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pdnode.core.host.roles import mooncake, nvidia_driver
    from pdnode.core.plan.roles import host, preflight, sglang


def _plain(value):
    """Ansible's tagged strings and containers as plain Python data."""
    return json.loads(json.dumps(value))


def pdnode_sglang_release(engine, **values) -> dict:
    """The sglang role's values -> what the release installs and records (its packages,
    markers, bundle names and managed paths: pdnode.core.plan.roles.sglang.release)."""
    return sglang.release(engine=str(engine), **{k: _plain(v) for k, v in values.items()})


def pdnode_sglang_drift(state, release, venv, router_venv) -> dict:
    """node_state's answer and the release -> how the venvs differ (pdnode.core.plan.roles.sglang.drift)."""
    return sglang.drift(_plain(state), _plain(release), str(venv), str(router_venv))


def pdnode_nvidia_driver_host(facts, **values) -> dict:
    """ansible_facts and the role's values -> the repository, the packages and the problem
    that stops the role (pdnode.core.host.roles.nvidia_driver.host)."""
    return nvidia_driver.host(
        distribution=str(facts["distribution"]), version=str(facts["distribution_version"]),
        major_version=str(facts["distribution_major_version"]), architecture=str(facts["architecture"]),
        **{k: _plain(v) for k, v in values.items()})


def pdnode_nvidia_driver_fabric(fabricmanager, **values) -> dict:
    """The fabric manager setting and what the host showed -> whether it is wanted and its
    pinned packages (pdnode.core.host.roles.nvidia_driver.fabric)."""
    return nvidia_driver.fabric(str(fabricmanager), **{k: _plain(v) for k, v in values.items()})


def pdnode_mooncake_choose(smi, build, stack_cuda, versions) -> dict:
    """nvidia-smi -q's result and the role's values -> the Mooncake build and the others
    (pdnode.core.host.roles.mooncake.choose)."""
    try:
        return mooncake.choose(_plain(smi), str(build), _plain(stack_cuda), _plain(versions))
    except mooncake.mooncake_select.SelectionError as exc:
        raise AnsibleFilterError(f"pdnode_mooncake_choose: {exc}") from exc


def pdnode_mooncake_loopback_report(stdout_lines) -> str:
    """The loopback check's output -> its one-line report (pdnode.core.host.roles.mooncake)."""
    return mooncake.loopback_report(_plain(stdout_lines))


def pdnode_os_release(facts) -> str:
    """ansible_facts -> the OS as the roles' supported lists name it (pdnode.core.plan.roles.host)."""
    return host.os_release({k: str(facts[k]) for k in ("distribution", "distribution_version",
                                                        "distribution_major_version")})


def pdnode_rdma_memlock_lines(users, limit) -> str:
    """The memlock users and limit -> the limits.d lines (pdnode.core.plan.roles.host)."""
    return host.memlock_lines([str(u) for u in users], str(limit))


def pdnode_preflight_model_probes(model_path) -> dict:
    """The expected model path -> the shell tests of it (pdnode.core.plan.roles.preflight)."""
    return preflight.model_probes(None if model_path is None else str(model_path))


def pdnode_preflight_raw(probes, cuda, model_path) -> dict:
    """The probes' results, the CUDA probe's and the model path -> hostfacts' input."""
    return preflight.raw(_plain(probes), _plain(cuda), None if model_path is None else str(model_path))


def pdnode_preflight_failure(verdict, fail_on_error, fail_on_warning, host, facts_file) -> dict:
    """The verdict and the role's switches -> the blocking problems and the message."""
    return preflight.failure(_plain(verdict), fail_on_error=bool(fail_on_error), fail_on_warning=bool(fail_on_warning),
                             host=str(host), facts_file=str(facts_file))


class FilterModule:
    def filters(self):
        return {"pdnode_sglang_release": pdnode_sglang_release, "pdnode_sglang_drift": pdnode_sglang_drift,
                "pdnode_nvidia_driver_host": pdnode_nvidia_driver_host,
                "pdnode_nvidia_driver_fabric": pdnode_nvidia_driver_fabric,
                "pdnode_mooncake_choose": pdnode_mooncake_choose,
                "pdnode_mooncake_loopback_report": pdnode_mooncake_loopback_report,
                "pdnode_os_release": pdnode_os_release, "pdnode_rdma_memlock_lines": pdnode_rdma_memlock_lines,
                "pdnode_preflight_model_probes": pdnode_preflight_model_probes,
                "pdnode_preflight_raw": pdnode_preflight_raw, "pdnode_preflight_failure": pdnode_preflight_failure}
