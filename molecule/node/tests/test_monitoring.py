"""Monitoring on the deployed node (issue 11, item 3): the real Prometheus and node exporter
from Debian, installed by roles/monitoring, scraping the real router and the stand-in
engines.

- every scrape target is up, and there is one per engine instance (units on the host);
- the alert rules on disk are the ones Prometheus evaluates, without evaluation errors;
- the node exporter runs with the systemd collector and restart counts, on loopback;
- every panel query of templates/grafana/pdnode-dashboard.json, its $variables expanded
  from the dashboard's own templating against this Prometheus (as Grafana does), returns
  data after some traffic through the router. GPU-only panels (their description starts
  "GPU only:") must return NOTHING here, and for the stated reason: there is no DCGM
  target on the stand-in node. A GPU panel that somehow had data, or a non-GPU panel
  marked GPU-only to hide an empty query, fails.

Read-only apart from the requests it sends. Prometheus's API is read inside the
container (it listens on loopback there).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = json.loads((REPO / "templates" / "grafana" / "pdnode-dashboard.json").read_text())
PROMETHEUS = "http://127.0.0.1:9090"
RULES_FILE = "/etc/prometheus/rules/pdnode-alerts.rules.yml"
KEY_ON_HOST = "/etc/sglang-pd/api-key"
PREFIX = "sglang-pd"
GPU_ONLY = "GPU only:"
DCGM_JOB = "pdnode_dcgm_exporter"
# Grafana's Prometheus data source escapes these in a multi-value variable (a regex).
REGEX_SPECIAL = set("\\^$*+?.()|{}[]")


def api(host, path: str, **params: str) -> dict:
    """GET Prometheus's HTTP API inside the container; the parsed `data`."""
    url = f"{PROMETHEUS}{path}" + (f"?{urlencode(params)}" if params else "")
    out = host.check_output("curl -sS --max-time 20 %s", url)
    body = json.loads(out)
    assert body["status"] == "success", f"{path} {params}: {body}"
    return body["data"]


def wait_for(check, timeout_s: float = 300, every_s: float = 3):
    """check() until it returns a true value, or the last value after the timeout (far
    beyond the few scrape intervals a working node needs: it ends as soon as check holds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every_s)


def seconds(duration: str) -> int:
    m = re.fullmatch(r"(\d+)(s|m)", duration)
    assert m, f"unexpected scrape interval {duration!r}"
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


@pytest.fixture(scope="module")
def scrape_s(host) -> int:
    config = api(host, "/api/v1/status/config")["yaml"]
    m = re.search(r"^  scrape_interval: (\S+)$", config, re.MULTILINE)
    assert m, config[:400]
    return seconds(m.group(1))


@pytest.fixture(scope="module")
def engine_units(host) -> list[str]:
    """The engine instances the host runs, from systemd (not from the plan code)."""
    out = host.check_output(f"systemctl list-units --plain --no-legend '{PREFIX}-prefill*' '{PREFIX}-decode*'")
    units = sorted(line.split()[0] for line in out.splitlines() if line.strip())
    assert units, "no engine units on the host"
    return units


def targets(host) -> list[dict]:
    return api(host, "/api/v1/targets", state="active")["activeTargets"]


# --- targets, rules, exporters -----------------------------------------------------------
def test_every_target_is_up_one_per_engine_instance(host, engine_units):
    def all_up():
        got = targets(host)
        return got if got and all(t["health"] == "up" for t in got) else None
    got = wait_for(all_up) or targets(host)
    down = [f"{t['labels']['job']} {t['scrapeUrl']}: {t['health']} {t['lastError']}" for t in got if t["health"] != "up"]
    assert not down, "targets not up:\n" + "\n".join(down)
    jobs = sorted(t["labels"]["job"] for t in got)
    engines = sorted(t["labels"]["pdnode_unit"] for t in got if t["labels"]["job"] in ("pdnode_prefill", "pdnode_decode"))
    assert engines == engine_units
    assert jobs.count("pdnode_router") == 1 and jobs.count("pdnode_node_exporter") == 1
    assert DCGM_JOB not in jobs, "a DCGM exporter target on the stand-in node (it has no GPUs)"


def test_alert_rules_on_disk_are_loaded_and_evaluate(host):
    on_disk = host.check_output(f"cat {RULES_FILE}")
    names_on_disk = set(re.findall(r"^\s*- alert: (\w+)$", on_disk, re.MULTILINE))
    assert {"PdBootstrapFailures", "PdTransferFailures", "PdKvTransferSlow", "PdCircuitOpen",
            "PdServiceRestarting", "PdTargetDown"} <= names_on_disk

    def evaluated():
        groups = api(host, "/api/v1/rules", type="alert")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else None
    rules = wait_for(evaluated) or []
    assert {r["name"] for r in rules} == names_on_disk
    bad = [f"{r['name']}: {r['health']} {r.get('lastError', '')}" for r in rules if r["health"] != "ok"]
    assert not bad, "\n".join(bad)
    # No GPU rules on a host without GPUs (they would fire PdGpuMetricsMissing forever).
    assert not {n for n in names_on_disk if n.startswith("PdGpu")}


def test_node_exporter_runs_with_restart_counts_on_loopback(host):
    svc = host.service("prometheus-node-exporter.service")
    assert svc.is_running and svc.is_enabled
    assert host.socket("tcp://127.0.0.1:9100").is_listening
    assert not host.socket("tcp://0.0.0.0:9100").is_listening
    metrics = host.check_output("curl -sS --max-time 10 http://127.0.0.1:9100/metrics")
    assert f'node_systemd_service_restart_total{{name="{PREFIX}-router.service"}}' in metrics
    assert re.search(rf'node_systemd_unit_state\{{name="{PREFIX}-router\.service",state="active",type="\w+"\}} 1', metrics)


def test_prometheus_listens_on_loopback_only(host):
    svc = host.service("prometheus.service")
    assert svc.is_running and svc.is_enabled
    assert host.socket("tcp://127.0.0.1:9090").is_listening
    assert not host.socket("tcp://0.0.0.0:9090").is_listening


# --- the dashboard -------------------------------------------------------------------------
def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out += panel.get("panels", [])
        else:
            out.append(panel)
    return out


QUERIES = [(p["title"], t["refId"], t["expr"], p.get("description", "").startswith(GPU_ONLY))
           for p in panels(DASHBOARD) for t in p["targets"]]


def _regex_escape(value: str) -> str:
    # Inside a PromQL string a regex backslash is written twice.
    return "".join("\\\\" + c if c in REGEX_SPECIAL else c for c in value)


def interpolate(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"{expr}: ${name} is neither a dashboard variable nor a built-in this test knows"
        return values[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


@pytest.fixture(scope="module")
def variables(host, scrape_s) -> dict[str, str]:
    """The dashboard's variables as Grafana would fill them here: each label_values()
    query run against this Prometheus, all values taken (multi-value: a regex)."""
    values = {"__rate_interval": f"{4 * scrape_s}s", "__interval": f"{scrape_s}s"}
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "datasource":
            assert var["query"] == "prometheus"
            continue
        assert var["type"] == "query", f"variable {var['name']}: type {var['type']} unknown to this test"
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, f"variable {var['name']}: only label_values(SELECTOR, LABEL) is expanded here, got {query!r}"
        selector = interpolate(m.group(1), values)
        series = api(host, "/api/v1/series", **{"match[]": selector, "start": str(time.time() - 3600)})
        found = sorted({s[m.group(2)] for s in series if m.group(2) in s})
        assert found, f"variable {var['name']}: {selector} has no {m.group(2)} label on this Prometheus"
        if var.get("multi") or var.get("includeAll"):
            values[var["name"]] = "(" + "|".join(_regex_escape(v) for v in found) + ")"
        else:
            assert len(found) == 1, f"variable {var['name']}: several values {found}; the test would pick one"
            values[var["name"]] = found[0]
    return values


@pytest.fixture(scope="module")
def traffic(host, scrape_s) -> float:
    """Chat completions through the router (half streamed) spread over a few scrapes, so
    rate() windows hold increments; returns when the last one has been scraped."""
    # The key goes to curl on standard input (a printf builtin): no argv holds it.
    auth = (f"printf 'Authorization: Bearer %%s\\n' \"$(cat {KEY_ON_HOST})\" | curl -H @- "
            if host.file(KEY_ON_HOST).exists else "curl ")
    body = {"model": "demo-moe", "max_tokens": 8,
            "messages": [{"role": "user", "content": "Name three rivers of France, briefly."}]}
    n, pause_s = 3 * (scrape_s // 5 + 1), 2
    sent = []
    for i in range(n):
        data = json.dumps({**body, "stream": bool(i % 2)})
        result = host.run(auth + "-sS -o /dev/null -w '%%{http_code}' --max-time 30 "
                          "-H 'Content-Type: application/json' -d %s http://127.0.0.1:8000/v1/chat/completions", data)
        sent.append(result.stdout)
        time.sleep(pause_s)
    assert sent.count("200") == n, f"router answers: {sent}"
    # Every target scraped twice more: a scrape that began after the last request (a slow
    # machine delays scrapes; waiting for them, not for a fixed time, cannot come too early).
    before = {t["scrapeUrl"]: t["lastScrape"] for t in targets(host)}
    changed: dict[str, set[str]] = {url: set() for url in before}

    def scraped_twice() -> bool:
        for t in targets(host):
            if t["lastScrape"] != before.get(t["scrapeUrl"]):
                changed.setdefault(t["scrapeUrl"], set()).add(t["lastScrape"])
        return all(len(v) >= 2 for v in changed.values())

    assert wait_for(scraped_twice, timeout_s=300, every_s=1), f"targets not scraped twice since the traffic: {changed}"
    return time.time()


def query_range(host, expr: str, end: float, scrape_s: int) -> list[dict]:
    return api(host, "/api/v1/query_range", query=expr, start=str(end - 10 * scrape_s), end=str(end),
               step=str(scrape_s))["result"]


def finite(result: list[dict]) -> int:
    return sum(1 for s in result for _, v in s["values"] if math.isfinite(float(v)))


@pytest.mark.parametrize(("title", "ref", "expr", "gpu_only"), QUERIES,
                         ids=[f"{t}/{r}" for t, r, _, _ in QUERIES])
def test_panel_query_returns_data(host, variables, traffic, scrape_s, title, ref, expr, gpu_only):
    query = interpolate(expr, variables)
    result = query_range(host, query, traffic, scrape_s)
    if gpu_only:
        assert f'job="{DCGM_JOB}"' in expr, f"{title}: marked GPU only but does not read the DCGM job"
        assert not any(t["labels"]["job"] == DCGM_JOB for t in targets(host))
        assert result == [], f"{title} {ref}: GPU only, yet returned data on the stand-in node: {result[:2]}"
    else:
        assert "DCGM_" not in expr, f"{title}: reads DCGM but is not marked GPU only"
        assert finite(result) > 0, f"{title} {ref}: no data (or only NaN) for\n{query}\n{result[:3]}"


def test_the_dashboard_has_gpu_only_panels_and_data_panels():
    """The parametrized test above must not pass by having nothing to check."""
    assert sum(1 for *_, gpu in QUERIES if gpu) >= 4
    assert sum(1 for *_, gpu in QUERIES if not gpu) >= 20
