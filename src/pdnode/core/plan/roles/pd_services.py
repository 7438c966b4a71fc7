"""The pd_services role's view of the plan: every file it writes, the units it runs, the
specs its modules and the drain take, computed once from the plan's records.

The role's tasks read these values as they are (roles/pd_services/vars/main.yml aliases
them); its templates write a unit's or environment file's text; its modules answer the
run-time questions (what differs, which units the plan no longer has, what to restart)
from the rules here (``orphans``, ``restart``). Nothing here touches a host.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from pdnode.core.plan.managed import UNITS_DIR, own_units
from pdnode.node.unitcheck import exec_line

OWNED_KEYS = ("path", "mode", "owner", "group")
# The engine units this role writes, in every naming the releases used: <prefix>-prefill.service
# (one instance), <prefix>-decode-<name>.service, ...
ENGINE_UNIT = r"(prefill|decode)(-[a-z0-9]+)?[.]service"
PROBE_UNIT = r"pair-probe[.](service|timer)"


def nice_json(value: Any) -> str:
    """JSON as the role has always written it (Ansible's to_nice_json(sort_keys=true)): four
    spaces, sorted keys, ASCII only. tests/test_role_view_pd_services.py compares the two."""
    return json.dumps(value, indent=4, sort_keys=True, separators=(",", ": "))


def _owned(entry: dict[str, Any]) -> dict[str, str]:
    return {key: entry[key] for key in OWNED_KEYS}


def _unit_path(unit: str) -> str:
    return f"{UNITS_DIR}/{unit}"


def _file(managed: dict[str, dict[str, Any]], path: str, kind: str, *, readers: list[str] | None = None,
          content: str | None = None, template: str | None = None, service: str | None = None,
          unit: bool = False, validate: list[str] | None = None, digest: str | None = None,
          header: bool = False, converged: str | None = None) -> dict[str, Any]:
    """One file as pd_services_files takes it (content, or the role's template that renders
    it), with the mode and owners of the plan's managed paths: a path it does not list is a
    defect of this module, not of the inventory."""
    if path not in managed:
        raise KeyError(f"{path} is not among the plan's managed paths (pdnode.core.plan.managed)")
    return {**_owned(managed[path]), "kind": kind, "roles": readers, "unit": unit, "validate": validate,
            "digest": digest, "content": content, "template": template, "service": service, "header": header,
            "converged": converged}


def environment_text(environment: dict[str, str]) -> str:
    """An engine's environment file: KEY=value lines, sorted by name as Jinja's dictsort
    sorts (case-insensitive). The values were held to environment-file rules by the plan."""
    return "".join(f"{key}={value}\n" for key, value in sorted(environment.items(), key=lambda kv: kv[0].lower()))


def workers_text(engine_units: list[str]) -> str:
    """The router's drop-in 10-workers.conf: its ordering after the engine units on its host.
    A drop-in of its own so that a layout change (new workers) needs a reload, not a restart."""
    if not engine_units:
        return "# Its workers run on the layout's other hosts: its readiness gate waits for them.\n"
    units = " ".join(engine_units)
    return ("[Unit]\n# The router registers workers once they answer; start it after them.\n"
            f"Wants={units}\nAfter={units}\n")


def coupling_text(svc: dict[str, Any]) -> str:
    """An engine's drop-in 10-coupling.conf: which engine units go down and up together
    (docs/decisions.md, "Restart coupling"). A drop-in of its own so that re-coupling needs
    a reload, not a restart."""
    lines = ["[Unit]"]
    if svc["upholds"]:
        lines += ["# Whenever this (the node's one) prefill is up, its decodes are kept up too (they are",
                  "# stopped with it: their BindsTo=).",
                  f"Upholds={' '.join(svc['upholds'])}"]
    if svc["restart_delay_s"]:
        lines += ["[Service]",
                  "# One of several prefills: after a crash it stays down until every decode's heartbeats",
                  "# have dropped it, so that it comes back to decodes that handshake anew (a decode still",
                  "# holding its old ranks fails every hand-off with it). The deploy's planned restarts",
                  "# wait as long (tasks/restart_engine.yml).",
                  f"RestartSec={svc['restart_delay_s']}"]
    if svc["bound_to"]:
        lines += ["# With one prefill, decode goes down with it (a restart, a stop or a crash) and comes",
                  "# back after it: a decode holding a dead prefill's bootstrap and transfer state strands",
                  "# requests, and the node cannot serve without its prefill anyway. With several",
                  "# prefills no decode is bound to one.",
                  f"BindsTo={svc['bound_to']}", f"PartOf={svc['bound_to']}", f"After={svc['bound_to']}"]
    return "\n".join(lines) + "\n"


def target_text(units: list[str], served_name: str) -> str:
    """The node's target: every service of this host, wanted and ordered."""
    joined = " ".join(units)
    return ("[Unit]\n"
            f"Description=SGLang prefill/decode node ({served_name})\n"
            "# Wants=, not Requires=: a restart of one service must not restart the target and, via\n"
            "# the services' PartOf=, every other service. Starting the target therefore succeeds\n"
            "# even when a service fails; the deploy starts the units themselves and checks each\n"
            "# (docs/decisions.md).\n"
            f"Wants={joined}\nAfter={joined}\n\n[Install]\nWantedBy=multi-user.target")


def timer_text(probe: dict[str, Any], target: str) -> str:
    """The pair probe's timer: its first run a minute after the node came up, then
    interval_s after each run ended, so that runs never overlap."""
    every = probe["interval_s"]
    return ("[Unit]\n"
            f"Description=SGLang PD per-pair probe every {every} s\nPartOf={target}\n\n[Timer]\n"
            f"# The first run once the node has had a minute to come up, then {every} s after\n"
            "# each run ended: runs never overlap, however long a hanging pair makes one.\n"
            f"OnActiveSec=60\nOnUnitInactiveSec={every}\nAccuracySec=1\nUnit={probe['service']}\n\n"
            f"[Install]\nWantedBy={target}")


def _unit_check(python: str, unit: str) -> list[str]:
    return [python, "-m", "pdnode.node.unitcheck", "%s", unit]


def files(plan: dict[str, Any], managed: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every file of the services, in the order they are written: per service its JSON
    arguments, environment file, unit and drop-ins; the router's reconcile spec and the
    pair probe's files; the target. ``roles`` names the services that read a file (a
    change restarts them; None: systemd reads it, a reload is enough)."""
    install, services = plan["install"], plan["services"]
    python = install["python"]
    out = []
    for sid, svc in services.items():
        args = nice_json(svc["args"]) + "\n"
        live = svc.get("live_args") or []
        # What the restart decision counts: the arguments without those the running service
        # takes through its admin API (the router's workers: pdnode.node.drain reconciles them).
        digest = nice_json({k: v for k, v in svc["args"].items() if k not in live}) if live else None
        # The installed SGLang judges the file before it replaces the old one, so version
        # drift is caught before any restart (the stand-in has no SGLang to ask).
        judge = [python, "-m", "pdnode.node.launcher", "--check", "%s"] \
            if svc["role"] != "router" and install["engine"] == "sglang" else None
        out += [_file(managed, svc["config"], "config", readers=[sid], content=args, validate=judge, digest=digest),
                _file(managed, svc["env_file"], "env", readers=[sid], content=environment_text(svc["environment"]),
                      header=True),
                _file(managed, _unit_path(svc["unit"]), "unit", readers=[sid], template="service.j2", service=sid,
                      header=True, unit=True, validate=_unit_check(python, svc["unit"]))]
        dropin = _unit_path(svc["unit"]) + ".d/"
        # Read by systemd, not by the service: a change reloads, it restarts nothing.
        if dropin + "10-workers.conf" in managed:
            out.append(_file(managed, dropin + "10-workers.conf", "drop-in", unit=True, header=True,
                             content=workers_text([services[e]["unit"] for e in services if e != "router"])))
        if dropin + "10-coupling.conf" in managed:
            out.append(_file(managed, dropin + "10-coupling.conf", "drop-in", unit=True, header=True,
                             content=coupling_text(svc)))
    router = services.get("router")
    if router:
        # Read by the router unit's reconcile when the router starts, not by the router: no restart.
        out.append(_file(managed, router["reconcile_spec_file"], "config", readers=[],
                         content=nice_json(router["reconcile_spec"]) + "\n"))
        probe = router.get("pair_probe")
        if probe:
            # The per-pair probe reads its spec at each run: a change restarts nothing.
            out += [_file(managed, probe["spec_file"], "config", readers=[], content=nice_json(probe["spec"]) + "\n"),
                    _file(managed, _unit_path(probe["service"]), "unit", template="pair_probe.service.j2",
                          service="router", header=True, unit=True, validate=_unit_check(python, probe["service"])),
                    _file(managed, _unit_path(probe["timer"]), "unit", content=timer_text(probe, install["target"]),
                          header=True, unit=True, validate=_unit_check(python, probe["timer"]))]
    change = plan.get("change")
    if change:
        # What the node runs, for the next plan (pdnode.core.change.identity): read by no service.
        # While the change's steps run, it names the layout they start from; the handlers
        # write the converged record after them (pd_services_files: ``converged``).
        out.append(_file(managed, change["record_file"], "state", readers=[],
                         content=nice_json(change["record"]) + "\n",
                         converged=nice_json(change["converged"]) + "\n"))
    served = plan["settings"]["pdnode_model_served_name"]
    out.append(_file(managed, _unit_path(install["target"]), "unit", header=True, unit=True,
                     content=target_text([svc["unit"] for svc in services.values()], served),
                     validate=_unit_check(python, install["target"])))
    return out


def change_lines(change: dict[str, Any]) -> list[str]:
    """The layout change as the deploy prints it: the names the node's record gave, each
    step with the instances serving after it, each window (pdnode.core.change.identity)."""
    lines = [f"named by what the node runs: {note}" for note in change.get("notes", [])]
    for i, step in enumerate(change.get("steps", []), 1):
        zero = f" (no {' and no '.join(step['at_zero'])} serving during it)" if step["at_zero"] else ""
        lines.append(f"layout change step {i}: {step['label']}; serving after it: prefill "
                     f"{step['serving']['prefill']}, decode {step['serving']['decode']}{zero}")
    for w in change.get("windows", []):
        secs = f"~{w['expected_s']:.0f} s" if w["expected_s"] is not None else "unknown"
        lines.append(f"expected window without a {w['role']}: {secs} ({w['source']}; accepted with "
                     "pdnode_allow_unavailable)")
    return lines


def _handler_steps(step: dict[str, Any], bound: list[str], engine_ids: list[str],
                   services: dict[str, Any]) -> list[dict[str, str]]:
    """A change step as the pd_services handlers may take it (pd_services_files' restart
    steps): a stop; a start or restart of the unit; for a decode bound to the node's one
    prefill, also that prefill's restart, which restarts it when both restart."""
    if step["kind"] == "stop":
        return [{"kind": "stop", "id": step["id"]}]
    out = [{"kind": "restart", "id": step["id"]}]
    if step["id"] in bound:
        out += [{"kind": "restart", "id": sid} for sid in engine_ids if services[sid]["upholds"]]
    return out


def _drain_spec(plan: dict[str, Any], api_key: bool, workers: list[str] | None) -> dict[str, Any]:
    """pdnode.node.drain's spec (stdin: it names key files, never keys) for WORKERS (engine
    ids; None: every engine of the layout)."""
    engines = plan["cluster"]["engines"]
    return {"router": plan["cluster"]["router"]["url"], "admin_key_file": plan["install"]["admin_key_path"],
            "api_key_file": plan["install"]["api_key_path"] if api_key else None,
            "timeout_s": plan["settings"]["pdnode_drain_timeout_s"],
            "workers": [engines[w] for w in workers] if workers is not None else list(engines.values())}


def view(plan: dict[str, Any]) -> dict[str, Any]:
    install, services, settings = plan["install"], plan["services"], plan["settings"]
    managed = {m["path"]: m for m in plan["managed"] if m["role"] == "pd_services"}
    api_key = bool(settings.get("pdnode_api_key_file"))
    ids = list(services)
    engine_ids = [sid for sid in ids if services[sid]["role"] != "router"]
    router = services.get("router")
    probe = router.get("pair_probe") if router else None
    units = [svc["unit"] for svc in services.values()]
    timers = [probe["timer"]] if probe else []
    bound = [sid for sid in engine_ids if services[sid]["bound_to"]]
    # A layout change's stops of instances on this host (pdnode.core.change.identity)
    change = plan.get("change") or {"steps": [], "stops": {}}
    stops = {sid: stop for sid, stop in change["stops"].items() if plan["host"] in stop["hosts"]}
    prefix = install["prefix"]
    admin_key = _owned(managed[install["admin_key_path"]]) if router else None
    # What the services read that other tasks install: the keys, and the markers of the venv
    # each runs from (the sglang role's package marker and the pdnode bundle pointer: the
    # release's for the engines, the router's own for the router), so that a new key or
    # bundle whose restart was lost to an interrupted run still restarts the services.
    inputs = [{"path": install["api_key_path"], "roles": ids}] if api_key else []
    inputs += [{"path": install["admin_key_path"], "roles": ["router"]}] if router else []
    for venv, readers in ((install["venv"], engine_ids), (install["router_venv"], ["router"] if router else [])):
        if readers:
            inputs += [{"path": f"{venv}/.pdnode-release", "roles": readers},
                       {"path": f"{venv}/lib/python3*/site-packages/pdnode.pth", "roles": readers}]
    # The API key, written by the same module call as the files, after every validator
    # passed (the host's own reader checks it holds one key). Every service reads it: a new
    # key restarts them all. Its content stays a lookup of the role (a no_log option).
    secret_files = [{**_owned(managed[install["api_key_path"]]), "roles": ids,
                     "validate": [install["python"], "-m", "pdnode.node.secrets", "%s"]}] if api_key else []
    # The running instances a layout change stops at its step are ours until then.
    ports_argv = [install["python"], "-m", "pdnode.node.preflight", "ports",
                  *(f"--own-unit={unit}" for unit in own_units(plan) + [stop["unit"] for stop in stops.values()]),
                  *(f"{name}={port}" for name, port in plan["ports"].items())]
    return {
        "user": install["user"], "home": install["home"], "applied_dir": install["applied_dir"],
        "python": install["python"], "target": install["target"], "state_directory": install["state_directory"],
        "served_name": settings["pdnode_model_served_name"],
        # the services' units in start order: prefills, decodes, the router
        "units": units, "router": router is not None, "router_unit": router["unit"] if router else None,
        # The per-pair probe, where the plan runs it: its timer is enabled and started with the
        # services; its oneshot service only ever runs from the timer.
        "probe": _probe(probe) if probe else None,
        # enabled and kept running, in start order: the services, the probe's timer, the target
        "enable": units + timers + [install["target"]],
        # What pd_services_start starts, the workers first: then the router (where the layout
        # runs it), the probe's timer and the target; one of several prefills that does not
        # run waits until every decode has dropped it (restart_delay_s) before its start.
        "start": {"workers": [services[sid]["unit"] for sid in engine_ids],
                  "others": [router["unit"]] if router else [],
                  "after": units[len(engine_ids):] + timers + [install["target"]],
                  "hold": [{"unit": services[sid]["unit"], "argv": _hold(install["python"], services[sid])}
                           for sid in engine_ids if services[sid]["restart_delay_s"]]},
        "read_units": [{"name": unit} for unit in units + timers + [install["target"]]],
        "directories": [_owned(m) for m in managed.values() if m["kind"] == "directory"],
        "admin_key_files": [admin_key] if admin_key else [],
        # roles/pd_services/files/admin_key.py's arguments (its source comes on stdin)
        "admin_key_argv": [f"{install['venv']}/bin/python", "-", admin_key["path"], admin_key["owner"],
                           admin_key["group"], admin_key["mode"]] if admin_key else None,
        # the service account, as node_state reads it
        "account": {"groups": [install["user"]],
                    "users": [{"name": install["user"], "group": install["user"], "home": install["home"],
                               "shell": "/usr/sbin/nologin"}]},
        "secret_files": secret_files, "inputs": inputs, "files": files(plan, managed),
        "services": {sid: _service(svc, install["python"]) for sid, svc in services.items()},
        # The ports of the plan another process holds (the preflight's judgement); our own
        # units may hold theirs (a re-deploy), the pair probe's among them.
        "ports_argv": ports_argv,
        "reconcile_spec": nice_json(router["reconcile_spec"]) if router else None,
        # The read's checks (node_state's commands, through env: on a fresh host in check mode
        # the release's python does not exist yet, and env answers 127)
        "read_commands": _read_commands(install["python"], ports_argv, router),
        # Where the router and its admin key are: the drain (pdnode.node.drain) runs there.
        "router_host": plan["cluster"]["router"]["host"] if plan["cluster"]["multi_host"] else plan["host"],
        "drain": {sid: _drain_spec(plan, api_key, [sid] + (bound if services[sid]["upholds"] else []))
                  for sid in engine_ids},
        # The running instances a layout change stops count as planned until their step
        # (pdnode.core.change.identity): the drain of other units the plan lacks keeps them in.
        "drain_unplanned": {**_drain_spec(plan, api_key, None),
                            "workers": _drain_spec(plan, api_key, None)["workers"]
                            + [stop["worker"] for stop in stops.values()]},
        # What the deploy says of the layout change before it runs it.
        "change_lines": change_lines(change),
        # Each window the change accepted, its steps as the handlers take them (a start is
        # a "restart" of a unit not running; a decode bound to the node's one prefill
        # restarts within the prefill's step), for the measured report after them.
        "windows": [{"role": w["role"], "expected_s": w["expected_s"],
                     "steps": [h for i in w["steps"] for h in _handler_steps(change["steps"][i - 1], bound, engine_ids,
                                                                             services)]}
                    for w in change.get("windows", [])],
        # Each running instance this host's steps stop: its unit and the drain of its worker.
        "stops": {sid: {"unit": stop["unit"],
                        "drain": {**_drain_spec(plan, api_key, []), "workers": [stop["worker"]]}}
                  for sid, stop in stops.items()},
        "orphans": {"unit_dir": UNITS_DIR, "prefix": prefix, "config_dir": install["config_dir"],
                    "applied_dir": install["applied_dir"],
                    # every unit file this role may have written (engine units of any layout, the probe's)
                    "own_pattern": f"{re.escape(prefix)}-({ENGINE_UNIT}|{PROBE_UNIT})",
                    "engine_pattern": f"{re.escape(prefix)}-{ENGINE_UNIT}",
                    "keep": units + ([probe["service"], probe["timer"]] if probe else []),
                    "deferred": [stop["unit"] for stop in stops.values()]},
        "restart": {"engines": engine_ids, "prefills": [sid for sid in engine_ids if services[sid]["role"] == "prefill"],
                    "bound": bound, "router": router is not None,
                    "change": [{"kind": step["kind"], "id": step["id"]} for step in change["steps"]
                               if (step["id"] in stops if step["kind"] == "stop" else step["id"] in services)]},
    }


def _read_commands(python: str, ports_argv: list[str], router: dict[str, Any] | None) -> dict[str, Any]:
    """node_state's checks: the ports of the plan another process holds, and whether the
    router's worker list differs from the plan's (pdnode.node.drain reconcile --check)."""
    out: dict[str, Any] = {"ports": {"argv": ["env", *ports_argv], "differs": "ports"}}
    if router:
        out["reconcile"] = {"argv": ["env", python, "-m", "pdnode.node.drain", "reconcile", "--check"],
                            "stdin": nice_json(router["reconcile_spec"]), "json": True,
                            "differs": "router: its worker list differs from the plan's"}
    return out


def _hold(python: str, svc: dict[str, Any]) -> list[str]:
    """The wait before one of several prefills starts again: until every decode's heartbeats
    have dropped it (pdnode.node.drain hold, counted from the stop systemd recorded)."""
    return [python, "-m", "pdnode.node.drain", "hold", svc["unit"], str(svc["restart_delay_s"])]


def _line(argv: list[str]) -> str:
    """An argv as the value of a unit's Exec*= line (pdnode.node.unitcheck.exec_line: every
    argument quoted and escaped, one per continued line)."""
    return exec_line(list(argv), "", sep=" \\\n    ")


def _service(svc: dict[str, Any], python: str) -> dict[str, Any]:
    """What a service's unit, environment file and drop-ins write (templates/)."""
    return {"id": svc["id"], "role": svc["role"], "engine": svc["role"] != "router", "unit": svc["unit"],
            "stem": svc["unit"].removesuffix(".service"), "env_file": svc["env_file"],
            "exec_start": _line(svc["exec"]), "python": svc["exec"][0], "ready": svc["ready"],
            "post_start": _line(svc["post_start"]) if svc.get("post_start") else None,
            "hold": _hold(python, svc) if svc["restart_delay_s"] else None}


def _probe(probe: dict[str, Any]) -> dict[str, Any]:
    """What the pair probe's service and timer write (templates/pair_probe.*.j2)."""
    return {"service": probe["service"], "timer": probe["timer"], "stem": probe["service"].removesuffix(".service"),
            "exec_start": _line(probe["exec"]),
            "timeout_start_s": probe["spec"]["timeout_s"] + 60,
            "state_directory": posixpath.basename(probe["textfile_dir"])}
