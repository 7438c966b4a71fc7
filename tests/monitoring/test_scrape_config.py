"""prometheus.yml rendered from the plan (pdnode.core.plan.monitoring.scrape_config), checked with the
real `promtool check config`, and what the dashboard and the alert rules read from it.

Plans come from the repository's inventories (one instance per role, 2P1D, 1P2D; the
stand-in and the real engine), so a target per engine instance is checked against the
services the plan really has; hostile values are planted into copies of those plans.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from typing import Any

import pytest
from pdnode.core.plan import monitoring
from promplans import ROOT, plan_of, promtool

INVENTORIES = ["demo", "gpu01", "gpu01-2p1d", "gpu01-1p2d"]
DASHBOARD = ROOT / "templates" / "grafana" / "pdnode-dashboard.json"


def jobs_of(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in config["scrape_configs"]}


def targets_of(job: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    return [(t, sc["labels"]) for sc in job["static_configs"] for t in sc["targets"]]


def host_port(url: str) -> str:
    """http://H:P/... -> H:P, spelled out here rather than by the code under test."""
    return url.split("://", 1)[1].split("/", 1)[0]


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_one_target_per_engine_instance_the_router_and_the_exporters(inventory):
    plan = plan_of(inventory)
    config = monitoring.scrape_config(plan)
    jobs = jobs_of(config)
    services = plan["services"]
    for role in ("prefill", "decode"):
        job = jobs[monitoring.SCRAPE_JOBS[role]]
        want = sorted((host_port(s["url"]), s["id"], s["unit"]) for s in services.values() if s["role"] == role)
        got = sorted((t, labels["pdnode_service"], labels["pdnode_unit"]) for t, labels in targets_of(job))
        assert got == want and want, role
        assert job["metrics_path"] == "/metrics" and job["scheme"] == "http"
    router = jobs[monitoring.SCRAPE_JOBS["router"]]
    assert [t for t, _ in targets_of(router)] == [host_port(services["router"]["metrics_url"])]
    assert router["metrics_path"] == "/" + services["router"]["metrics_url"].split("/", 3)[3]
    assert [t for t, _ in targets_of(jobs["pdnode_node_exporter"])] == ["127.0.0.1:9100"]
    # Every target says which host it belongs to (the dashboard's $host).
    assert {labels["pdnode_host"] for job in jobs.values() for _, labels in targets_of(job)} == {plan["host"]}
    assert config["rule_files"] == [monitoring.RULES_FILE]


def test_dcgm_job_only_where_the_engine_is_real():
    demo, gpu = monitoring.scrape_config(plan_of("demo")), monitoring.scrape_config(plan_of("gpu01"))
    assert "pdnode_dcgm_exporter" not in jobs_of(demo)
    assert [t for t, _ in targets_of(jobs_of(gpu)["pdnode_dcgm_exporter"])] == ["127.0.0.1:9400"]


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_rendered_config_and_rules_pass_promtool_check_config(inventory, tmp_path):
    plan = plan_of(inventory)
    rules = tmp_path / "rules.yml"
    rules.write_text(monitoring.render_alert_rules(plan))
    (tmp_path / "prometheus.yml").write_text(monitoring.render_scrape_config(plan, rules_file=str(rules)))
    done = subprocess.run([promtool(), "check", "config", "prometheus.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr and "rules found" in done.stdout + done.stderr


def test_promtool_refuses_a_config_whose_rules_file_is_missing(tmp_path):
    """The check the role runs before replacing the file can fail (validate: promtool check config)."""
    text = monitoring.render_scrape_config(plan_of("demo"), rules_file=str(tmp_path / "absent.yml"))
    (tmp_path / "prometheus.yml").write_text(text)
    done = subprocess.run([promtool(), "check", "config", "prometheus.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "absent.yml" in done.stdout + done.stderr


def test_every_job_the_alert_rules_select_is_scraped():
    for inventory in ("demo", "gpu01"):
        plan = plan_of(inventory)
        scraped = set(jobs_of(monitoring.scrape_config(plan)))
        rules = monitoring.render_alert_rules(plan)
        named = set()
        for m in re.finditer(r'job(=~?)\\?"([^"\\]+)\\?"', rules):
            named |= set(m.group(2).split("|"))
        assert named and named <= scraped, (inventory, sorted(named - scraped))


def test_a_listener_on_every_address_is_scraped_over_loopback():
    plan = copy.deepcopy(plan_of("demo"))
    plan["services"]["prefill-0"]["url"] = "http://0.0.0.0:30000"
    plan["services"]["router"]["metrics_url"] = "http://[::]:29000/metrics"
    jobs = jobs_of(monitoring.scrape_config(plan))
    assert [t for t, _ in targets_of(jobs["pdnode_prefill"])] == ["127.0.0.1:30000"]
    assert [t for t, _ in targets_of(jobs["pdnode_router"])] == ["[::1]:29000"]


@pytest.mark.parametrize(("where", "value", "says"), [
    (("services", "prefill-0", "url"), "http://127.0.0.1:30000\n  - job_name: evil", "services.prefill-0.url"),
    (("services", "prefill-0", "url"), "http://127.0.0.1:300\n00", "services.prefill-0.url"),
    (("services", "decode-0", "url"), "ftp://127.0.0.1:30001", "services.decode-0.url"),
    (("services", "decode-0", "url"), "http://127.0.0.1", "names no host and port"),
    (("services", "router", "metrics_url"), "http://127.0.0.1:29000/metrics?x=1", "services.router.metrics_url"),
    (("services", "router", "metrics_url"), "http://127.0.0.1:99999/metrics", "services.router.metrics_url"),
])
def test_a_bad_url_in_the_plan_is_one_line_naming_the_field(where, value, says):
    plan = copy.deepcopy(plan_of("demo"))
    plan[where[0]][where[1]][where[2]] = value
    with pytest.raises(monitoring.ScrapeConfigError) as err:
        monitoring.scrape_config(plan)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"node_exporter": "0.0.0.0:9100 --web.config.file=/x"}, "monitoring_node_exporter_listen_address"),
    ({"node_exporter": "127.0.0.1:70000"}, "out of range"),
    ({"scrape_interval": "15 s"}, "monitoring_scrape_interval"),
    ({"rules_file": "rules.yml"}, "rules file"),
])
def test_a_bad_role_value_is_refused(kwargs, says):
    with pytest.raises(monitoring.ScrapeConfigError, match=says):
        monitoring.scrape_config(plan_of("gpu01"), **kwargs)


def test_dcgm_address_is_checked_on_gpu_hosts():
    with pytest.raises(monitoring.ScrapeConfigError, match="monitoring_dcgm_exporter_listen_address"):
        monitoring.scrape_config(plan_of("gpu01"), dcgm_exporter="nowhere")


# --- the DCGM exporter's counters ----------------------------------------------------------
EXPORTER_CSV = """\
# Format
# DCGM FIELD, Prometheus metric type, help message
DCGM_FI_DEV_XID_ERRORS,            gauge,   Value of the last XID error encountered.
# DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.
# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
"""


def test_dcgm_counters_switch_on_exactly_the_fields_the_rules_need():
    out = monitoring.dcgm_counters(EXPORTER_CSV)
    live = [line.split(",")[0].strip() for line in out.splitlines() if line and not line.startswith("#")]
    assert live == ["DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]
    assert "# DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" in out
    assert monitoring.dcgm_counters(out).count("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,") == 1  # stable when re-applied


def test_dcgm_counters_refuse_an_exporter_without_the_field():
    with pytest.raises(monitoring.ScrapeConfigError, match="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"):
        monitoring.dcgm_counters(EXPORTER_CSV.replace("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_OTHER"))


# --- the dashboard reads what the scrape configuration writes -----------------------------
def dashboard_texts() -> list[str]:
    data = json.loads(DASHBOARD.read_text())
    panels = [p for top in data["panels"] for p in [top, *top.get("panels", [])]]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    variables = [v["query"]["query"] for v in data["templating"]["list"] if v["type"] == "query"]
    return exprs + variables


def test_dashboard_jobs_and_labels_are_the_ones_scraped():
    gpu = monitoring.scrape_config(plan_of("gpu01"))
    scraped_jobs = set(jobs_of(gpu))
    labels = {k for job in gpu["scrape_configs"] for _, lab in targets_of(job) for k in lab}
    for text in dashboard_texts():
        for m in re.finditer(r'job=~?"([^"]+)"', text):
            assert set(m.group(1).split("|")) <= scraped_jobs, text
        for name in re.findall(r"\b(pdnode_\w+)\s*(?:=|!=|=~)", text):
            assert name in labels, f"{name} is not a target label: {text}"


def test_dashboard_gpu_panels_are_marked_and_read_only_the_dcgm_job():
    data = json.loads(DASHBOARD.read_text())
    panels = [p for top in data["panels"] for p in [top, *top.get("panels", [])] if p["type"] != "row"]
    for p in panels:
        gpu = p.get("description", "").startswith("GPU only:")
        for t in p["targets"]:
            assert ("DCGM_" in t["expr"]) == gpu, p["title"]
            assert ('job="pdnode_dcgm_exporter"' in t["expr"]) == gpu, p["title"]
