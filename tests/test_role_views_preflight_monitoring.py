"""The preflight role's model probes, probe assembly and failure (pdnode.core.plan.roles.preflight)
and the monitoring role's files and read specs (pdnode.core.plan.roles.monitoring), case by case
as the roles' Jinja computed them."""

from __future__ import annotations

import hashlib
import os

from planvars import variables

from pdnode.core.plan import monitoring
from pdnode.core.plan.build import build_plan
from pdnode.core.plan.roles import monitoring as monitoring_role
from pdnode.core.plan.roles import preflight


def test_no_model_path_asks_nothing():
    assert preflight.model_probes(None) == {}


def test_the_model_path_is_quoted_for_the_shell():
    assert preflight.model_probes("/models/My Model's") == {
        "model_exists": "[ -e '/models/My Model'\"'\"'s' ] || [ -L '/models/My Model'\"'\"'s' ]",
        "model_isdir": "[ -d '/models/My Model'\"'\"'s' ] && [ ! -L '/models/My Model'\"'\"'s' ]",
        "model_config_json": "[ -e '/models/My Model'\"'\"'s/config.json' ] || [ -L '/models/My Model'\"'\"'s/config.json' ]"}
    assert preflight.model_probes("/m")["model_isdir"] == "[ -d /m ] && [ ! -L /m ]"


def test_the_model_answers_join_the_probes_and_a_missing_one_says_no():
    probes = {"machine": {"rc": 0, "stdout": "x86_64"}, "model_exists": {"rc": 0}, "model_isdir": {"rc": 1}}
    raw = preflight.raw(probes, {"skipped": True}, "/m")
    assert raw["machine"] == probes["machine"] and raw["cuda"] == {"skipped": True}
    assert raw["model"] == {"path": "/m", "exists": True, "isdir": False, "config_json": False}
    assert preflight.raw({}, None, None)["model"] == {"path": None, "exists": False, "isdir": False,
                                                       "config_json": False}


def test_the_failure_names_the_errors_and_the_warnings_only_when_asked(tmp_path):
    verdict = {"errors": ["e1", "e2"], "warnings": ["w1"]}
    facts = str(tmp_path / "x" / ".." / "gpu01.json")
    f = preflight.failure(verdict, fail_on_error=True, fail_on_warning=False, host="gpu01", facts_file=facts)
    assert f["blocking"] == ["e1", "e2"]
    assert f["message"] == f"preflight found 2 problem(s) on gpu01 (facts: {os.path.realpath(facts)}):\ne1\ne2"
    assert preflight.failure(verdict, fail_on_error=True, fail_on_warning=True, host="h",
                             facts_file=facts)["blocking"] == ["e1", "e2", "w1"]
    assert preflight.failure(verdict, fail_on_error=False, fail_on_warning=False, host="h",
                             facts_file=facts)["blocking"] == []


def test_the_monitoring_files_are_the_rendered_texts_and_their_digests():
    plan = build_plan(variables("demo")).as_dict()
    out = monitoring_role.files(plan, node_exporter="127.0.0.1:9100", dcgm_exporter="127.0.0.1:9400",
                                scrape_interval="15s", config_file="/etc/prometheus/prometheus.yml",
                                prometheus_default="P\n", node_exporter_default="N\n")
    assert out["rules"] == monitoring.render_alert_rules(plan)
    assert out["scrape_config"] == monitoring.render_scrape_config(
        plan, node_exporter="127.0.0.1:9100", dcgm_exporter="127.0.0.1:9400", scrape_interval="15s")
    rules_file = monitoring.role_facts(plan)["rules_file"]

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    assert out["state_files"] == [
        {"path": "/etc/default/prometheus", "sha256": sha("P\n"), "mode": "0644"},
        {"path": "/etc/default/prometheus-node-exporter", "sha256": sha("N\n"), "mode": "0644"},
        {"path": rules_file, "sha256": sha(out["rules"]), "mode": "0644"},
        {"path": "/etc/prometheus/prometheus.yml", "sha256": sha(out["scrape_config"]), "mode": "0644"}]
    assert out["state_directories"] == [{"path": os.path.dirname(rules_file), "mode": "0755"}]
