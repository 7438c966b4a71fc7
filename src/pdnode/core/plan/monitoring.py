"""Prometheus alert rules and scrape configuration for a PD node, rendered from the plan.

The rules live in templates/prometheus/pdnode-alerts.rules.template.yml, a YAML file
whose strings hold [[name]] placeholders (docs/monitoring.md). This module fills them
from the plan dict (`Plan.as_dict()`), drops the rules whose `when:` value is unset, and
dumps YAML. No Jinja: PyYAML is already a runtime dependency of pdnode, and Prometheus's
own `{{ $labels.x }}` templating passes through untouched because the placeholders are
brackets. `scrape_config(plan)` is prometheus.yml: one target per engine instance and the
router (from plan["services"]), the node exporter, and on GPU hosts the DCGM exporter.
Runs on the controller only (it reads the repository's templates/); the monitoring role
calls it through plugins/filter/monitoring.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .. import resources

TEMPLATE = resources.resource("templates", "prometheus", "pdnode-alerts.rules.template.yml")

# Scrape job names the rules select on. The Prometheus role must name its jobs exactly
# so; it takes them from here (scrape_jobs), never spelled again.
SCRAPE_JOBS = {
    "prefill": "pdnode_prefill",
    "decode": "pdnode_decode",
    "router": "pdnode_router",
    "node": "pdnode_node_exporter",
    "dcgm": "pdnode_dcgm_exporter",
}

# What the exporters must be started with for the rules to have their inputs
# (PdMetricsMissing / PdGpuMetricsMissing fire when they lack them). node_exporter's
# systemd collector is off by default and its restart counter is behind a flag
# (collector/systemd_linux.go); DCGM_FI_DEV_ECC_DBE_VOL_TOTAL is commented out in
# dcgm-exporter's etc/default-counters.csv.
NODE_EXPORTER_FLAGS = ("--collector.systemd", "--collector.systemd.enable-restarts-metrics")
DCGM_EXTRA_FIELDS = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",)

# Thresholds (pdnode_verify_thresholds keys) the rules read; a rule that needs one is
# rendered only when the inventory sets it.
RULE_THRESHOLDS = ("ttft_p99_max_s", "itl_p99_max_s", "kv_transfer_speed_min_gb_s")

PLACEHOLDER = re.compile(r"\[\[([a-z0-9_]+)\]\]")


class TemplateError(ValueError):
    """The template names a placeholder or a `when:` value the renderer does not know."""


def gpu_host(plan: dict[str, Any]) -> bool:
    """A host with a real engine has GPUs to watch (and a DCGM exporter to scrape); the
    stand-in engine (demo node) has none."""
    return plan["install"]["engine"] != "sim"


def scrape_jobs(plan: dict[str, Any]) -> dict[str, str]:
    """role -> job name of what Prometheus scrapes for this plan."""
    return {role: job for role, job in SCRAPE_JOBS.items() if role != "dcgm" or gpu_host(plan)}


def _number(value: float) -> str:
    """A threshold as PromQL and people read it: 2.0 -> 2, 0.05 -> 0.05."""
    return format(float(value), "g")


def _duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def _router_workers(plan: dict[str, Any]) -> dict[str, str | None]:
    router = plan["services"].get("router")
    return {f"router_{role}s": None if router is None else str(len(router["args"][role]))
            for role in ("prefill", "decode")}


def template_values(plan: dict[str, Any]) -> dict[str, str | None]:
    """Placeholder name -> text; None for a value the inventory does not set."""
    thresholds = plan["settings"].get("pdnode_verify_thresholds") or {}
    probe = pair_probe(plan)
    # the per-pair probe's timer must stay active too (its oneshot service is inactive between runs)
    units = sorted([service["unit"] for service in plan["services"].values()] + ([probe["timer"]] if probe else []))
    circuit_open_s = int(plan["settings"]["pdnode_router_circuit_open_s"])
    jobs = scrape_jobs(plan)
    values: dict[str, str | None] = {
        "host": plan["host"],
        "prefix": plan["install"]["prefix"],
        # Exact unit names; the dot escaped for the regex (a PromQL string: \\ is one \).
        "units_regex": "|".join(u.replace(".", "\\\\.") for u in units),
        "jobs_regex": "|".join(jobs.values()),
        "circuit_open_s": str(circuit_open_s),
        # An open breaker goes half-open after circuit_open_s by itself: still open after
        # twice that (at least a minute) means it keeps re-opening.
        "circuit_for": _duration(max(60, 2 * circuit_open_s)),
        "gpu_host": "true" if gpu_host(plan) else None,
        # How many workers of each type the router serves in the plan (its own arguments);
        # None on a host without the router.
        **_router_workers(plan),
        # The per-pair probe (on the router's host, unless pdnode_pair_probe_interval_s is 0):
        # PdPairFailing fires after three failed probes in a row; PdPairProbeStale when no
        # probe has written for three intervals and its own timeout.
        "pair_probe": "true" if probe else None,
        "pair_probe_service": probe["service"] if probe else None,
        "pair_probe_for": _duration(60 * -(-3 * probe["interval_s"] // 60)) if probe else None,
        "pair_probe_stale_s": str(3 * probe["interval_s"] + probe["spec"]["timeout_s"]) if probe else None,
        **{f"job_{role}": job for role, job in SCRAPE_JOBS.items()},
    }
    for key in RULE_THRESHOLDS:
        values[key] = None if thresholds.get(key) is None else _number(thresholds[key])
    return values


def _fill(text: str, values: dict[str, str | None], where: str) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise TemplateError(f"{where}: unknown placeholder [[{name}]] (known: {', '.join(sorted(values))})")
        if values[name] is None:
            raise TemplateError(f"{where}: [[{name}]] is not set for this plan; guard the rule with `when: {name}`")
        return str(values[name])
    return PLACEHOLDER.sub(one, text)


def _fill_all(node: Any, values: dict[str, str | None], where: str) -> Any:
    if isinstance(node, str):
        return _fill(node, values, where)
    if isinstance(node, dict):
        return {k: _fill_all(v, values, where) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill_all(v, values, where) for v in node]
    return node


def alert_rules(plan: dict[str, Any], template: Path = TEMPLATE) -> dict[str, Any]:
    """The rules file as data: {"groups": [{"name", "rules": [...]}]}."""
    values = template_values(plan)
    source = yaml.safe_load(template.read_text())
    groups = []
    for group in source["groups"]:
        rules = []
        for rule in group["rules"]:
            rule = dict(rule)
            when = rule.pop("when", None)
            if when is not None:
                if when not in values:
                    raise TemplateError(f"{rule.get('alert')}: unknown `when: {when}`")
                if values[when] is None:
                    continue
            rules.append(_fill_all(rule, values, str(rule.get("alert"))))
        if rules:
            groups.append({"name": group["name"], "rules": rules})
    return {"groups": groups}


def render_alert_rules(plan: dict[str, Any], template: Path = TEMPLATE) -> str:
    """The Prometheus rules file for this plan (YAML text, ready for promtool)."""
    header = (f"# Prometheus alert rules for PD node {plan['host']}: rendered by "
              "`pdnode render INVENTORY --role alerts` from\n"
              "# templates/prometheus/pdnode-alerts.rules.template.yml. Do not edit; re-render.\n")
    return header + yaml.safe_dump(alert_rules(plan, template), sort_keys=False, width=120)


def alert_names(rules: dict[str, Any]) -> list[str]:
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


# --- scrape configuration ---------------------------------------------------------------
# Where the monitoring role installs the rendered rules; prometheus.yml names it absolute,
# so `promtool check config` of a candidate file in a temporary directory finds it.
RULES_FILE = "/etc/prometheus/rules/pdnode-alerts.rules.yml"
# What the role's listeners default to (loopback: nothing here is for other hosts).
NODE_EXPORTER_ADDRESS = "127.0.0.1:9100"
DCGM_EXPORTER_ADDRESS = "127.0.0.1:9400"
ENGINE_ROLES = ("prefill", "decode")
# host:port with a DNS name, IPv4 or bracketed IPv6 host: the only form a target takes.
ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$")
DURATION_RE = re.compile(r"^[1-9][0-9]{0,4}(?:ms|s|m|h)$")
PATH_RE = re.compile(r"^(?:/[A-Za-z0-9._~-]+)*/?$")
# A service listening on every address is scraped over loopback.
_WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 - mapped away, never listened on


class ScrapeConfigError(ValueError):
    """A value that would reach prometheus.yml is not of the form a target needs."""


def engine_services(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's prefill and decode instances, in plan order."""
    return [s for s in plan["services"].values() if s["role"] in ENGINE_ROLES]


def _address(value: str, field: str, fix: str) -> str:
    if not isinstance(value, str) or not ADDRESS_RE.match(value):
        raise ScrapeConfigError(f"{field}: {value!r} is not host:port; {fix}")
    port = int(value.rsplit(":", 1)[1])
    if not 0 < port < 65536:
        raise ScrapeConfigError(f"{field}: port {port} is out of range 1-65535; {fix}")
    return value


def _target(url: str, field: str, default_path: str) -> tuple[str, str, str]:
    """An http(s) URL -> (scheme, host:port, metrics path)."""
    fix = "the plan gives http://HOST:PORT (re-render the plan with this pdnode)"
    # urlsplit drops tabs and newlines silently: a URL holding one is refused first.
    if not isinstance(url, str) or re.search(r"[\s\x00-\x1f\x7f]", url):
        raise ScrapeConfigError(f"{field}: {url!r} is not a URL; {fix}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.query or parts.fragment or parts.username or parts.password:
        raise ScrapeConfigError(f"{field}: {url!r} is not a plain http(s) URL; {fix}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not parts.hostname:
        raise ScrapeConfigError(f"{field}: {url!r} names no host and port; {fix}")
    host = _WILDCARD.get(parts.hostname, parts.hostname)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    path = parts.path.rstrip("/") + default_path if default_path else parts.path
    if not PATH_RE.match(path) or not path:
        raise ScrapeConfigError(f"{field}: {url!r} has a path Prometheus cannot be given ({path!r}); {fix}")
    return parts.scheme, _address(netloc, field, fix), path


def _static(scheme: str, path: str, job: str, targets: list[tuple[str, dict[str, str]]],
            interval: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"job_name": job}
    if interval:
        config["scrape_interval"] = interval
    config |= {"scheme": scheme, "metrics_path": path,
               "static_configs": [{"targets": [t], "labels": labels} for t, labels in targets]}
    return config


def scrape_config(plan: dict[str, Any], *, node_exporter: str = NODE_EXPORTER_ADDRESS,
                  dcgm_exporter: str = DCGM_EXPORTER_ADDRESS, scrape_interval: str = "15s",
                  rules_file: str = RULES_FILE) -> dict[str, Any]:
    """prometheus.yml as data. Job names come from SCRAPE_JOBS (the rules select on them);
    every target carries pdnode_host, and the engines and the router pdnode_service and
    pdnode_unit, which the dashboard's variables read (templates/grafana/)."""
    if not isinstance(scrape_interval, str) or not DURATION_RE.match(scrape_interval):
        raise ScrapeConfigError(f"monitoring_scrape_interval: {scrape_interval!r} is not a Prometheus duration; "
                                "write e.g. 15s or 1m")
    if not isinstance(rules_file, str) or not rules_file.startswith("/") or not PATH_RE.match(rules_file):
        raise ScrapeConfigError(f"rules file: {rules_file!r} is not an absolute path of plain characters")
    node_exporter = _address(node_exporter, "monitoring_node_exporter_listen_address",
                             "write HOST:PORT, e.g. 127.0.0.1:9100")
    host = {"pdnode_host": plan["host"]}
    jobs = scrape_jobs(plan)
    configs: list[dict[str, Any]] = []
    for role in ENGINE_ROLES:
        by_form: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = {}
        # node rank >= 1 of an instance spanning hosts serves no HTTP (url None)
        for service in (s for s in engine_services(plan) if s["role"] == role and s["url"] is not None):
            scheme, address, path = _target(service["url"], f"services.{service['id']}.url", "/metrics")
            by_form.setdefault((scheme, path), []).append(
                (address, {**host, "pdnode_service": service["id"], "pdnode_unit": service["unit"]}))
        if len(by_form) > 1:
            raise ScrapeConfigError(f"services of role {role}: URLs differ in scheme or path "
                                    f"({sorted(by_form)}); one scrape job needs one form")
        for (scheme, path), targets in by_form.items():
            configs.append(_static(scheme, path, jobs[role], targets))
    router = plan["services"].get("router")  # only on the host that runs it
    if router is not None:
        scheme, address, path = _target(router["metrics_url"], "services.router.metrics_url", "")
        configs.append(_static(scheme, path, jobs["router"],
                               [(address, {**host, "pdnode_service": router["id"], "pdnode_unit": router["unit"]})]))
    configs.append(_static("http", "/metrics", jobs["node"], [(node_exporter, host)]))
    if "dcgm" in jobs:
        dcgm_exporter = _address(dcgm_exporter, "monitoring_dcgm_exporter_listen_address",
                                 "write HOST:PORT, e.g. 127.0.0.1:9400")
        configs.append(_static("http", "/metrics", jobs["dcgm"], [(dcgm_exporter, host)]))
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [rules_file],
        "scrape_configs": configs,
    }


def render_scrape_config(plan: dict[str, Any], **kwargs: Any) -> str:
    """prometheus.yml for this plan (YAML text, ready for `promtool check config`)."""
    header = (f"# Prometheus configuration for PD node {plan['host']}: rendered from the plan by\n"
              "# pdnode.core.plan.monitoring.scrape_config (roles/monitoring). Do not edit; re-run the playbook.\n")
    return header + yaml.safe_dump(scrape_config(plan, **kwargs), sort_keys=False, width=120)


def dcgm_counters(default_csv: str, extra: tuple[str, ...] = DCGM_EXTRA_FIELDS) -> str:
    """dcgm-exporter's installed default-counters.csv with the fields the rules need switched
    on: a commented-out line of the field is uncommented; a field the file lacks is an error
    (its type and help text come from that file, so the exporter's release decides them)."""
    lines = default_csv.splitlines()
    for field in extra:
        live = [i for i, line in enumerate(lines) if line.split(",", 1)[0].strip() == field]
        if live:
            continue
        commented = [i for i, line in enumerate(lines)
                     if line.lstrip().startswith("#") and line.lstrip("# \t").split(",", 1)[0].strip() == field]
        if not commented:
            raise ScrapeConfigError(f"dcgm-exporter's default-counters.csv has no line for {field}; "
                                    "add it to the counters file by hand or update DCGM_EXTRA_FIELDS")
        lines[commented[0]] = lines[commented[0]].lstrip("# \t")
    return "# dcgm-exporter counters for pdnode: the package's default-counters.csv with " + ", ".join(extra) + \
        " switched on (roles/monitoring).\n" + "\n".join(lines) + "\n"


def pair_probe(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The per-pair probe this host runs (pdnode.node.pair_probe), or None."""
    return (plan["services"].get("router") or {}).get("pair_probe")


def role_facts(plan: dict[str, Any]) -> dict[str, Any]:
    """What the monitoring role takes from here rather than spelling it again."""
    probe = pair_probe(plan)
    return {
        "gpu_host": gpu_host(plan),
        # the probe's metrics reach Prometheus through the node exporter's textfile collector
        "node_exporter_flags": list(NODE_EXPORTER_FLAGS)
        + ([f"--collector.textfile.directory={probe['textfile_dir']}"] if probe else []),
        "dcgm_extra_fields": list(DCGM_EXTRA_FIELDS),
        "rules_file": RULES_FILE,
        "jobs": scrape_jobs(plan),
    }
