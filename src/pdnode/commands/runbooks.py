"""Per-host runbooks: templates/runbooks/*.md.j2 filled from one host's plan.

`render_runbooks(plan)` returns {file name: Markdown}: the node's overview (README.md),
start/stop, node-not-serving, verify/collect/bench, upgrade/rollback and one file per
alert of templates/prometheus/ (alerts/<name>.md), each with this host's unit names,
ports, paths and commands. `pdnode runbooks INVENTORY` writes them for every host of the
inventory (or one, --host) to .cache/runbooks/<host>/, replacing a host's directory as a
whole. The generic runbooks in docs/runbooks/ explain; these say what to type here.
A host of a layout over several hosts gets pages for what runs on it, the whole layout
on its overview, and the router's checks where the router runs (a pointer elsewhere).

Jinja2, not the [[placeholder]] filling of monitoring.py: a runbook loops over the
instances (one row, one command per instance, as many as the inventory has) and over
the alerts, and says things only when they hold (the restart coupling with one prefill);
placeholders cannot. Jinja2 comes with ansible-core, which the controller's .venv has.
Controller-only: it reads the repository's templates/.

Secrets: a runbook names the key files' paths on the host and never reads them; every
command that needs a key reads it from its file on the host into curl's standard input
(`curl -H @-`), so the key never appears on a command line.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ..core.change import cost as change_cost
from ..core.plan import monitoring
from ..core import resources
from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from ..core.inventory.read import InventoryError, inventory_hosts
from ..core.plan.load import Unplannable, load_plan
from ..core.rules.instances import gpus_text

# The units' readiness timeout and watchdog come from the pd_services role: its defaults,
# or the inventory's values (judged by the plan: values.ROLE_RULES).
PD_SERVICES_DEFAULTS = resources.resource("roles", "pd_services", "defaults", "main.yml")
PD_SERVICES_VALUES = ("pd_services_ready_timeout_s", "pd_services_watchdog_s")
TEMPLATES = resources.resource("templates", "runbooks")
DEFAULT_OUT = resources.controller_dir() / ".cache" / "runbooks"
# One template per page; alerts/<name>.md come from alert.md.j2, once per alert.
PAGES = ("README.md", "start-stop.md", "change.md", "node-not-serving.md", "verify-collect-bench.md", "upgrade.md")
ALERT_TEMPLATE = "alert.md.j2"
# The exporters' units as roles/monitoring installs them (Debian's and NVIDIA's packages).
EXPORTER_UNITS = {"node": "prometheus-node-exporter.service", "dcgm": "nvidia-dcgm-exporter.service"}
ENGINE_ROLES = ("prefill", "decode")

# What may reach a shell command of a runbook unquoted: the plan validated these already
# (values.py); a value that does not match here is refused rather than pasted into a command.
UNIT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,250}\.(?:service|target|timer)$")
PATH_RE = re.compile(r"^/(?:[A-Za-z0-9._+-]+/?)*$")
HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
ID_RE = re.compile(r"^(?:(?:prefill|decode)-[0-9]{1,3}|router)$")
ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*)$")
_WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class RunbookError(ValueError):
    """A plan value a runbook would print into a command is not of the expected form."""


def _check(value: Any, pattern: re.Pattern[str], field: str, fix: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise RunbookError(f"{field}: {value!r} is not {fix}")
    return value


def _address(url: str, field: str) -> tuple[str, int]:
    """host, port of an http(s) URL of the plan, a wildcard host as loopback."""
    parts = urlsplit(url) if isinstance(url, str) else None
    try:
        port = parts.port if parts else None
    except ValueError:
        port = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise RunbookError(f"{field}: {url!r} is not an http://HOST:PORT URL; re-render the plan with this pdnode")
    return _WILDCARD.get(parts.hostname, parts.hostname), port


def _service(s: dict[str, Any]) -> dict[str, Any]:
    sid = _check(s["id"], ID_RE, "services.id", "a service id (prefill-N, decode-N, router)")
    unit = _check(s["unit"], UNIT_RE, f"services.{sid}.unit", "a systemd unit name")
    for key in ("config", "env_file"):
        _check(s[key], PATH_RE, f"services.{sid}.{key}", "an absolute path of plain characters")
    rank = int(s["args"].get("node_rank") or 0)
    if s["url"] is None:
        # node rank >= 1 of an instance spanning hosts: no API, only SGLang's dummy /health,
        # which is its readiness URL
        host, port = _address(s["ready"][0], f"services.{sid}.ready")
        health = f"http://{host}:{port}/health"
    else:
        host, port = _address(s["url"], f"services.{sid}.url")
        health = s["url"].rstrip("/") + "/health"
    out = {
        "id": sid, "role": s["role"], "unit": unit, "ident": unit.removesuffix(".service"),
        "config": s["config"], "env_file": s["env_file"], "gpus": list(s["gpus"]), "gpus_text": gpus_text(s["gpus"]),
        "url": s["url"].rstrip("/") if s["url"] else None, "health_url": health, "port": port,
        "address": f"{host}:{port}", "node_rank": rank, "nnodes": int(s["args"].get("nnodes") or 1),
        "bound_to": s.get("bound_to"), "upholds": list(s.get("upholds") or []),
        "restart_delay_s": s.get("restart_delay_s"),
        # arguments the running service takes through its admin API (the router's workers)
        "live_args": list(s.get("live_args") or []),
        "bootstrap_port": s.get("bootstrap_port") if s["url"] else None,
        "bootstrap_url": None, "bootstrap_route": None, "nccl_port": s["args"].get("nccl_port"),
        "metrics_url": s.get("metrics_url") or (s["url"].rstrip("/") + "/metrics" if s["url"] else None),
    }
    if s["role"] == "prefill" and s["url"]:
        out["bootstrap_url"] = f"http://{host}:{s['bootstrap_port']}"
        # The bootstrap server's readiness URL is the plan's own (the readiness gate's).
        out["bootstrap_route"] = next((u for u in s["ready"] if "/route" in u), None)
    if s["role"] == "router":
        out["metrics_port"] = _address(out["metrics_url"], "services.router.metrics_url")[1]
        out["api_port"] = s["args"]["port"]
        out["api_host"] = s["args"]["host"]
        out["policy"] = s["args"].get("policy")
    return out


def _targets(plan: dict[str, Any], services: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """What Prometheus scrapes for this plan, each with the labels an alert carries (job,
    instance) and the service and unit behind it: the scrape configuration's own targets."""
    out = []
    for job in monitoring.scrape_config(plan)["scrape_configs"]:
        role = next(r for r, name in monitoring.SCRAPE_JOBS.items() if name == job["job_name"])
        for static in job["static_configs"]:
            sid = static["labels"].get("pdnode_service")
            svc = services.get(sid) if sid else None
            unit = svc["unit"] if svc else EXPORTER_UNITS.get(role)
            address = static["targets"][0]
            out.append({"job": job["job_name"], "role": role, "instance": address, "service": sid or "-",
                        "unit": unit, "ident": unit.removesuffix(".service") if svc else None,
                        "url": f"{job['scheme']}://{address}{job['metrics_path']}"})
    return out


def _alerts(plan: dict[str, Any], targets: list[dict[str, Any]], layout: dict[str, Any]) -> list[dict[str, Any]]:
    """Every alert of the rules template, with whether it can fire on this host and, when
    not, why: the `when:` value the plan leaves unset, or (a layout over several hosts)
    no target here of the jobs its expression reads."""
    source = yaml.safe_load(monitoring.TEMPLATE.read_text())
    rendered = set(monitoring.alert_names(monitoring.alert_rules(plan)))
    scraped = {t["role"] for t in targets}
    out = []
    for group in source["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            when = rule.get("when")
            reads = [role for role, job in monitoring.SCRAPE_JOBS.items() if f"[[job_{role}]]" in rule["expr"]]
            if rule["alert"] in rendered and reads and not scraped.intersection(reads):
                where = sorted({h for e in layout["engines"] if e["role"] in reads for h in e["hosts"]}
                               | ({layout["router_host"]} if "router" in reads else set()))
                why_not = (f"this host runs no {' or '.join(reads)}, so its Prometheus scrapes none: it fires on "
                           f"{', '.join(where)}, whose runbooks have this page too")
            elif rule["alert"] in rendered:
                why_not = None
            elif when == "router_prefills":
                why_not = (f"this host runs no router: it fires on {layout['router_host']}, whose runbooks "
                           "have this page too")
            elif when == "pair_probe":
                why_not = (f"this host runs no per-pair probe: it runs beside the router, on {layout['router_host']}"
                           if "router" not in plan["services"] else "the inventory turns the per-pair probe off "
                           "(pdnode_pair_probe_interval_s: 0)")
            elif when == "gpu_host":
                why_not = f"this host runs the {plan['install']['engine']} engine, not a GPU engine: no DCGM exporter"
            else:
                why_not = f"the inventory sets no pdnode_verify_thresholds.{when}"
            out.append({"name": rule["alert"], "group": group["name"], "severity": rule["labels"]["severity"],
                        "anchor": rule["alert"].lower(), "active": why_not is None, "why_not": why_not})
    return out


def context(plan: dict[str, Any], inventory: str = "INVENTORY", address: str | None = None,
            sources: dict[str, str] | None = None, role_values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The values the templates read, each checked for the form it is printed in.
    `sources`: variable -> the inventory file that sets it (HostVars.sources);
    `role_values`: the inventory's pd_services_* values (the role's defaults otherwise)."""
    host = _check(plan["host"], HOST_RE, "host", "a host name")
    install = dict(plan["install"])
    for key in ("root", "venv", "router_venv", "config_dir", "python", "api_key_path", "admin_key_path"):
        _check(install[key], PATH_RE, f"install.{key}", "an absolute path of plain characters")
    _check(install["target"], UNIT_RE, "install.target", "a systemd unit name")
    if address is not None:
        _check(address, ADDRESS_RE, "ansible_host", "a host name or an IP address")
    services = {sid: _service(s) for sid, s in plan["services"].items()}
    engines = [s for s in services.values() if s["role"] in ENGINE_ROLES]
    router = services.get("router")  # a layout over several hosts: only on the router's host
    probe = monitoring.pair_probe(plan)
    if probe:
        probe = {"service": _check(probe["service"], UNIT_RE, "pair_probe.service", "a systemd unit name"),
                 "timer": _check(probe["timer"], UNIT_RE, "pair_probe.timer", "a systemd unit name"),
                 "spec_file": _check(probe["spec_file"], PATH_RE, "pair_probe.spec_file", "an absolute path"),
                 "out": _check(probe["spec"]["out"], PATH_RE, "pair_probe.spec.out", "an absolute path"),
                 "interval_s": int(probe["interval_s"]), "timeout_s": int(probe["spec"]["timeout_s"])}
    settings = plan["settings"]
    thresholds = settings.get("pdnode_verify_thresholds") or {}
    units_conf = pd_services_values(role_values or {})
    timeout = units_conf["pd_services_ready_timeout_s"]
    targets = _targets(plan, services)
    layout = _layout(plan)
    own_ports = [(name, port) for name, port in plan["ports"].items() if name.split(".", 1)[0] in services]
    return {
        "host": host,
        "inventory": inventory,
        "address": address,
        "install": install,
        "services": list(services.values()),
        "by_id": services,
        "engines": engines,
        # the engines this host serves the API of (a node rank >= 1 has none)
        "served": [s for s in engines if s["url"]],
        "prefills": [s for s in engines if s["role"] == "prefill"],
        "decodes": [s for s in engines if s["role"] == "decode"],
        "router": router,
        "pair_probe": probe,  # None where it does not run
        "layout": layout,
        # the layout's first decode: the one a page's example restart names
        "first_decode": next(e["id"] for e in layout["engines"] if e["role"] == "decode"),
        "units": [s["unit"] for s in services.values()],
        "ports": sorted(own_ports, key=lambda kv: (kv[1], kv[0])),
        "settings": settings,
        "thresholds": thresholds,
        "model": settings.get("pdnode_model_served_name"),
        "model_path": settings.get("pdnode_model_path"),
        "gpu_host": monitoring.gpu_host(plan),
        "targets": targets,
        "exporter_units": {role: unit for role, unit in EXPORTER_UNITS.items()
                           if any(t["role"] == role for t in targets)},
        "alerts": _alerts(plan, targets, layout),
        "versions": {k: settings.get(k) for k in sorted(settings) if k.endswith("_version")},
        "sources": {k: str(v) for k, v in (sources or {}).items() if k.endswith("_version")},
        "ready_timeout_s": timeout,
        "watchdog_s": units_conf["pd_services_watchdog_s"],
        # the deploy's restarts, the upgrade and playbooks/restart.yml drain every instance first
        "costs": {k: asdict(c) for k, c in change_cost.costs(plan, timeout).items()},
        # restart.yml's extra arguments per instance id (and "all"; "upgrade": upgrade.yml's):
        # the window's acceptance where the restart leaves a role with no instance serving
        # (it is refused without)
        "restart_extra": _restart_extra(plan, [s["id"] for s in engines]),
        "measured": change_cost.MEASURED,
    }


def _restart_extra(plan: dict[str, Any], ids: list[str]) -> dict[str, str]:
    accept = f" -e {shlex.quote(change_cost.ACCEPT_WINDOW)}"
    out = {iid: accept if change_cost.restart_refusal(plan, [iid]) else "" for iid in plan["cluster"]["engines"]}
    out["all"] = accept if change_cost.restart_refusal(plan, ids) else ""
    out["upgrade"] = accept if change_cost.upgrade_refused(plan) else ""
    return out


def pd_services_values(inventory_values: dict[str, Any]) -> dict[str, int]:
    """The units' readiness timeout and watchdog (seconds): the inventory's, else the role's."""
    defaults = yaml.safe_load(PD_SERVICES_DEFAULTS.read_text())
    return {k: int(inventory_values.get(k, defaults[k])) for k in PD_SERVICES_VALUES}


def _layout(plan: dict[str, Any]) -> dict[str, Any]:
    """The whole layout as every host's runbooks describe it: the hosts and what each runs,
    the router's host and URL, every engine instance (where it serves HTTP) and how many
    prefill and decode instances there are. One host: that host alone."""
    cluster = plan["cluster"]
    hosts = []
    for name, entry in cluster["hosts"].items():
        hosts.append({"name": _check(name, HOST_RE, "cluster.hosts", "a host name"),
                      "address": _check(entry["address"], ADDRESS_RE, f"cluster.hosts.{name}.address",
                                        "a host name or an IP address"),
                      "services": [_check(i, ID_RE, f"cluster.hosts.{name}.services", "a service id")
                                   for i in entry["services"]]})
    engines = []
    for iid, e in cluster["engines"].items():
        _address(e["url"], f"cluster.engines.{iid}.url")
        engines.append({
            "id": _check(iid, ID_RE, "cluster.engines", "a service id"), "role": e["role"],
            "hosts": [_check(h, HOST_RE, f"cluster.engines.{iid}.hosts", "a host name") for h in e["hosts"]],
            "url": e["url"].rstrip("/"), "bootstrap_port": e.get("bootstrap_port"),
            "unit": _check(e["unit"], UNIT_RE, f"cluster.engines.{iid}.unit", "a systemd unit name"),
        })
    router_host = _check(cluster["router"]["host"], HOST_RE, "cluster.router.host", "a host name")
    _address(cluster["router"]["url"], "cluster.router.url")
    return {"multi_host": bool(cluster["multi_host"]), "hosts": hosts, "engines": engines,
            "router_host": router_host, "router_url": cluster["router"]["url"].rstrip("/"),
            "prefills": sum(e["role"] == "prefill" for e in engines),
            "decodes": sum(e["role"] == "decode" for e in engines)}


def _environment() -> Any:
    import jinja2  # controller-only, from ansible-core; imported here so `pdnode check` never loads it

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,  # a misspelt name fails the render, never prints ""
        autoescape=False,  # Markdown, not HTML  # noqa: S701
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["sh"] = lambda value: shlex.quote(str(value))
    return env


def render_runbooks(plan: dict[str, Any], inventory: str = "INVENTORY", address: str | None = None,
                    sources: dict[str, str] | None = None, role_values: dict[str, Any] | None = None) -> dict[str, str]:
    """{relative file name: Markdown} for one host's plan (`Plan.as_dict()`); `inventory` is
    the path the commands name, `address` the host's ansible_host, `sources` where the
    inventory sets each variable, `role_values` its pd_services_* values."""
    env = _environment()
    ctx = context(plan, inventory, address, sources, role_values)
    out = {page: env.get_template(page + ".j2").render(ctx) for page in PAGES}
    frame = env.get_template(ALERT_TEMPLATE)
    for alert in ctx["alerts"]:
        out[f"alerts/{alert['name']}.md"] = frame.render(ctx, alert=alert)
    return out


# --- `pdnode runbooks INVENTORY` ---------------------------------------------------------------
def _render_host(inventory: str, host: str) -> dict[str, str]:
    try:
        loaded = load_plan(inventory, host)
    except Unplannable as exc:
        if not exc.problems:
            raise
        more = len(exc.problems) - 1  # one line: the first problem (with its file), and how many more
        raise RunbookError(f"{inventory}: host {host}: {exc.lines[1].strip()}"
                           + (f" (and {more} more: `pdnode check {inventory} --host {host}` lists them)" if more else "")
                           ) from None
    hv = loaded.variables
    conn = hv.get("ansible_connection")
    address = hv.get("ansible_host") if conn not in ("local", "community.docker.docker") else None
    role_values = {k: hv[k] for k in PD_SERVICES_VALUES if k in hv}  # judged by the plan
    return render_runbooks(loaded.plan.as_dict(), inventory, str(address) if address else None, loaded.sources,
                           role_values)


def _sibling(out_dir: Path, tag: str) -> Path:
    return out_dir.parent / f".{out_dir.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"


def write_tree(out_dir: Path, files: dict[str, str]) -> None:
    """Replace out_dir with exactly these files: written beside it, then renamed into place,
    so a reader sees the old set or the new one, never a mix or a half-written file."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out_dir, "new")
    tmp.mkdir()  # the umask's mode, as any other output of the CLI: runbooks hold no secret
    try:
        for name, text in files.items():
            target = (tmp / name).resolve()
            if tmp.resolve() not in target.parents:
                raise RunbookError(f"runbook file name {name!r} leaves the output directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        old = _sibling(out_dir, "old") if out_dir.exists() else None
        if old is not None:
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runbooks", help="write this inventory's per-host runbooks (its units, ports, paths, "
                                        "commands) to .cache/runbooks/<host>/")
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="only this host (default: every host of the inventory)")
    p.add_argument("--out", help="directory that gets one folder per host (default: .cache/runbooks "
                                 "in the repository)")
    p.set_defaults(func=cmd_runbooks)


def cmd_runbooks(args: argparse.Namespace) -> int:
    """Exit 0 written; 1 the inventory is invalid for a host (nothing written); 2 could not run."""
    inventory = str(args.inventory).rstrip("/") or "/"
    try:
        hosts = [args.host] if args.host else inventory_hosts(inventory)
        rendered = {host: _render_host(inventory, host) for host in hosts}
    except InventoryError as exc:
        print(f"pdnode runbooks: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except RunbookError as exc:
        print(f"pdnode runbooks: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ImportError as exc:
        print(f"pdnode runbooks: {exc.name} is not installed here; run scripts/setup (it installs ansible-core, "
              "which brings Jinja2)", file=sys.stderr)
        return EXIT_CANNOT_RUN
    out = Path(args.out) if args.out else DEFAULT_OUT
    try:
        for host, files in rendered.items():
            write_tree(out / host, files)
            print(f"{host}: {len(files)} runbooks in {out / host}/")
    except OSError as exc:
        print(f"pdnode runbooks: cannot write {exc.filename or out}: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    return EXIT_OK
