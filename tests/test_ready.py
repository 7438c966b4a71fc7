"""pdnode.node.ready, the ExecStartPost readiness gate: it waits for 200s, gives up at its
timeout, and ends the moment the service's main process is gone ($MAINPID).

No wall-clock upper bound: "ended because the process died" is shown by the gate's own
message and by a gate timeout far beyond anything else the test waits for (a gate that
ignored the process would be stopped by subprocess.run's deadline and fail the test), so a
busy machine cannot fail these tests; only a lower bound (it waited out its timeout) is
timed, and load can only lengthen that."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pdnode.node import ready

SRC = Path(__file__).resolve().parents[1] / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A gate that must end by itself (the process died) gets a timeout it never reaches; the
# test's own deadline (subprocess.run) is shorter, so a gate that waited it out fails.
NEVER_S = 3600
DEADLINE_S = 120


def run_gate(*args, mainpid=None, timeout=DEADLINE_S):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.pop("MAINPID", None)
    if mainpid is not None:
        env["MAINPID"] = str(mainpid)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pdnode.node.ready", *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=timeout)
    return r, time.monotonic() - t0


@pytest.fixture()
def server():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_ready_when_every_url_answers_200(server):
    r, _ = run_gate("--timeout", 5, f"{server}/ok", f"{server}/ok")
    assert r.returncode == 0, r.stderr


def test_timeout_names_the_url_and_its_last_answer(server):
    r, took = run_gate("--timeout", 1, f"{server}/ok", f"{server}/loading")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"pdnode.ready: {server}/loading not ready after 1 s: HTTP 503"]
    assert took >= 1  # it waited its timeout out (a stop before would be another bug)


def test_ends_at_once_when_the_main_process_exits_unreaped():
    """The regression: a launcher that fails at once (corrupt JSON) used to hold
    `systemctl start` for the whole timeout. The child is not reaped here (a zombie),
    as between its exit and systemd's waitid()."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(2)"])
    try:
        r, _ = run_gate("--timeout", NEVER_S, f"http://127.0.0.1:{_free_port()}/health", mainpid=child.pid)
    finally:
        child.wait()
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    # the gate ended because the process exited, long before its own timeout
    assert f"main process (pid {child.pid}) exited" in lines[0]
    assert "not ready after" not in r.stderr


def test_ends_at_once_when_the_main_process_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: /proc/<pid> no longer exists
    r, _ = run_gate("--timeout", NEVER_S, "--pid", child.pid, f"http://127.0.0.1:{_free_port()}/health")
    assert r.returncode == 1 and f"main process (pid {child.pid}) exited" in r.stderr
    assert "not ready after" not in r.stderr


def test_a_live_main_process_does_not_stop_the_wait(server):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r, took = run_gate("--timeout", 1.5, f"{server}/loading", mainpid=child.pid)
    finally:
        child.kill()
        child.wait()
    assert r.returncode == 1 and "not ready after" in r.stderr
    assert took >= 1.4


def test_process_alive():
    assert ready.process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + DEADLINE_S  # ends as soon as the child has exited
    while ready.process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # a zombie until reaped: already counts as exited
    assert not ready.process_alive(child.pid)
    child.wait()
    assert not ready.process_alive(child.pid)
