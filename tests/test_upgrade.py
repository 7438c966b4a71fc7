"""The upgrade's logic: the prober's tally, the release record's transitions, the report."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pdnode.core import upgrade
from pdnode.node import upgrade_probe

REPO = Path(__file__).resolve().parents[1]
OLD_VENV = "/opt/sglang-pd/venvs/sim-router-0.3.2-mooncake-0.3.13.post1-cu13-0.3.14"
NEW_VENV = "/opt/sglang-pd/venvs/sim-smg-1.13.0-mooncake-0.3.13.post1-cu13-0.3.14"


def versions(**over) -> dict:
    base = {"pdnode_sglang_version": "0.5.23", "pdnode_router_package": "sglang-router",
            "pdnode_sglang_router_version": "0.3.2", "pdnode_smg_version": "1.13.0",
            "pdnode_mooncake_version": "0.3.13.post1", "pdnode_mooncake_cuda13_version": "0.3.14"}
    return {**base, **over}


OLD = {"versions": versions(), "venv": OLD_VENV}
NEW = {"versions": versions(pdnode_router_package="smg"), "venv": NEW_VENV}


# --- the prober's tally -----------------------------------------------------------------

def test_tally_longest_gap_spans_failures_between_two_successes():
    t = upgrade_probe.Tally(100.0)
    for when, code in ((100.1, 200), (100.2, 200), (100.3, 0), (100.9, 502), (101.5, 200), (101.6, 200)):
        t.record(when, code, "refused" if code != 200 else "")
    r = t.result(101.7)
    assert (r["requests"], r["ok"], r["failed"]) == (6, 4, 2)
    assert r["codes"] == {"0": 1, "200": 4, "502": 1}
    assert r["longest_gap_s"] == pytest.approx(1.3)  # 100.2 -> 101.5
    assert r["longest_gap_at_s"] == pytest.approx(0.2)
    assert [f["code"] for f in r["first_failures"]] == [0, 502]
    assert r["outages"] == [{"at_s": 0.2, "at": 0.2, "length_s": 1.3, "failed": 2}]


def test_tally_lists_each_outage_with_its_wall_clock_time():
    t = upgrade_probe.Tally(10.0, wall=1000.0)
    for when, code in ((10.1, 200), (10.2, 503), (12.1, 200), (12.2, 200), (12.7, 200), (15.0, 200)):
        t.record(when, code)
    r = t.result(15.1)
    assert r["started_at"] == 1000.0
    assert r["outages"] == [{"at_s": 0.1, "at": 1000.1, "length_s": 2.0, "failed": 1},
                            {"at_s": 2.7, "at": 1002.7, "length_s": 2.3, "failed": 0}]


def test_tally_outage_until_the_stop_counts():
    t = upgrade_probe.Tally(0.0)
    t.record(0.1, 200)
    t.record(0.2, 503)
    r = t.result(5.0)
    assert r["longest_gap_s"] == pytest.approx(4.9)
    assert r["failed"] == 1


def test_tally_a_slow_answer_is_a_gap_without_failures():
    # A router that holds requests while it restarts fails none, but nothing answers.
    t = upgrade_probe.Tally(0.0)
    for when in (0.1, 0.2, 3.2, 3.3):
        t.record(when, 200)
    r = t.result(3.4)
    assert r["failed"] == 0
    assert r["longest_gap_s"] == pytest.approx(3.0)


def test_tally_keeps_only_the_first_failures():
    t = upgrade_probe.Tally(0.0)
    for i in range(50):
        t.record(i * 0.1, 500, "x" * 500)
    r = t.result(5.0)
    assert len(r["first_failures"]) == upgrade_probe.MAX_SAMPLES
    assert len(r["first_failures"][0]["error"]) == 200


def _probe_server(script: list[int]):
    """A router stand-in that answers the probe's requests with `script`'s codes in order,
    then 200s; it counts what it answered, so the test asserts counts, not times."""
    served: list[tuple[str, str | None, str, int]] = []  # path, Authorization, model, code
    lock = threading.Lock()

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                code = script[len(served)] if len(served) < len(script) else 200
                served.append((self.path, self.headers.get("Authorization"), body["model"], code))
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, served


def test_probe_process_reads_the_key_file_and_reports_on_sigterm(tmp_path):
    # 5 answered, 3 refused (the outage), then answered again: the phases are counted
    # requests, not seconds, so a busy machine changes only how long the test takes.
    script = [200] * 5 + [503] * 3
    server, served = _probe_server(script)
    key = tmp_path / "key"
    key.write_text("sekrit-key\n")
    out = tmp_path / "probe.json"
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts/pdnode/node/upgrade_probe.py"), "--url",
                             f"http://127.0.0.1:{server.server_port}", "--model", "demo", "--out", str(out),
                             "--key-file", str(key), "--interval", "0.05", "--timeout", "120"])
    try:
        deadline = time.monotonic() + 120  # a few seconds on a quiet machine
        while len(served) < len(script) + 5:
            assert proc.poll() is None and time.monotonic() < deadline, (proc.returncode, len(served))
            time.sleep(0.05)
        assert "sekrit-key" not in " ".join(proc.args)
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    finally:
        server.shutdown()
    r = json.loads(out.read_text())
    assert r["schema"] == upgrade_probe.SCHEMA
    # every request the server answered is in the report, each with its code (the one in
    # flight at SIGTERM ends first)
    assert r["requests"] == len(served)
    assert r["failed"] == r["codes"]["503"] == 3
    assert r["ok"] == len(served) - 3
    # the three failures lie in one stretch without a 200, which the longest gap covers
    at = [f["t_s"] for f in r["first_failures"]]
    assert len(at) == 3 and r["longest_gap_s"] >= at[-1] - at[0] > 0
    assert {s[1] for s in served} == {"Bearer sekrit-key"}
    assert {s[0] for s in served} == {"/v1/completions"}
    assert out.stat().st_mode & 0o777 == 0o600


def test_probe_clients_stream_and_a_cut_stream_fails(tmp_path):
    """--clients 2 --stream: one loop streams; a stream without its [DONE] counts as failed."""
    seen: list[bool] = []
    lock = threading.Lock()

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                streams = [x for x in seen if x]
                seen.append(bool(body.get("stream")))
            self.send_response(200)
            self.end_headers()
            if body.get("stream"):  # the first stream is cut: no [DONE]
                self.wfile.write(b'data: {"choices": []}\n\n' + (b"data: [DONE]\n\n" if streams else b""))
            else:
                self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "probe.json"
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts/pdnode/node/upgrade_probe.py"), "--url",
                             f"http://127.0.0.1:{server.server_port}", "--model", "demo", "--out", str(out),
                             "--interval", "0.05", "--timeout", "120", "--clients", "2", "--stream"])
    try:
        deadline = time.monotonic() + 120  # a few seconds on a quiet machine
        while sum(seen) < 3 or len(seen) - sum(seen) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, (proc.returncode, seen)
            time.sleep(0.05)
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    finally:
        server.shutdown()
    r = json.loads(out.read_text())
    assert r["requests"] == len(seen) and r["failed"] == r["codes"]["-1"] == 1, r
    assert r["first_failures"][0]["error"].startswith("stream cut")


def test_probe_unreadable_key_file_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts/pdnode/node/upgrade_probe.py"), "--url", "http://127.0.0.1:1",
                           "--model", "m", "--out", str(tmp_path / "o"), "--key-file", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "--key-file" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- which release serves; the record ---------------------------------------------------

def test_release_of_venv_reads_the_plans_directory_names():
    rel = upgrade.release_of_venv(NEW_VENV, NEW)
    assert rel["versions"]["pdnode_router_package"] == "smg"
    assert rel["versions"]["pdnode_smg_version"] == "1.13.0"
    rel = upgrade.release_of_venv("/opt/x/venvs/sglang-0.5.9-router-0.3.1-mooncake-0.3.5-cu13-0.3.6", NEW)
    assert rel["versions"] == versions(pdnode_sglang_version="0.5.9", pdnode_sglang_router_version="0.3.1",
                                       pdnode_mooncake_version="0.3.5", pdnode_mooncake_cuda13_version="0.3.6")
    with pytest.raises(upgrade.UpgradeError, match="not a pdnode release"):
        upgrade.release_of_venv("/usr", NEW)


def test_release_name_matches_plan_release():
    from pdnode.core.plan import _release

    for v in (versions(), versions(pdnode_router_package="smg")):
        name = _release({**v, "pdnode_engine": "sim"})
        assert upgrade.release_of_venv("/r/venvs/" + name, NEW)["versions"]["pdnode_router_package"] == \
            v["pdnode_router_package"]


def test_decide_without_record_starts_from_the_units_release():
    d = upgrade.decide(None, OLD_VENV, NEW)
    assert d["from"] == OLD and d["to"] == NEW
    assert d["record"]["serving"] == OLD and d["record"]["switching_to"] == NEW


def test_decide_reads_the_venv_from_the_router_units_execstart():
    exec_start = (f"{{ path={OLD_VENV}/bin/python ; argv[]={OLD_VENV}/bin/python -m pdnode.node.router_launch "
                  "/etc/sglang-pd/router.json ; ignore_errors=no ; start_time=[n/a] ; pid=0 ; code=(null) }")
    assert upgrade.decide(None, exec_start, NEW)["from"] == OLD
    with pytest.raises(upgrade.UpgradeError, match="no release serves"):
        upgrade.decide(None, "{ path=/usr/bin/true ; argv[]=true }", NEW)


def test_a_router_only_host_names_its_release_by_its_record_or_its_router():
    """The three-host cluster's router host runs only the router, from its own venv
    (router-<package>-<version>), which names no release: the record does; without one,
    the target's versions with the router the unit runs."""
    router_exec = ("{ path=/opt/sglang-pd/venvs/router-sglang-router-0.3.2/bin/python ; argv[]=... -m "
                   "pdnode.node.router_launch /etc/sglang-pd/router.json ; pid=0 }")
    d = upgrade.decide(None, router_exec, NEW)
    assert d["from"] == {"versions": versions(pdnode_router_package="sglang-router"), "venv": OLD_VENV}
    # the same router as the target's: from and to are one release (nothing to switch there)
    same = upgrade.decide(None, "/opt/sglang-pd/venvs/router-smg-1.13.0", NEW)
    assert same["from"] == NEW
    # with a record, the record says what serves (the router's venv is not a release)
    record = upgrade.finish(upgrade.decide(None, OLD_VENV, NEW)["record"], OLD, NEW, "upgraded")
    assert upgrade.decide(record, router_exec, NEW)["from"] == NEW


def test_interrupted_upgrade_rerun_starts_from_the_last_verified_release():
    # An interrupted run left the record saying it switched to NEW; the units may already
    # name NEW. The re-run's rollback target is still OLD, never the half-switched NEW.
    record = upgrade.decide(None, OLD_VENV, NEW)["record"]
    d = upgrade.decide(record, NEW_VENV, NEW)
    assert d["from"] == OLD and d["to"] == NEW


def test_a_deploy_since_the_last_upgrade_is_where_the_next_one_starts():
    # The record says OLD serves, but a playbooks/deploy.yml run switched the units to a
    # third release: that one serves, OLD becomes the one before it.
    record = upgrade.finish(upgrade.decide(None, OLD_VENV, NEW)["record"], OLD, NEW, "rolled_back")
    third = "/opt/sglang-pd/venvs/sim-router-0.3.2-mooncake-0.3.13.post1-cu13-0.3.15"
    d = upgrade.decide(record, third, NEW)
    assert d["from"]["venv"] == third and d["from"]["versions"]["pdnode_mooncake_cuda13_version"] == "0.3.15"
    assert d["record"]["previous"] == OLD


def test_finish_records_the_outcome():
    record = upgrade.decide(None, OLD_VENV, NEW)["record"]
    up = upgrade.finish(record, OLD, NEW, "upgraded")
    assert (up["serving"], up["previous"], up["switching_to"]) == (NEW, OLD, None)
    back = upgrade.finish(record, OLD, NEW, "rolled_back")
    assert (back["serving"], back["switching_to"], back["failed"]) == (OLD, None, NEW)
    broken = upgrade.finish(record, OLD, NEW, "rollback_failed")
    assert (broken["serving"], broken["switching_to"]) == (OLD, NEW)
    # A re-run of a finished upgrade (from == to) keeps the real previous release.
    again = upgrade.finish(up, NEW, NEW, "upgraded")
    assert again["previous"] == OLD
    with pytest.raises(upgrade.UpgradeError):
        upgrade.finish(record, OLD, NEW, "fine")


def test_decide_refuses_a_bad_record_and_a_bare_host():
    with pytest.raises(upgrade.UpgradeError, match="schema"):
        upgrade.decide({"schema": "x"}, "", NEW)
    with pytest.raises(upgrade.UpgradeError, match="record.serving.versions.pdnode_smg_version"):
        upgrade.decide({"schema": upgrade.RECORD_SCHEMA,
                        "serving": {"venv": OLD_VENV, "versions": versions(pdnode_smg_version="1;rm -rf /")}}, "", NEW)
    with pytest.raises(upgrade.UpgradeError, match="deploy"):
        upgrade.decide(None, "", NEW)


# --- the report -------------------------------------------------------------------------

def verify_report(failed: list[str]) -> dict:
    checks = [{"id": "router.health", "status": "PASS"}] + [{"id": c, "status": "FAIL"} for c in failed]
    return {"exit_code": 1 if failed else 0, "checks": checks}


def step(name, start, end, ok=True):
    return {"name": name, "start": start, "end": end, "ok": ok}


PROBE = {"requests": 300, "ok": 297, "failed": 3, "codes": {"200": 297, "0": 3}, "longest_gap_s": 1.25}


def test_report_upgraded():
    r = upgrade.build_report({"host": "h", "from": OLD, "to": NEW, "probe": PROBE,
                              "steps": [step("build", 0, 5), step("switch", 5, 9.5), step("verify", 9.5, 20)],
                              "verify": {"verify": verify_report([])}})
    assert r["schema"] == "pdnode.upgrade/1" and r["outcome"] == "upgraded"
    assert [s["duration_s"] for s in r["steps"]] == [5, 4.5, 10.5]
    assert r["from"]["pdnode_router_package"] == "sglang-router" and r["to"]["pdnode_router_package"] == "smg"
    assert (r["failed_requests"], r["longest_outage_s"], r["rollback_s"]) == (3, 1.25, None)
    assert r["verify"]["verify"] == {"passed": True, "failed_checks": []}


def test_report_rolled_back_names_the_failed_checks_and_the_rollback_time():
    r = upgrade.build_report({"host": "h", "from": OLD, "to": NEW, "probe": PROBE,
                              "steps": [step("build", 0, 1), step("switch", 1, 2), step("verify", 2, 3, ok=False),
                                        step("rollback", 3, 7), step("reverify", 7, 9)],
                              "verify": {"verify": verify_report(["decode-0.output"]), "reverify": verify_report([])}})
    assert r["outcome"] == "rolled_back"
    assert r["verify"]["verify"]["failed_checks"] == ["decode-0.output"]
    assert r["rollback_s"] == 6


def test_report_failed_start_rolls_back_without_a_verify_of_the_new_release():
    r = upgrade.build_report({"host": "h", "from": OLD, "to": NEW, "probe": None,
                              "steps": [step("build", 0, 1), step("switch", 1, 2, ok=False), step("rollback", 2, 3),
                                        step("reverify", 3, 4)],
                              "verify": {"verify": None, "reverify": verify_report([])}})
    assert r["outcome"] == "rolled_back"
    assert r["verify"]["verify"] == {"passed": False, "failed_checks": []}
    assert r["probe"] is None and r["failed_requests"] is None


@pytest.mark.parametrize("steps,verify", [
    ([step("switch", 0, 1, ok=False), step("rollback", 1, 2, ok=False)], {}),
    ([step("verify", 0, 1, ok=False), step("rollback", 1, 2), step("reverify", 2, 3, ok=False)],
     {"verify": verify_report(["a"]), "reverify": verify_report(["b"])}),
])
def test_report_rollback_failed(steps, verify):
    r = upgrade.build_report({"host": "h", "from": OLD, "to": NEW, "steps": steps, "verify": verify})
    assert r["outcome"] == "rollback_failed"


def test_cli_one_line_errors():
    proc = subprocess.run([sys.executable, "-m", "pdnode.core.upgrade", "decide"], input=json.dumps(
        {"record": None, "unit_venv": "", "target": NEW}), capture_output=True, text=True,
        env={"PYTHONPATH": str(REPO / "scripts")}, timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("pdnode.upgrade decide: no release serves")
