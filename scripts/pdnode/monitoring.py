"""Prometheus alert rules for a PD node, rendered from the plan.

The rules live in templates/prometheus/pdnode-alerts.rules.template.yml, a YAML file
whose strings hold [[name]] placeholders (docs/monitoring.md). This module fills them
from the plan dict (`Plan.as_dict()`), drops the rules whose `when:` value is unset, and
dumps YAML. No Jinja: PyYAML is already a runtime dependency of pdnode, and Prometheus's
own `{{ $labels.x }}` templating passes through untouched because the placeholders are
brackets. Runs on the controller only (it reads the repository's templates/).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "prometheus" / "pdnode-alerts.rules.template.yml"

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


def template_values(plan: dict[str, Any]) -> dict[str, str | None]:
    """Placeholder name -> text; None for a value the inventory does not set."""
    thresholds = plan["settings"].get("pdnode_verify_thresholds") or {}
    units = sorted(service["unit"] for service in plan["services"].values())
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
