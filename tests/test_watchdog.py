"""pdnode.watchdog (the sidecar that feeds systemd's watchdog from /health) and the
launcher's start of it, against a real notify socket and real processes."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pdnode import watchdog

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WATCHDOG_USEC = "1200000"  # 1.2 s: a ping every 0.3 s


@pytest.fixture()
def notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.1)
    yield path, s
    s.close()


def pings(sock, seconds: float) -> int:
    """WATCHDOG=1 datagrams received in the next `seconds`."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            n += sock.recv(64) == b"WATCHDOG=1"
        except TimeoutError:
            pass
    return n


class Health:
    """/health with a settable answer: a status code, or 'hang'."""

    def __init__(self):
        self.answer: int | str = 503
        owner = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if owner.answer == "hang":
                    time.sleep(5)
                    return
                self.send_response(int(owner.answer))
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/health"


@pytest.fixture()
def health():
    h = Health()
    yield h
    h.srv.shutdown()


@pytest.fixture()
def engine():
    """A stand-in for the engine process: something to stop, continue and end."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


def start_sidecar(pid, url, address, sock=None):
    """Start the sidecar; with sock, return once its first ping arrived (Python start-up
    time is not part of what is measured)."""
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS), NOTIFY_SOCKET=address, WATCHDOG_USEC=WATCHDOG_USEC)
    p = subprocess.Popen([sys.executable, "-m", "pdnode.watchdog", "--pid", str(pid), "--url", url,
                          "--probe-timeout", "0.3"], env=env, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 10
    while sock is not None and time.monotonic() < end and not pings(sock, 0.1):
        pass
    return p


@pytest.mark.parametrize(("state", "why_not", "seen", "pings_"), [
    ("S", None, True, True),
    ("S", "HTTP 503", False, True),       # loading: alive is enough
    ("R", "timed out", False, True),
    ("S", "HTTP 503", True, False),       # was healthy, is not: let systemd act
    ("S", "timed out", True, False),
    ("T", None, False, False),            # SIGSTOPped, before or after the first 200
    ("T", "timed out", True, False),
    ("t", None, True, False),
])
def test_decide(state, why_not, seen, pings_):
    assert (watchdog.decide(state, why_not, seen) is None) is pings_


def test_pings_while_loading_and_healthy_and_stops_when_health_fails(notify_socket, health, engine):
    address, sock = notify_socket
    side = start_sidecar(engine.pid, health.url, address, sock)
    try:
        assert pings(sock, 1.5) >= 3, "no pings while the engine loads (/health 503, process alive)"
        health.answer = 200
        assert pings(sock, 1.5) >= 3
        health.answer = "hang"
        time.sleep(0.8)  # a probe in flight may still end in a ping
        assert pings(sock, 2.0) == 0, "pinged for an engine whose /health hangs"
        health.answer = 200
        assert pings(sock, 1.5) >= 2, "no pings after /health recovered"
    finally:
        side.kill()
        side.wait()


def test_no_pings_for_a_stopped_engine_even_while_loading(notify_socket, health, engine):
    address, sock = notify_socket
    side = start_sidecar(engine.pid, health.url, address, sock)
    try:
        assert pings(sock, 1.0) >= 2
        os.kill(engine.pid, signal.SIGSTOP)
        time.sleep(0.5)
        assert pings(sock, 2.0) == 0, "pinged for a SIGSTOPped engine"
        os.kill(engine.pid, signal.SIGCONT)
        assert pings(sock, 1.5) >= 2
    finally:
        side.kill()
        side.wait()
    assert "the engine process is stopped" in side.stderr.read()


def test_exits_with_the_engine(notify_socket, health, engine):
    address, _ = notify_socket
    side = start_sidecar(engine.pid, health.url, address)
    time.sleep(0.5)
    engine.kill()
    engine.wait()
    assert side.wait(timeout=5) == 0


def test_launcher_starts_the_sidecar_outside_the_engines_children(notify_socket, health, tmp_path):
    """The launcher's exec path: the sidecar gets the notify socket, the engine does not,
    the sidecar is not the engine's child, and it ends when the engine ends."""
    address, sock = notify_socket
    health.answer = 200
    report = tmp_path / "engine-env"
    engine_code = textwrap.dedent(f"""
        import os, time
        open({str(report)!r}, "w").write(",".join(k for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
                                                   if k in os.environ))
        time.sleep(2.5)
    """)
    script = textwrap.dedent(f"""
        import os, sys
        from pdnode import launcher
        env = dict(os.environ, WATCHDOG_PID=str(os.getpid()))
        pid = launcher.start_watchdog({health.url!r}, env)
        print(pid, flush=True)
        os.execve(sys.executable, [sys.executable, "-c", {engine_code!r}], env)
    """)
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS), NOTIFY_SOCKET=address, WATCHDOG_USEC=WATCHDOG_USEC)
    eng = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    sidecar = int(eng.stdout.readline())
    assert pings(sock, 1.2) >= 2
    ppid = int(Path(f"/proc/{sidecar}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert ppid != eng.pid, "the sidecar must not be the engine's child"
    assert report.read_text() == "", "the engine must not see the notify socket"
    eng.wait(timeout=10)
    deadline = time.monotonic() + 5
    while watchdog.process_state(sidecar) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watchdog.process_state(sidecar) in (None, "Z"), "the sidecar outlived the engine"


def test_launcher_without_a_watchdog_starts_nothing():
    from pdnode import launcher
    assert launcher.start_watchdog("http://127.0.0.1:1/health", {"PATH": "/bin"}) is None


def test_an_unreachable_notify_socket_is_one_line_not_a_crash(tmp_path, health, engine):
    health.answer = 200
    side = start_sidecar(engine.pid, health.url, str(tmp_path / "missing"))
    time.sleep(1.5)
    assert side.poll() is None, "the sidecar died"
    engine.kill()
    engine.wait()
    assert side.wait(timeout=5) == 0
    err = side.stderr.read()
    assert err.count("cannot reach") == 1 and "Traceback" not in err, err
