"""The PD alert rules, rendered per inventory, checked and unit-tested with the real promtool.

For every alert of the rendered rules there are series that make it fire and series that
must not (a half-open circuit, a restart that stays one restart, a KV speed above the
floor, ...). The cases are built here from the plan (job names, thresholds, ports), written
as a promtool test file and run with `promtool test rules`. A rule without a firing case
fails the test, so a rule that can never fire cannot slip in.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pdnode.core.plan import monitoring
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan
from promplans import ROOT, plan_of, promtool

# the router package's too: smg (the default) and sglang-router export the same smg_* names
# (tests/verify/test_router_metric_names.py scrapes both), so the rules must hold for both
INVENTORIES = ["demo", "gpu01", "demo+sglang-router"]
RUNBOOK = ROOT / "docs" / "runbooks" / "alerts.md"


def rules_of(plan: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(monitoring.render_alert_rules(plan))


def all_rules(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"]}


# --- the cases ---------------------------------------------------------------------------
def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def minutes(duration: str) -> int:
    """A rule's `for:` ("1m", "90s") in whole minutes, rounded up."""
    m = re.fullmatch(r"(\d+)([sm])", duration)
    assert m, duration
    seconds = int(m.group(1)) * (60 if m.group(2) == "m" else 1)
    return -(-seconds // 60)


def cases(plan: dict[str, Any], rules: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per promtool test group: alert, input series, and per evaluation time the
    label sets expected to fire (an empty list: must not fire)."""
    jobs = monitoring.SCRAPE_JOBS
    ports = plan["ports"]
    inst = {
        "prefill": f"127.0.0.1:{ports['prefill-0.port']}",
        "decode": f"127.0.0.1:{ports['decode-0.port']}",
        "router": f"127.0.0.1:{ports['router.metrics_port']}",
        "node": "127.0.0.1:9100",
        "dcgm": "127.0.0.1:9400",
    }
    target = {role: {"job": jobs[role], "instance": inst[role]} for role in jobs}
    # Scheduler-level series carry rank labels (standin/metrics.py); the rules sum them away.
    rank = {"model_name": "m", "engine_type": "prefill", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    thresholds = plan["settings"]["pdnode_verify_thresholds"]
    units = {f"unit_{role}": plan["services"][f"{role}-0"]["unit"] for role in ("prefill", "decode")}
    prefix = plan["install"]["prefix"]
    out: list[dict[str, Any]] = []

    def case(alert: str, name: str, input_series: list[dict[str, str]], evals: list[tuple[str, list[dict]]],
             value: str | None = None) -> None:
        out.append({"alert": alert, "name": name, "input_series": input_series, "evals": evals, "value": value})

    # Counters that must fire on an increase and stop once the counter stays steady.
    for alert, metric, role in [
        ("PdBootstrapFailures", "sglang:num_bootstrap_failed_reqs_total", "prefill"),
        ("PdTransferFailures", "sglang:num_transfer_failed_reqs_total", "decode"),
    ]:
        s = series(metric, {**target[role], **rank}, "0x10 1x30")
        case(alert, "one failure fires, then a steady counter clears after the 5m window", [s],
             [("13m", [target[role]]), ("25m", [])])
        case(alert, "a counter that stays 0 does not fire",
             [series(metric, {**target[role], **rank}, "0x30")], [("20m", [])])
    s = series("sglang:num_prefill_retries_total", {**target["prefill"], **rank}, "0x10 1x30")
    case("PdPrefillRetries", "a retry fires after 5m, steady again clears after the 10m window", [s],
         [("13m", []), ("18m", [target["prefill"]]), ("35m", [])])

    if "kv_transfer_speed_min_gb_s" in thresholds:
        floor = float(thresholds["kv_transfer_speed_min_gb_s"])
        def kv(speed: float | None) -> list[dict[str, str]]:
            # One transfer a minute at `speed` GB/s (histogram sum and count); None: idle.
            labels = {**target["prefill"], **rank}
            per_min = "0x40" if speed is None else f"0+{speed:g}x40"
            count = "0x40" if speed is None else "0+1x40"
            return [series("sglang:kv_transfer_speed_gb_s_sum", labels, per_min),
                    series("sglang:kv_transfer_speed_gb_s_count", labels, count)]
        case("PdKvTransferSlow", "half the floor for 10m fires", kv(floor / 2),
             [("8m", []), ("20m", [target["prefill"]])])
        case("PdKvTransferSlow", "twice the floor does not fire", kv(floor * 2), [("20m", [])])
        case("PdKvTransferSlow", "no transfers (0/0) does not fire", kv(None), [("20m", [])])

    for alert, metric, key in [
        ("PdTtftP99High", "sglang:time_to_first_token_seconds_bucket", "ttft_p99_max_s"),
        ("PdItlP99High", "sglang:inter_token_latency_seconds_bucket", "itl_p99_max_s"),
    ]:
        if key not in thresholds:
            continue
        limit = float(thresholds[key])
        labels = {**target["decode"], "model_name": "m", "engine_type": "decode"}
        def hist(slow: bool, metric: str = metric, limit: float = limit,
                 labels: dict[str, str] = labels) -> list[dict[str, str]]:
            # 10 observations a minute, all at most limit/4 (fast) or in (limit/4, 4*limit].
            return [series(metric, {**labels, "le": f"{limit / 4:g}"}, "0x30" if slow else "0+10x30"),
                    series(metric, {**labels, "le": f"{limit * 4:g}"}, "0+10x30"),
                    series(metric, {**labels, "le": "+Inf"}, "0+10x30")]
        case(alert, "p99 near 4x the target for 10m fires", hist(True),
             [("5m", []), ("20m", [target["decode"]])])
        case(alert, "p99 at a quarter of the target does not fire", hist(False), [("20m", [])])

    q = {**target["decode"], **rank, "engine_type": "decode"}
    case("PdQueueGrowing", "a queue growing one request a minute fires after 10m",
         [series("sglang:num_queue_reqs", q, "0+1x40")], [("5m", []), ("20m", [target["decode"]])])
    case("PdQueueGrowing", "a long but steady queue does not fire",
         [series("sglang:num_queue_reqs", q, "5x40")], [("20m", [])])
    case("PdQueueGrowing", "an empty queue does not fire",
         [series("sglang:num_queue_reqs", q, "0x40")], [("20m", [])])

    worker = {**target["router"], "worker": f"http://{inst['prefill']}"}
    hold = minutes(rules["PdCircuitOpen"]["for"])
    case("PdCircuitOpen", "open (1) for longer than the hold fires",
         [series("smg_worker_cb_state", worker, "0 0 1x20")], [(f"{hold + 3}m", [worker])])
    case("PdCircuitOpen", "half-open (2) does not fire",
         [series("smg_worker_cb_state", worker, "0 0 2x20")], [(f"{hold + 3}m", [])])
    case("PdCircuitOpen", "open for one sample, then closed, does not fire",
         [series("smg_worker_cb_state", worker, "0 0 1 0x20")], [(f"{hold + 3}m", [])])
    case("PdWorkerUnhealthy", "unhealthy for 2m fires",
         [series("smg_worker_health", worker, "1 1 0x10")], [("3m", []), ("6m", [worker])])
    case("PdWorkerUnhealthy", "one failed check, then healthy, does not fire",
         [series("smg_worker_health", worker, "1 1 0 1x10")], [("6m", [])])

    opened = {**worker, "from": "closed", "to": "open"}
    fired = {k: v for k, v in opened.items() if k not in ("from", "to")}
    case("PdWorkerFailing", "a breaker opened once fires for 15 minutes, then clears",
         [series("smg_worker_cb_transitions_total", opened, "0x5 1x40")], [("4m", []), ("8m", [fired]), ("25m", [])])
    case("PdWorkerFailing", "a breaker that half-opens and closes again (to=closed) does not fire",
         [series("smg_worker_cb_transitions_total", {**opened, "from": "half_open", "to": "closed"}, "0x5 1x40"),
          series("smg_worker_cb_transitions_total", opened, "0x45")], [("8m", [])])

    if "PdRouterWorkersMissing" in rules:
        want = {role: len(plan["services"]["router"]["args"][role]) for role in ("prefill", "decode")}
        pool = {role: {**target["router"], "worker_type": role, "connection_mode": "http", "model": "m"}
                for role in want}
        missing = {**target["router"], "worker_type": "decode"}
        case("PdRouterWorkersMissing", "a decode gone from the router's list for 5m fires, back again clears",
             [series("smg_worker_pool_size", pool["prefill"], f"{want['prefill']}x30"),
              series("smg_worker_pool_size", pool["decode"], f"{want['decode']}x5 {want['decode'] - 1}x15 {want['decode']}x10")],
             [("8m", []), ("14m", [missing]), ("25m", [])], value=str(want["decode"] - 1))
        case("PdRouterWorkersMissing", "a drain that lists one fewer for 3m does not fire",
             [series("smg_worker_pool_size", pool["prefill"], f"{want['prefill'] - 1}x3 {want['prefill']}x20"),
              series("smg_worker_pool_size", pool["decode"], f"{want['decode']}x25")], [("4m", []), ("10m", [])])
        case("PdRouterWorkersMissing", "the plan's counts do not fire",
             [series("smg_worker_pool_size", pool[role], f"{want[role]}x20") for role in want], [("15m", [])])

    if "PdPairFailing" in rules:
        pair = {**target["node"], "prefill": "prefill-0", "decode": "decode-0"}
        probes = minutes(rules["PdPairFailing"]["for"])  # three probes of the plan's interval
        case("PdPairFailing", "a pair failing its probes fires, served again clears",
             [series("pdnode_pair_probe_success", pair, f"1x5 0x{probes + 5} 1x10")],
             [("5m", []), (f"{6 + probes}m", [pair]), (f"{probes + 12}m", [])])
        case("PdPairFailing", "fewer failed probes in a row than the rule's `for` do not fire",
             [series("pdnode_pair_probe_success", pair, f"1x5 0x{probes - 2} 1x20")], [(f"{probes + 6}m", [])])
        case("PdPairFailing", "a pair not probed (an engine down: no success series) does not fire",
             [series("pdnode_pair_probe_skipped", pair, "1x20")], [("15m", [])])
        probe = monitoring.pair_probe(plan)
        stale_min = -(-(3 * probe["interval_s"] + probe["spec"]["timeout_s"]) // 60)
        ran = {**target["node"]}
        case("PdPairProbeStale", "a probe that stopped writing fires after its staleness and 5m",
             [series("pdnode_pair_probe_last_run_timestamp_seconds", ran, "60+60x9 600x40"),
              series("up", target["node"], "1x50")],
             [("12m", []), (f"{11 + stale_min + 6}m", [target["node"]])])
        case("PdPairProbeStale", "a node exporter without the probe's metric for 5m fires",
             [series("up", target["node"], "1x20")], [("3m", []), ("8m", [target["node"]])])
        case("PdPairProbeStale", "a probe writing every minute does not fire",
             [series("pdnode_pair_probe_last_run_timestamp_seconds", ran, "0+60x40"),
              series("up", target["node"], "1x40")], [("30m", [])])

    unit = {**target["node"], "name": units["unit_decode"]}
    case("PdServiceRestarting", "one automatic restart fires, steady again clears after 15m",
         [series("node_systemd_service_restart_total", unit, "0x10 1x40")], [("13m", [unit]), ("40m", [])])
    case("PdServiceRestarting", "another unit's restart (not the prefix) does not fire",
         [series("node_systemd_service_restart_total", {**target["node"], "name": "cron.service"}, "0x10 1x40")],
         [("13m", [])])
    state = {**target["node"], "name": units["unit_prefill"], "state": "active", "type": "notify"}
    case("PdServiceNotActive", "not active for 10m fires",
         [series("node_systemd_unit_state", state, "1 1 0x20")], [("8m", []), ("15m", [state])])
    case("PdServiceNotActive", "activating for 5m (model load), then active, does not fire",
         [series("node_systemd_unit_state", state, "1 1 0x5 1x15")], [("15m", [])])
    case("PdServiceNotActive", "a unit of no PD service does not fire",
         [series("node_systemd_unit_state", {**state, "name": f"{prefix}-other.service"}, "0x20")], [("15m", [])])

    if monitoring.gpu_host(plan):
        gpu = {**target["dcgm"], "gpu": "3", "device": "nvidia3"}
        case("PdGpuXid", "a new Xid fires; the sticky last value stops after 15m",
             [series("DCGM_FI_DEV_XID_ERRORS", gpu, "0x20 79x40")], [("25m", [gpu]), ("45m", [])], value="79")
        xid = {**gpu, "err_code": "79"}
        case("PdGpuXid", "a new Xid series (err_code label) fires",
             [series("DCGM_FI_DEV_XID_ERRORS", xid, "_x20 79x40")], [("25m", [xid])], value="79")
        case("PdGpuXid", "no Xid (0) does not fire",
             [series("DCGM_FI_DEV_XID_ERRORS", gpu, "0x40")], [("25m", [])])
        case("PdGpuEccError", "a double-bit ECC error fires, then clears after 15m",
             [series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu, "0x10 1x40")], [("13m", [gpu]), ("40m", [])])
        case("PdGpuEccError", "an uncorrectable row remap fires",
             [series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu, "0x10 1x40")], [("13m", [gpu])])
        case("PdGpuEccError", "a failed row remap fires",
             [series("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu, "0x5 1x20")], [("10m", [gpu])])
        case("PdGpuEccError", "error counters that stay 0 do not fire",
             [series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu, "0x40"),
              series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu, "0x40"),
              series("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu, "0x40")], [("20m", [])])
        case("PdGpuMetricsMissing", "a DCGM exporter without the ECC field fires",
             [series("up", target["dcgm"], "1x20"), series("DCGM_FI_DEV_XID_ERRORS", gpu, "0x20")],
             [("15m", [target["dcgm"]])])
        case("PdGpuMetricsMissing", "a DCGM exporter with the ECC field does not fire",
             [series("up", target["dcgm"], "1x20"), series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu, "0x20")],
             [("15m", [])])

    scraped = monitoring.scrape_jobs(plan)
    case("PdTargetDown", "every scrape job's target down for 2m fires",
         [series("up", target[role], "1 1 0x10") for role in scraped],
         [("3m", []), ("6m", [target[role] for role in scraped])])
    case("PdTargetDown", "targets up, and a job that is not ours down, do not fire",
         [*(series("up", target[role], "1x10") for role in scraped),
          series("up", {"job": "other", "instance": "127.0.0.1:1"}, "0x10")], [("6m", [])])

    worker = {"worker": plan["services"]["prefill-0"]["url"]}
    case("PdMetricsMissing", "an engine without its PD counters, a router without worker health and a node "
         "exporter without restart counts fire",
         [series("up", target["prefill"], "1x20"), series("up", target["node"], "1x20"),
          series("up", target["router"], "1x20"),
          series("sglang:num_requests_total", {**target["prefill"], "model_name": "m"}, "0x20"),
          series("smg_router_requests_total", {**target["router"], "endpoint": "chat"}, "0x20"),
          series("node_systemd_service_restart_total", {**target["node"], "name": "cron.service"}, "0x20")],
         [("15m", [target["prefill"], target["router"], target["node"]])])
    case("PdMetricsMissing", "the counters present do not fire",
         [series("up", target["prefill"], "1x20"), series("up", target["node"], "1x20"),
          series("up", target["router"], "1x20"),
          series("sglang:num_bootstrap_failed_reqs_total", {**target["prefill"], **rank}, "0x20"),
          series("smg_worker_health", {**target["router"], **worker}, "1x20"),
          series("node_systemd_service_restart_total", {**target["node"], "name": units["unit_prefill"]}, "0x20")],
         [("15m", [])])
    return out


# --- promtool test file --------------------------------------------------------------------
TEMPLATE_FIELD = re.compile(r"\{\{\s*(.*?)\s*\}\}")


def expand(text: str, labels: dict[str, str], value: str | None) -> str:
    """The annotation as Prometheus will write it, for promtool's exact comparison
    (only `$labels.NAME` and `$value` are used by the rules)."""
    def one(m: re.Match[str]) -> str:
        field = m.group(1)
        if field.startswith("$labels."):
            name = field[len("$labels."):]
            assert name in labels, f"annotation uses $labels.{name}, not a label of the alert {labels}"
            return labels[name]
        assert field == "$value" and value is not None, f"annotation field {{{{ {field} }}}} unknown to this test"
        return value
    return TEMPLATE_FIELD.sub(one, text)


def promtool_tests(case_list: list[dict[str, Any]], rules: dict[str, dict[str, Any]], rule_file: str) -> dict:
    tests = []
    for c in case_list:
        rule = rules[c["alert"]]
        alert_tests = []
        for eval_time, fired in c["evals"]:
            exp = [{"exp_labels": {**labels, **rule["labels"]},
                    "exp_annotations": {k: expand(v, labels, c["value"]) for k, v in rule["annotations"].items()}}
                   for labels in fired]
            alert_tests.append({"eval_time": eval_time, "alertname": c["alert"], "exp_alerts": exp})
        tests.append({"name": f"{c['alert']}: {c['name']}", "interval": "1m",
                      "input_series": copy.deepcopy(c["input_series"]), "alert_rule_test": alert_tests})
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *argv], cwd=cwd, capture_output=True, text=True, timeout=120)


# --- the tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("inventory", INVENTORIES)
def test_rules_pass_promtool_check(inventory, tmp_path):
    (tmp_path / "rules.yml").write_text(monitoring.render_alert_rules(plan_of(inventory)))
    done = run("check", "rules", "rules.yml", cwd=tmp_path)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_every_alert_fires_and_holds_still_in_promtool(inventory, tmp_path):
    plan = plan_of(inventory)
    rules = all_rules(rules_of(plan))
    case_list = cases(plan, rules)
    fires = {c["alert"] for c in case_list for _, fired in c["evals"] if fired}
    quiet = {c["alert"] for c in case_list for _, fired in c["evals"] if not fired}
    assert not set(rules) - fires, f"alerts with no case where they fire: {sorted(set(rules) - fires)}"
    assert not set(rules) - quiet, f"alerts with no case where they must not fire: {sorted(set(rules) - quiet)}"
    assert not {c["alert"] for c in case_list} - set(rules), "cases for alerts the rules do not have"

    (tmp_path / "rules.yml").write_text(monitoring.render_alert_rules(plan))
    test_file = promtool_tests(case_list, rules, "rules.yml")
    (tmp_path / "alerts.test.yml").write_text(yaml.safe_dump(test_file, sort_keys=False))
    # The file handed to promtool names every alert with a non-empty exp_alerts.
    written = yaml.safe_load((tmp_path / "alerts.test.yml").read_text())
    named = {t["alertname"] for g in written["tests"] for t in g["alert_rule_test"] if t["exp_alerts"]}
    assert named == set(rules)

    done = run("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_a_rule_that_cannot_fire_fails_promtool(tmp_path):
    """The harness can fail: a firing case against a rule whose threshold is out of reach."""
    plan = plan_of("demo")
    rendered = rules_of(plan)
    for group in rendered["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "PdQueueGrowing":
                rule["expr"] = rule["expr"].replace("> 0\nand", "> 1e9 and").replace(") > 0 and", ") > 1e9 and")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rendered))
    rules = all_rules(rendered)
    assert "1e9" in rules["PdQueueGrowing"]["expr"]
    queue = [c for c in cases(plan, rules) if c["alert"] == "PdQueueGrowing"]
    (tmp_path / "alerts.test.yml").write_text(yaml.safe_dump(promtool_tests(queue, rules, "rules.yml")))
    done = run("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr, done.stdout + done.stderr


# The alerts docs/field-failures.md claims (rows 2, 4, 11, 17): each one broken.
CATALOGUED_ALERTS = ("PdWorkerFailing", "PdPairFailing", "PdTransferFailures", "PdRouterWorkersMissing",
                     "PdServiceRestarting")


@pytest.mark.parametrize("alert", CATALOGUED_ALERTS)
def test_a_catalogued_alert_that_never_fires_fails_its_promtool_cases(alert, tmp_path):
    """The catalogue's alert removed (its expression one that never fires): the cases that
    prove it fire now fail in promtool, so the row's claim rests on this rule."""
    plan = plan_of("demo")
    rendered = rules_of(plan)
    broken = [r for g in rendered["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert len(broken) == 1, f"{alert}: not one rule of that name"
    broken[0]["expr"] = "vector(0) > 1"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rendered))
    rules = all_rules(rendered)
    own = [c for c in cases(plan, rules) if c["alert"] == alert]
    assert any(fired for c in own for _, fired in c["evals"]), f"{alert}: no case where it fires"
    (tmp_path / "alerts.test.yml").write_text(yaml.safe_dump(promtool_tests(own, rules, "rules.yml")))
    done = run("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_every_alert_has_for_severity_instance_and_an_existing_runbook_section(inventory):
    rules = all_rules(rules_of(plan_of(inventory)))
    headings = {m.group(1).lower() for m in re.finditer(r"^## (\w+)\s*$", RUNBOOK.read_text(), re.MULTILINE)}
    bad = []
    for name, rule in rules.items():
        ann = rule["annotations"]
        if not rule.get("for"):
            bad.append(f"{name}: no `for:`")
        if rule["labels"].get("severity") not in ("critical", "warning"):
            bad.append(f"{name}: severity {rule['labels'].get('severity')!r}")
        if "$labels.instance" not in ann["summary"] + ann["description"]:
            bad.append(f"{name}: neither summary nor description names the instance")
        path, _, anchor = ann["runbook"].partition("#")
        if not (ROOT / path).is_file() or anchor != name.lower() or anchor not in headings:
            bad.append(f"{name}: runbook {ann['runbook']} is not a section `## {name}` of {RUNBOOK.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_thresholds_unset_render_no_latency_rules_and_the_paths_kv_floor(tmp_path):
    hv = load_inventory(ROOT / "inventories" / "gpu01")
    variables = {**hv.variables, "pdnode_verify_thresholds": {}}
    plan = build_plan(variables, hv.host).as_dict()
    text = monitoring.render_alert_rules(plan)
    rules = all_rules(yaml.safe_load(text))
    assert not set(rules) & {"PdTtftP99High", "PdItlP99High"}
    assert "PdBootstrapFailures" in rules
    # real engines: the KV floor is the path's (pdnode.core.plan.kv_path.floor_gb_s), never absent
    floor = plan["cluster"]["kv"]["floor_gb_s"]
    assert plan["cluster"]["kv"]["floor_from_path"] and floor > 0
    assert rules["PdKvTransferSlow"]["expr"].rstrip().endswith(f"< {float(floor):g}")
    demo = load_inventory(ROOT / "inventories" / "demo")
    sim = build_plan({**demo.variables, "pdnode_verify_thresholds": {}}, demo.host).as_dict()
    assert "PdKvTransferSlow" not in all_rules(yaml.safe_load(monitoring.render_alert_rules(sim)))
    (tmp_path / "rules.yml").write_text(text)
    done = run("check", "rules", "rules.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_gpu_rules_and_dcgm_job_only_on_a_real_engine_host():
    demo, gpu01 = plan_of("demo"), plan_of("gpu01")
    assert "dcgm" not in monitoring.scrape_jobs(demo) and "dcgm" in monitoring.scrape_jobs(gpu01)
    gpu_alerts = {"PdGpuXid", "PdGpuEccError", "PdGpuMetricsMissing"}
    assert not gpu_alerts & set(all_rules(rules_of(demo)))
    assert gpu_alerts <= set(all_rules(rules_of(gpu01)))


def test_thresholds_come_from_the_plan():
    plan = plan_of("gpu01")
    rules = all_rules(rules_of(plan))
    t = plan["settings"]["pdnode_verify_thresholds"]
    assert rules["PdTtftP99High"]["expr"].rstrip().endswith(f"> {float(t['ttft_p99_max_s']):g}")
    assert rules["PdKvTransferSlow"]["expr"].rstrip().endswith(f"< {float(t['kv_transfer_speed_min_gb_s']):g}")
    assert f'name=~"{plan["install"]["prefix"]}-.*"' in rules["PdServiceRestarting"]["expr"]


def test_unknown_placeholder_is_an_error(tmp_path):
    bad = tmp_path / "t.yml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up{job=\"[[no_such]]\"} == 0\n")
    with pytest.raises(monitoring.TemplateError, match=r"\[\[no_such\]\]"):
        monitoring.render_alert_rules(plan_of("demo"), bad)


def test_cli_renders_alerts():
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "pdnode"), "render", str(ROOT / "inventories" / "demo"),
                           "--role", "alerts"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == monitoring.render_alert_rules(plan_of("demo"))
