"""The upgrade's logic: the prober as the host runs it, the release record's transitions, the report."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from pdnode.core.change import upgrade
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


# --- the prober (its counting: tests/test_loadgen.py) -------------------------------------

BODY = b'{"choices": [{"text": "x", "finish_reason": "length"}]}'
STREAM = b'data: {"choices": [{"text": "x", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'


def probe_copy(tmp_path: Path) -> Path:
    """The prober as playbooks/upgrade.yml lays it on the host: probe.py and loadgen.py
    side by side, run as a file (no pdnode package)."""
    d = tmp_path / "upgrade"
    d.mkdir()
    shutil.copy(REPO / "src/pdnode/node/upgrade_probe.py", d / "probe.py")
    shutil.copy(REPO / "src/pdnode/node/loadgen.py", d / "loadgen.py")
    return d / "probe.py"


def _probe_server(answer):
    """A router stand-in answering the n-th request (from 0) with ANSWER(n, body) ->
    (code, bytes); it records what it answered, so the tests assert counts, not times."""
    served: list[tuple[str, str | None, dict, int]] = []  # path, Authorization, body, code
    lock = threading.Lock()

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                code, data = answer(len(served), body)
                served.append((self.path, self.headers.get("Authorization"), body, code))
            self.send_response(code)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, served


def _run_probe(tmp_path: Path, server, served, until, *args: str) -> dict:
    """The prober from its host copy until UNTIL(served) holds, stopped by SIGTERM; its result."""
    out = tmp_path / "probe.json"
    proc = subprocess.Popen([sys.executable, str(probe_copy(tmp_path)), "--url",
                             f"http://127.0.0.1:{server.server_port}", "--model", "demo", "--out", str(out),
                             "--interval", "0.05", "--timeout", "120", *args])
    try:
        deadline = time.monotonic() + 120  # a few seconds on a quiet machine
        while not until(served):
            assert proc.poll() is None and time.monotonic() < deadline, (proc.returncode, len(served))
            time.sleep(0.05)
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    finally:
        server.shutdown()
    assert out.stat().st_mode & 0o777 == 0o600
    return json.loads(out.read_text())


def test_probe_process_reads_the_key_file_and_reports_on_sigterm(tmp_path):
    # 5 answered, 3 refused (the outage), then answered again: the phases are counted
    # requests, not seconds, so a busy machine changes only how long the test takes.
    script = [200] * 5 + [503] * 3
    server, served = _probe_server(lambda n, body: (script[n], BODY) if n < len(script) else (200, BODY))
    key = tmp_path / "key"
    key.write_text("sekrit-key\n")
    r = _run_probe(tmp_path, server, served, lambda s: len(s) >= len(script) + 5, "--key-file", str(key))
    assert r["schema"] == upgrade_probe.SCHEMA
    assert r["interval_s"] == 0.05  # what it was told, so a report says how fine its outages are
    # every request the server answered is in the report, each with its code (the one in
    # flight at SIGTERM ends first)
    assert r["requests_started"] == r["requests"] == len(served)
    assert r["failed"] == r["codes"]["503"] == r["failures"]["status"] == 3
    assert r["ok"] == len(served) - 3
    # the three failures lie in one stretch without a success, which the longest gap covers
    at = [f["t_s"] for f in r["first_failures"]]
    assert len(at) == 3 and r["longest_gap_s"] >= at[-1] - at[0] > 0
    assert {s[1] for s in served} == {"Bearer sekrit-key"}
    assert {s[0] for s in served} == {"/v1/completions"}


def test_probe_clients_stream_and_a_cut_stream_fails(tmp_path):
    """--clients 2 --stream: one loop streams; a stream without its [DONE] counts as failed."""
    def answer(n, body):
        if not body.get("stream"):
            return 200, BODY
        first = not any(s[2].get("stream") for s in served)
        return 200, STREAM.replace(b"data: [DONE]\n\n", b"") if first else STREAM  # the first stream is cut

    server, served = _probe_server(answer)
    r = _run_probe(tmp_path, server, served, lambda s: sum(1 for x in s if x[2].get("stream")) >= 3
                   and sum(1 for x in s if not x[2].get("stream")) >= 3, "--clients", "2", "--stream")
    assert r["requests"] == len(served) and r["failed"] == r["failures"]["no-done"] == 1, r
    assert r["first_failures"][0]["kind"] == "no-done" and r["codes"] == {"200": len(served)}


def test_probe_counts_a_200_carrying_an_error_as_failed(tmp_path):
    """A router answering every request with 200 and an error -- in the body, or as a
    stream's chunk before its [DONE] (SGLang's failure after admission): none is a success."""
    error_chunk = b'data: {"error": {"message": "KV transfer failed", "code": 500}}\n\ndata: [DONE]\n\n'
    server, served = _probe_server(lambda n, body: (200, error_chunk if body.get("stream")
                                                    else b'{"error": {"message": "bootstrap failed"}}'))
    r = _run_probe(tmp_path, server, served, lambda s: len(s) >= 8, "--clients", "2", "--stream")
    streams = sum(1 for s in served if s[2].get("stream"))
    assert r["ok"] == 0 and r["failed"] == r["requests"] == len(served), r
    assert r["failures"] == {"error-body": len(served) - streams, "error-chunk": streams}
    assert r["longest_gap_s"] == r["duration_s"]  # never a success: one gap, the whole run


def test_probe_unreadable_key_file_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(probe_copy(tmp_path)), "--url", "http://127.0.0.1:1",
                           "--model", "m", "--out", str(tmp_path / "o"), "--key-file", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "--key-file" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "says"), [(["--clients", "0"], "--clients 0: must be above 0"),
                                             (["--url", "ftp://x"], "must start with http:// or https://")])
def test_probe_bad_arguments_are_one_line(tmp_path, args, says):
    proc = subprocess.run([sys.executable, str(probe_copy(tmp_path)), "--url", "http://127.0.0.1:1", "--model", "m",
                           "--out", str(tmp_path / "o"), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_probe_unwritable_out_is_one_line_with_the_result(tmp_path):
    server, served = _probe_server(lambda n, body: (200, BODY))
    proc = subprocess.Popen([sys.executable, str(probe_copy(tmp_path)), "--url",
                             f"http://127.0.0.1:{server.server_port}", "--model", "m",
                             "--out", str(tmp_path / "missing" / "o")], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # its first request: it runs, its SIGTERM handler is set
        while not served:
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            time.sleep(0.05)
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 1 and "--out" in err and '"requests_started"' in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


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
    from pdnode.core.plan.build import _release

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


PROBE = {"requests_started": 300, "requests": 300, "ok": 297, "failed": 3, "failures": {"connection": 3},
         "codes": {"200": 297, "0": 3}, "longest_gap_s": 1.25, "longest_request_s": 0.4}


def test_report_upgraded():
    r = upgrade.build_report({"host": "h", "from": OLD, "to": NEW, "probe": PROBE,
                              "steps": [step("build", 0, 5), step("switch", 5, 9.5), step("verify", 9.5, 20)],
                              "verify": {"verify": verify_report([])}})
    assert r["schema"] == "pdnode.upgrade/1" and r["outcome"] == "upgraded"
    assert [s["duration_s"] for s in r["steps"]] == [5, 4.5, 10.5]
    assert r["from"]["pdnode_router_package"] == "sglang-router" and r["to"]["pdnode_router_package"] == "smg"
    assert (r["failed_requests"], r["longest_outage_s"], r["rollback_s"]) == (3, 1.25, None)
    assert (r["probe"]["failures"], r["probe"]["requests_started"], r["probe"]["longest_request_s"]) == (
        {"connection": 3}, 300, 0.4)
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
    proc = subprocess.run([sys.executable, "-m", "pdnode.commands.upgrade", "decide"], input=json.dumps(
        {"record": None, "unit_venv": "", "target": NEW}), capture_output=True, text=True,
        env={"PYTHONPATH": str(REPO / "src")}, timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("pdnode.upgrade decide: no release serves")


@pytest.mark.parametrize("value", ["abc", "0", "0.1.2"])
def test_a_bad_prober_interval_is_refused_before_the_host_is_touched(value):
    # The demo inventory's host is a container that need not exist: the refusal comes first.
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(REPO / "inventories" / "demo"),
                           str(REPO / "playbooks" / "upgrade.yml"), "-e", f"upgrade_probe_interval_s={value}"],
                          cwd=REPO, env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert f'upgrade_probe_interval_s is "{value}": it must be a number of seconds above 0' in proc.stdout, \
        proc.stdout[-2000:]
    assert "Read the host's release record" not in proc.stdout


def test_the_prober_interval_default_is_the_same_in_the_playbook_the_prober_and_the_pages():
    play = yaml.safe_load((REPO / "playbooks" / "upgrade.yml").read_text())[0]
    default = play["vars"]["upgrade_probe_interval_s"]
    assert default == upgrade_probe.DEFAULT_INTERVAL_S
    runbook = (REPO / "docs" / "runbooks" / "upgrade.md").read_text()
    assert f"every {round(default * 1000)} ms (`-e upgrade_probe_interval_s=" in " ".join(runbook.split())
    architecture = (REPO / "docs" / "architecture.md").read_text()
    assert f"every `upgrade_probe_interval_s` ({default} s)" in architecture


# --- a model change is a release change (issue 44) -----------------------------------------------
def _model(c: str) -> dict:
    commit = c * 40
    return {"commit": commit, "lock": {"format": "pdnode.model-lock/1", "repo": "o/m", "commit": commit}}


def test_the_model_that_serves_is_the_hosts_where_no_record_names_one():
    target = {**OLD, "model": _model("b")}
    d = upgrade.decide(None, OLD_VENV, target, _model("a"))
    assert d["from"] == {**OLD, "model": _model("a")} and d["to"] == target
    # a record from before pdnode knew the model, the units unchanged since: the host says
    record = upgrade.finish({"schema": upgrade.RECORD_SCHEMA, "previous": None}, OLD, OLD, "upgraded")
    assert upgrade.decide(record, OLD_VENV, target, _model("a"))["from"]["model"] == _model("a")
    # without a model anywhere, releases read as before (no "model" key)
    assert "model" not in upgrade.decide(None, OLD_VENV, NEW)["from"]


def test_a_model_rollback_goes_to_the_last_verified_commit_not_an_interrupted_one():
    serving = {**OLD, "model": _model("a")}
    pending = {**OLD, "model": _model("b")}
    record = {"schema": upgrade.RECORD_SCHEMA, "serving": serving, "previous": None, "switching_to": pending}
    # the host already switched to b when the run was cut: the last verified (a) is the start
    assert upgrade.decide(record, OLD_VENV, {**OLD, "model": _model("c")}, _model("b"))["from"] == serving
    done = upgrade.finish(record, serving, pending, "rolled_back")
    assert done["serving"] == serving and done["failed"] == pending


def test_a_model_of_another_commit_than_its_lock_is_refused():
    bad = {"commit": "a" * 40, "lock": {"commit": "b" * 40}}
    with pytest.raises(upgrade.UpgradeError, match="target.model"):
        upgrade.decide(None, OLD_VENV, {**OLD, "model": bad})
    report = upgrade.build_report({"host": "h", "from": {**OLD, "model": _model("a")}, "to": {**OLD, "model": None},
                                   "steps": [], "verify": {}})
    assert (report["from_model"], report["to_model"]) == ("a" * 40, None)
