"""Report schema, exit codes, and the two entry points (pdnode verify INVENTORY and
python -m pdnode.verify --plan) on a node that cannot be reached or bad arguments."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from conftest import minimal_plan

from pdnode.verify import SCHEMA
from pdnode.verify.checks import FAIL, NA, PASS, SKIP, WARN, CheckResult, Result, all_checks, gate
from pdnode.verify.config import build_run
from pdnode.verify.engine import Report, verify
from pdnode.verify.report import summary_lines, to_json, to_table

REPO = Path(__file__).resolve().parents[2]
CHECK_KEYS = {"id", "title", "status", "evidence", "hint", "duration_s"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report_with(*statuses: str) -> Report:
    r = Report(host="h", targets={"router_url": "http://x", "base_url": "http://x", "on_node": True},
               timeouts={"request_s": 5.0, "overall_s": 50.0})
    r.checks = [CheckResult(f"c{i}", "t", s, "ev", "hint", 0.1) for i, s in enumerate(statuses)]
    return r


def test_exit_codes():
    assert report_with(PASS, NA, PASS).exit_code == 0
    assert report_with(PASS, SKIP).exit_code == 0  # --skip-burst
    assert report_with(PASS, FAIL, SKIP).exit_code == 1
    assert report_with(PASS, WARN).exit_code == 0 and report_with(PASS, WARN).ok  # a warning never fails
    r = report_with(PASS)
    r.error = "node unreachable"
    assert r.exit_code == 2 and not r.ok


def test_json_schema_is_stable():
    d = json.loads(to_json(report_with(PASS, FAIL)))
    assert d["schema"] == SCHEMA == "pdnode.verify/1"
    assert {"schema", "ok", "exit_code", "error", "host", "started_at", "duration_s", "timeouts", "targets",
            "summary", "checks", "failures", "measurements"} <= set(d)
    assert all(set(c) == CHECK_KEYS for c in d["checks"])
    assert d["summary"] == {"PASS": 1, "WARN": 0, "FAIL": 1, "SKIP": 0, "N/A": 0}
    assert d["ok"] is False and d["exit_code"] == 1 and d["warnings"] == []


def test_warning_status_in_the_schema_and_the_table():
    r = report_with(PASS, WARN)
    d = json.loads(to_json(r))
    assert d["summary"]["WARN"] == 1 and d["ok"] is True and d["failures"] == []
    assert d["warnings"] == ["c1: ev -- hint: hint"]
    assert d["checks"][1]["status"] == "WARN" and set(d["checks"][1]) == CHECK_KEYS
    text = to_table(r, width=100)
    assert "hint: hint" in text and text.splitlines()[-1].startswith("OK, WITH WARNINGS: 2 passed (1 with a warning)")


def test_table_and_summary_lines():
    r = report_with(PASS, FAIL)
    text = to_table(r, width=100)
    assert "c1" in text and "FAIL" in text and "hint: hint" in text and "exit code 1" in text
    assert "5 s per request, 50 s overall" in text
    assert summary_lines(r) == ["c1: ev -- hint: hint"] == json.loads(to_json(r))["failures"]


def test_gate_skips_and_propagates_the_cause():
    checks = {c.id: c for c in all_checks(build_run(minimal_plan(), env={}, on_node=True))}
    res = {"bootstrap.prefill-0": CheckResult("bootstrap.prefill-0", "", FAIL, "", "", 0),
           "prefill-0": CheckResult("prefill-0", "", PASS, "", "", 0),
           "decode-0": CheckResult("decode-0", "", PASS, "", "", 0), "router": CheckResult("router", "", PASS, "", "", 0),
           "access": CheckResult("access", "", SKIP, "", "", 0, "bootstrap.prefill-0 failed")}
    g = gate(checks["completion"], res)
    assert g.status == SKIP and g.evidence == "skipped: because bootstrap.prefill-0 failed"
    res["completion"] = CheckResult("completion", "", SKIP, "", "", 0, "bootstrap.prefill-0 failed")
    assert gate(checks["burst"], res).evidence == "skipped: because bootstrap.prefill-0 failed"
    # the instance's own proof needs its bootstrap server, not the router's completions
    assert gate(checks["disaggregation.prefill-0"], res).evidence == "skipped: because bootstrap.prefill-0 failed"
    assert gate(checks["disaggregation.decode-0"], res) is None
    res["completion"] = CheckResult("completion", "", FAIL, "", "", 0)
    assert gate(checks["disaggregation"], res) is None  # explains a failed completion
    res["router"] = CheckResult("router", "", WARN, "", "", 0)
    res["bootstrap.prefill-0"] = CheckResult("bootstrap.prefill-0", "", PASS, "", "", 0)
    res["access"] = CheckResult("access", "", PASS, "", "", 0)
    assert gate(checks["completion"], res) is None  # a warning lets dependants run
    res["decode-0"] = CheckResult("decode-0", "", NA, "remote", "", 0)
    assert gate(checks["disaggregation"], res).status == NA
    assert isinstance(gate(checks["metrics"], res), Result)


def test_unreachable_node_exits_2():
    port = free_port()
    run = build_run(minimal_plan(router_port=port), env={}, prefill_url=f"http://127.0.0.1:{free_port()}",
                    instance_urls=[f"decode-0=http://127.0.0.1:{free_port()}"],
                    bootstrap_urls=[f"http://127.0.0.1:{free_port()}"])
    rep = verify(run)
    assert rep.exit_code == 2 and "node unreachable" in rep.error and "connection refused" in rep.error
    assert all(c.status == SKIP for c in rep.checks)


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdnode.verify", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_plan_entry_unreachable_json(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(minimal_plan(router_port=free_port())))
    proc = _module("--plan", str(plan), "--json", "--timeout", "2")
    assert proc.returncode == 2, proc.stderr
    d = json.loads(proc.stdout)
    assert d["exit_code"] == 2 and d["ok"] is False and "unreachable" in d["error"]


def test_bad_arguments_exit_2(tmp_path):
    assert _module().returncode == 2  # --plan missing (argparse)
    proc = _module("--plan", str(tmp_path / "nope.json"))
    assert proc.returncode == 2 and "cannot read the plan" in proc.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(minimal_plan()))
    proc = _module("--plan", str(plan), "--timeout", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr
    proc = _module("--plan", str(plan), "--auth-template", "Bearer")
    assert proc.returncode == 2 and "{key}" in proc.stderr
    proc = _module("--plan", str(plan), "--api-key-file", str(tmp_path / "missing"), "--json")
    assert proc.returncode == 2 and "cannot read the API key file" in json.loads(proc.stdout)["error"]


def test_inventory_entry(tmp_path):
    from pdnode.commands.cli import main

    assert main(["verify", str(tmp_path / "no-inventory")]) == 2
    # the demo inventory's node is a container name that does not resolve here
    assert main(["verify", str(REPO / "inventories/demo"), "--json", "--timeout", "2"]) == 2


def test_remote_targets_are_not_applicable():
    run = build_run(minimal_plan(), node_address="192.0.2.10", env={})  # TEST-NET: never local
    assert not run.targets.on_node and run.targets.router_metrics_url is None
    assert [(i.id, i.url, i.bootstrap_url) for i in run.targets.instances] == [("prefill-0", None, None),
                                                                                ("decode-0", None, None)]
    assert run.targets.router_url == "http://192.0.2.10:1"


def test_on_the_node_the_instances_are_named_as_its_record_names_them(tmp_path, monkeypatch):
    """After 2P2D -> 3P1D the decode on GPUs 6-7 stays decode-1 (the node's record), though
    it is the first decode of the inventory: `pdnode verify` on the node reads the record
    and checks decode-1 at its own port, not a decode-0 that does not run."""
    import shutil

    from pdnode.commands.cli import main
    from pdnode.core.inventory.read import inventory_variables
    from pdnode.core.plan.build import build_plan
    from pdnode.verify import cli

    def inventory(name, prefills, decodes):
        inv = tmp_path / name
        (inv / "host_vars").mkdir(parents=True)
        shutil.copytree(REPO / "inventories" / "demo" / "group_vars", inv / "group_vars")
        (inv / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"pdnode-demo": {"ansible_connection": "local"}}}}))
        dp = {"attn_dp_size": 2, "ep_size": 2, "moe_dense_tp_size": 1, "enable_dp_lm_head": True}
        (inv / "host_vars" / "pdnode-demo.yml").write_text(json.dumps(
            {"pdnode_prefill_instances": [{"gpus": g, "tp_size": 2} for g in prefills],
             "pdnode_decode_instances": [{"gpus": g, "tp_size": 2, **dp} for g in decodes]}))
        return inv

    two = inventory("2p2d", [[0, 1], [2, 3]], [[4, 5], [6, 7]])
    record = build_plan(inventory_variables(two)["pdnode-demo"], "pdnode-demo").as_dict()["change"]["converged"]
    three = inventory("3p1d", [[0, 1], [2, 3], [4, 5]], [[6, 7]])
    asked, views = [], []

    def record_at(path):
        asked.append(path)
        return json.dumps(record)

    monkeypatch.setattr(cli, "_node_record", record_at)
    monkeypatch.setattr(cli, "run_with_plan", lambda view, args, **kw: views.append(view) or 0)
    assert main(["verify", str(three)]) == 0
    assert asked == ["/var/lib/pdnode/applied/sglang-pd/layout.json"]
    assert sorted(views.pop()["cluster"]["engines"]) == ["decode-1", "prefill-0", "prefill-1", "prefill-2"]
    # without a record (or where it cannot be read) the inventory's index names
    monkeypatch.setattr(cli, "_node_record", lambda path: None)
    assert main(["verify", str(three)]) == 0
    assert sorted(views.pop()["cluster"]["engines"]) == ["decode-0", "prefill-0", "prefill-1", "prefill-2"]


def test_a_record_that_cannot_be_read_names_instances_by_their_index_and_says_why(tmp_path, capsys):
    from pdnode.verify import cli

    assert cli._node_record(str(tmp_path / "none.json")) is None and capsys.readouterr().err == ""
    assert cli._node_record(str(tmp_path)) is None  # a directory: not readable as the record
    assert "cannot read the node's record" in capsys.readouterr().err
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe")
    assert cli._node_record(str(tmp_path / "binary.json")) is None
    assert "not UTF-8 text" in capsys.readouterr().err
