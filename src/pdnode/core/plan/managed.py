"""The paths the deploy's roles manage on a host: the one list (the plan's ``managed``).

Every file and directory that the sglang and pd_services roles write at a path the plan
knows, with the mode, owner and group they give it, and what a re-run of the deploy
restores when it drifted: its content, mode, owner, group, presence. The roles read it
(pd_services writes its files, directories and keys with these modes and owners; its
node_state read checks the directories and the host-made admin key from it), the node
scenario's drift matrix generates its cases from it
(molecule/node/tests/test_drift_matrix.py), and tests/test_managed_paths.py holds it to
what the roles' tasks and templates write: a file a role writes that is not listed here
would be a drift nobody looks for ("a fast path sees only what it reads").

Not listed: what pip and the bundle install put inside the venvs (packages, the pdnode
bundle and its pdnode.pth: the sglang role judges them as a whole by the venv's marker and
its bundle checks), the bundle's tarball (named by the bundle's checksum, known only at
deploy) and the wheelhouse (the wheelhouse role's, judged by its own marker).
"""

from __future__ import annotations

from typing import Any

from ..change.identity import RECORD_FILE

ASPECTS = ("content", "mode", "owner", "group", "presence")
# What a re-run cannot restore, per kind of path, and why:
# - a directory has no content;
# - the admin key's content is made on the host (any key it holds is the key; a new one,
#   made when it is missing, restarts the router);
# - the install root holds the release venvs: removing it is a reinstall of every venv (the
#   sglang role does it, slowly, with every service down meanwhile), not a drift.
_NO_CONTENT = tuple(a for a in ASPECTS if a != "content")
UNITS_DIR = "/etc/systemd/system"


def _entry(path: str, kind: str, mode: str, owner: str, group: str, role: str,
           restores: tuple[str, ...] = ASPECTS) -> dict[str, Any]:
    return {"path": path, "kind": kind, "mode": mode, "owner": owner, "group": group, "role": role,
            "restores": list(restores)}


def dropins(service: dict[str, Any]) -> list[str]:
    """The drop-ins pd_services writes for SERVICE (file names in <unit>.d/): the router's
    ordering after its workers, an engine's restart coupling (docs/decisions.md)."""
    names = ["10-workers.conf"] if service["role"] == "router" else []
    if service.get("upholds") or service.get("bound_to") or service.get("restart_delay_s"):
        names.append("10-coupling.conf")
    return names


def paths(install: dict[str, Any], services: dict[str, dict[str, Any]], api_key: bool) -> list[dict[str, Any]]:
    """The managed paths of one host's deploy, in the order the roles write them."""
    user, cfg = install["user"], install["config_dir"]
    out = [
        # sglang: the install root, and what each venv holds (its marker: a changed marker
        # reinstalls the venv's packages, which pip finds installed, and is written again)
        _entry(install["root"], "directory", "0755", "root", "root", "sglang",
               tuple(a for a in _NO_CONTENT if a != "presence")),
        _entry(f"{install['venv']}/.pdnode-release", "marker", "0644", "root", "root", "sglang"),
        _entry(f"{install['router_venv']}/.pdnode-release", "marker", "0644", "root", "root", "sglang"),
        # pd_services
        _entry(cfg, "directory", "0750", "root", user, "pd_services", _NO_CONTENT),
        _entry(install["applied_dir"], "directory", "0700", "root", "root", "pd_services", _NO_CONTENT),
    ]
    for svc in services.values():
        out += [_entry(svc["config"], "config", "0640", "root", user, "pd_services"),
                _entry(svc["env_file"], "env", "0640", "root", user, "pd_services"),
                _entry(f"{UNITS_DIR}/{svc['unit']}", "unit", "0644", "root", "root", "pd_services")]
        names = dropins(svc)
        if names:
            out.append(_entry(f"{UNITS_DIR}/{svc['unit']}.d", "directory", "0755", "root", "root", "pd_services",
                              _NO_CONTENT))
            out += [_entry(f"{UNITS_DIR}/{svc['unit']}.d/{name}", "drop-in", "0644", "root", "root", "pd_services")
                    for name in names]
        # the digest of what the service was last (re)started with: a record that differs
        # from its files restarts the service, which records them again
        out.append(_entry(f"{install['applied_dir']}/{svc['id']}.sha256", "record", "0600", "root", "root",
                          "pd_services"))
    # the layout the node runs, for the next plan (pdnode.core.change.identity); its content
    # is what the plan reads before anything is written: a hand-changed one is refused in
    # one line (remove it), not silently written over
    out.append(_entry(f"{install['applied_dir']}/{RECORD_FILE}", "state", "0600", "root", "root", "pd_services",
                      _NO_CONTENT))
    out.append(_entry(f"{UNITS_DIR}/{install['target']}", "unit", "0644", "root", "root", "pd_services"))
    if api_key:
        out.append(_entry(install["api_key_path"], "secret", "0400", user, user, "pd_services"))
    if "router" in services:
        # what the router unit's reconcile at start reads (key file names, never keys)
        out.append(_entry(services["router"]["reconcile_spec_file"], "config", "0640", "root", user, "pd_services"))
        out.append(_entry(install["admin_key_path"], "secret", "0400", user, user, "pd_services", _NO_CONTENT))
        probe = services["router"].get("pair_probe")
        if probe:
            # the per-pair probe: what it reads, its oneshot unit and the timer that starts it
            out += [_entry(probe["spec_file"], "config", "0640", "root", user, "pd_services"),
                    _entry(f"{UNITS_DIR}/{probe['service']}", "unit", "0644", "root", "root", "pd_services"),
                    _entry(f"{UNITS_DIR}/{probe['timer']}", "unit", "0644", "root", "root", "pd_services")]
    return out


def own_units(plan: dict[str, Any]) -> list[str]:
    """The systemd units the plan runs on this host: the services' and, where the router's
    host runs it, the per-pair probe's (its process runs as the service user too, so a
    socket of that user is ours while it runs). Sorted."""
    services = plan.get("services") or {}
    units = [svc["unit"] for svc in services.values()]
    probe = (services.get("router") or {}).get("pair_probe")
    return sorted(units + ([probe["service"]] if probe else []))
