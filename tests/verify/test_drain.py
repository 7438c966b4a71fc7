"""pdnode.node.drain against the REAL routers (sglang-router 0.3.2 and smg 1.13.0, started by
pdnode.node.router_launch as the unit starts them) in front of stand-in engines on loopback
(issue 18): an instance leaves the router, its requests finish, it can stop without a
failed request, it comes back; a worker an interrupted drain left out is put back, and
the verifier names it while it is out.

Counts and orderings, and one stall bound: under load (pdnode.node.loadgen, which judges
every answer) no request fails, a floor of requests finishes while the change runs, and
no stretch without a success nor any single request lasts STALL_S (or, on a machine so busy
that the same load was already slow before the change, loadgen.PACE_FACTOR times its
median request then); the drain returns
after the stream the engine held has ended; the router lists what it should.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pdnode.node import loadgen
from routerproc import REPO, key_file, router_process
from test_router_admin import ADMIN as ADMIN_0_3_2
from test_router_smg import ADMIN as ADMIN_SMG
from test_router_smg import _require_smg

pytestmark = pytest.mark.integration

ADMIN = "adm-drain:with-colons:5a"
CLIENT = "sk-client-d7a1"
PACKAGES = ["sglang-router", "smg"]
# A zero-drop run proves something only with load through the change and no stall. The
# floor counts requests finished while the drain and the engines' kill ran: 92
# (sglang-router) and 521 (smg, whose drain waits out its worker list) on this 2-core
# machine at load average 2, 177 and 579 with three busy loops beside (a slower drain
# spans more requests). A request on the stand-in takes under 0.2 s, so 5 s without a
# success, or for one request, is a stall.
MIN_REQUESTS_DURING_CHANGE = 20
STALL_S = 5.0


@contextlib.contextmanager
def node_2p2d(d: Path, package: str) -> Iterator[dict[str, Any]]:
    """Two stand-in pairs behind one real router: prefills a, b; decodes a, b."""
    from node import free_ports, standin_node

    if package == "smg":
        _require_smg()
    with standin_node(d / "a", router=False, api_key=CLIENT) as a, \
            standin_node(d / "b", router=False, api_key=CLIENT) as b:
        rp, mp = free_ports(2)
        router = {"pd_disaggregation": True, "prefill": [[a.prefill_url, a.ports["bootstrap"]],
                                                         [b.prefill_url, b.ports["bootstrap"]]],
                  "decode": [a.decode_url, b.decode_url], "host": "127.0.0.1", "port": rp,
                  "prometheus_host": "127.0.0.1", "prometheus_port": mp, "policy": "round_robin",
                  "worker_startup_check_interval": 1, "shutdown_grace_period_secs": 1}
        if package == "smg":
            router["log_json"] = True
        (d / "router.json").write_text(json.dumps(router))
        argv = [sys.executable, "-m", "pdnode.node.router_launch", str(d / "router.json"), "--router-package", package,
                "--admin-key-file", key_file(d, "admin", ADMIN), "--api-key-file", key_file(d, "client", CLIENT)]
        base = f"http://127.0.0.1:{rp}"
        with router_process(argv, d, base + "/readiness", {"HF_HUB_OFFLINE": "1"},
                            ready=lambda r: r.json().get("healthy_workers") == 4):
            workers = [
                {"id": "prefill-0", "role": "prefill", "url": a.prefill_url, "bootstrap_port": a.ports["bootstrap"]},
                {"id": "prefill-1", "role": "prefill", "url": b.prefill_url, "bootstrap_port": b.ports["bootstrap"]},
                {"id": "decode-0", "role": "decode", "url": a.decode_url},
                {"id": "decode-1", "role": "decode", "url": b.decode_url},
            ]
            yield {"base": base, "a": a, "b": b, "workers": {w["id"]: w for w in workers}, "dir": d}


def drain(n: dict[str, Any], command: str, ids: list[str], timeout_s: float = 120,
          router: str | None = None, args: tuple[str, ...] = (), spec_file: bool = False
          ) -> tuple[dict[str, Any], list[str]]:
    """Run `python -m pdnode.node.drain COMMAND` as the Ansible task does (spec on stdin),
    or as the router unit does at its start (spec_file: --spec FILE)."""
    spec = {"router": router or n["base"], "admin_key_file": str(n["dir"] / "admin"),
            "api_key_file": str(n["dir"] / "client"), "timeout_s": timeout_s,
            "workers": [n["workers"][i] for i in ids]}
    if spec_file:
        (n["dir"] / "router-workers.json").write_text(json.dumps(spec))
        args = (*args, "--spec", str(n["dir"] / "router-workers.json"))
    r = subprocess.run([sys.executable, "-m", "pdnode.node.drain", command, *args],
                       input="" if spec_file else json.dumps(spec), text=True,
                       capture_output=True, timeout=600, check=False,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    return json.loads(lines[-1]), lines[:-1]


def listed(n: dict[str, Any]) -> set[str]:
    from node import request

    got = request("GET", n["base"] + "/workers", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert got.status == 200, got.text
    urls = {w["url"] for w in got.json()["workers"]}
    return {i for i, w in n["workers"].items() if w["url"] in urls}


def load(base: str) -> loadgen.Load:
    """4 clients through the router, each starting a request every 0.1 s (back to back
    they kept two cores busy for a count of 20), every second one streaming."""
    return loadgen.Load(base, "fake-model", CLIENT, clients=4, stream=True, max_tokens=8, prompt="drain me " * 8,
                        interval=0.1)


def wait_requests(running: loadgen.Load, more: int) -> None:
    """Until the load has finished MORE requests beyond now (ends when they are answered)."""
    import time

    target = running.finished + more
    while running.finished < target:
        assert running.running()
        time.sleep(0.05)


def zero_drop(result: dict[str, Any], min_requests: int) -> list[str]:
    return loadgen.zero_drop_problems(result, min_requests=min_requests, max_gap_s=STALL_S, max_request_s=STALL_S)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_prefill_and_a_decode_leave_stop_and_no_request_fails(tmp_path, package):
    with node_2p2d(tmp_path, package) as n, load(n["base"]) as running:
        wait_requests(running, 20)
        running.mark_change()  # what ended so far is the load's pace
        before = running.finished
        result, lines = drain(n, "out", ["prefill-0", "decode-0"])
        assert result["removed"] == ["prefill-0", "decode-0"], lines
        assert listed(n) == {"prefill-1", "decode-1"}
        assert any("prefill-0 left the router" in x for x in lines) and any("decode-0 drained" in x for x in lines)
        # what the drain waited for: nothing is left on either engine
        for role in ("prefill", "decode"):
            os.killpg(n["a"].procs[role].pid, signal.SIGKILL)
            n["a"].procs[role].wait(60)
        during = running.finished - before
        wait_requests(running, 40)
    assert zero_drop(running.result, 60) == [], running.result
    assert during >= MIN_REQUESTS_DURING_CHANGE, \
        f"only {during} requests finished while the drain and the kill ran; at least {MIN_REQUESTS_DURING_CHANGE} must"
    print(f"{package}: {during} requests finished during the change; the load: {running.result}")


@pytest.mark.parametrize("package", PACKAGES)
def test_workers_return_to_the_router_and_serve(tmp_path, package):
    with node_2p2d(tmp_path, package) as n:
        drain(n, "out", ["prefill-1", "decode-1"])
        assert listed(n) == {"prefill-0", "decode-0"}
        result, lines = drain(n, "in", ["prefill-1", "decode-1"])
        assert result["added"] == ["prefill-1", "decode-1"], lines
        assert any("prefill-1 returned to the router" in x for x in lines)
        assert listed(n) == set(n["workers"])
        # back for real: they take requests again (round robin over both pairs)
        before = {r["bootstrap_room"] for r in n["b"].recent_requests("prefill")}
        with load(n["base"]) as running:
            wait_requests(running, 10)
            running.mark_change()  # the pace: the first ten, against the next ten
            wait_requests(running, 10)
        assert zero_drop(running.result, 20) == [], running.result
        assert {r["bootstrap_room"] for r in n["b"].recent_requests("prefill")} - before
        # a second `in` changes nothing (a re-run)
        assert drain(n, "in", ["prefill-1", "decode-1"])[0]["changed"] is False


def long_stream(n: dict[str, Any], max_tokens: int) -> tuple[threading.Thread, list[str], str]:
    """A streaming completion through the router (2 ms a token on the stand-in); returns
    once a decode holds it: (its thread, its outcome when done, the decode's id)."""
    import time

    from pdnode.node.drain import busy

    done: list[str] = []

    def run() -> None:
        out = loadgen.request(n["base"] + "/v1/completions", loadgen.completion("fake-model", "long", max_tokens, True),
                              CLIENT, timeout=300)
        done.append("ok" if not out.kind else f"{out.kind} {out.status} {out.detail}")

    t = threading.Thread(target=run)
    t.start()
    end = time.monotonic() + 60  # ends once a decode reports it (milliseconds)
    while True:
        assert time.monotonic() < end and t.is_alive(), done
        for d in ("decode-0", "decode-1"):
            if any((busy(n["workers"][d], CLIENT) or {}).values()):
                return t, done, d
        time.sleep(0.02)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_drain_waits_for_the_stream_a_decode_holds(tmp_path, package):
    with node_2p2d(tmp_path, package) as n:
        t, done, holder = long_stream(n, 1500)
        _, lines = drain(n, "out", [holder])
        assert done == ["ok"], (done, lines)  # the drain returned only after the stream ended
        assert any(f"{holder} drained" in x for x in lines), lines
        t.join(60)


def test_a_drain_past_its_timeout_says_what_was_left(tmp_path):
    with node_2p2d(tmp_path, "sglang-router") as n:
        t, done, holder = long_stream(n, 6000)
        _, lines = drain(n, "out", [holder], timeout_s=1)
        assert done == [] and any(f"{holder} drain timeout" in x and "still holding: num_running_reqs 1" in x
                                  for x in lines), lines
        t.join(120)
        assert done == ["ok"]


@pytest.mark.parametrize("command", ["out-unplanned", "reconcile"])
@pytest.mark.parametrize("package", PACKAGES)
def test_a_worker_the_plan_no_longer_has_leaves_the_router(tmp_path, package, command):
    """A layout change that removes decode-1: out-unplanned (before its unit stops) and
    reconcile (every deploy's last step: the router is not restarted for a new worker
    list) take out what the plan lacks."""
    with node_2p2d(tmp_path, package) as n:
        planned = {i: w for i, w in n["workers"].items() if i != "decode-1"}
        if command == "reconcile":  # the deploy's read: it names decode-1 and changes nothing
            check, lines = drain({**n, "workers": planned}, command, list(planned), args=("--check",))
            assert check["needed"] is True and check["changed"] is False, lines
            assert check["unplanned"] == [n["workers"]["decode-1"]["url"]] and check["missing"] == [], lines
            assert listed(n) == set(n["workers"])
        result, lines = drain({**n, "workers": planned}, command, list(planned))
        assert result["removed"] == [n["workers"]["decode-1"]["url"]], lines
        assert listed(n) == set(planned)
        assert result["added"] == []
        if command == "reconcile":
            check, lines = drain({**n, "workers": planned}, command, list(planned), args=("--check",))
            assert check["needed"] is False and check["unplanned"] == check["missing"] == [], lines


def test_with_no_router_answering_there_is_nothing_to_do(tmp_path):
    from node import free_ports

    with node_2p2d(tmp_path, "sglang-router") as n:
        dead = f"http://127.0.0.1:{free_ports(1)[0]}"
        for command in ("out", "in", "reconcile"):
            result, lines = drain(n, command, ["prefill-0"], router=dead)
            assert result["changed"] is False and "does not answer" in lines[0], lines
        result, lines = drain(n, "reconcile", ["prefill-0"], router=dead, args=("--check",))
        assert result["needed"] is False and "does not answer" in lines[0], lines
        # a new admin key the router does not run with yet (it restarts with it later in the run)
        (tmp_path / "admin").write_text("adm-new:x:y:z\n")
        result, lines = drain(n, "out", ["prefill-0"])
        assert result["changed"] is False and "still runs with an earlier admin key" in lines[0], lines
        result, lines = drain(n, "reconcile", ["prefill-0"], args=("--check",))
        assert result["needed"] is True and "still runs with an earlier admin key" in lines[0], lines
        # before the first deploy made the admin key, no router has run with it
        (tmp_path / "admin").rename(tmp_path / "admin.gone")
        result, lines = drain(n, "out", ["prefill-0"])
        assert result["changed"] is False and "the router has not run" in lines[0], lines


@pytest.mark.parametrize("package", PACKAGES)
def test_a_worker_left_out_is_named_by_verify_and_put_back_by_reconcile(tmp_path, package):
    """An interrupted drain (out, never in): the verifier FAILs naming it; the next run's
    reconcile puts it back; the verifier's router check passes again."""
    from nodeplan import plan_for
    from pdnode.verify.config import build_run
    from pdnode.verify.engine import verify
    from test_router_admin import launched_node
    from test_router_smg import smg_node

    def router_check(node: Any) -> Any:
        run = build_run(node.plan, api_key_file=str(tmp_path / "client"), admin_key_file=str(tmp_path / "admin"),
                        env={}, skip_burst=True, on_node=True)
        return {c.id: c for c in verify(run).checks}["router"]

    ctx = smg_node if package == "smg" else launched_node
    with ctx(tmp_path / "node", CLIENT) as node:
        plan = node.plan if getattr(node, "plan", None) else plan_for(node)
        node.plan = plan
        n = {"base": node.router_url, "dir": tmp_path, "workers": {
            "prefill-0": {"id": "prefill-0", "role": "prefill", "url": node.prefill_url,
                          "bootstrap_port": node.ports["bootstrap"]},
            "decode-0": {"id": "decode-0", "role": "decode", "url": node.decode_url}}}
        (tmp_path / "admin").write_text((ADMIN_SMG if package == "smg" else ADMIN_0_3_2) + "\n")
        (tmp_path / "admin").chmod(0o600)
        (tmp_path / "client").write_text(CLIENT + "\n")
        drain(n, "out", ["decode-0"])
        check = router_check(node)
        assert check.status == "FAIL" and "decode-0" in check.evidence and "not listed" in check.evidence, \
            check.evidence
        check, lines = drain(n, "reconcile", ["prefill-0", "decode-0"], args=("--check",))
        assert check["needed"] is True and check["missing"] == ["decode-0"] and check["unplanned"] == [], lines
        assert router_check(node).status == "FAIL"  # --check put nothing back
        # as the router unit runs it when the router starts (its spec file, nothing on stdin)
        result, lines = drain(n, "reconcile", ["prefill-0", "decode-0"], spec_file=True)
        assert result["added"] == ["decode-0"] and any("putting it back" in x for x in lines), lines
        assert router_check(node).status == "PASS"
