"""pdnode.node.watchdog (the sidecar that feeds systemd's watchdog from /health) and the
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

from pdnode.node import watchdog

SRC = Path(__file__).resolve().parents[1] / "src"
WATCHDOG_USEC = "1200000"  # 1.2 s: a ping every 0.3 s


# What a working sidecar does takes a fraction of a second; a busy machine may stretch that
# to seconds. Every wait below ends as soon as its event happened and fails only at this
# deadline, or at once when the sidecar died: only a broken sidecar fails them.
DEADLINE_S = 60.0


@pytest.fixture()
def notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.1)
    yield path, s
    s.close()


def wait_for(what: str, done, side=None, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        if side is not None and side.p.poll() is not None:
            raise AssertionError(f"the sidecar exited ({side.p.returncode}) before {what}:\n{side.err()}")
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline_s:.0f} s: {what}" + (f"\n{side.err()}" if side else ""))
        time.sleep(0.02)


def wait_pings(sock, count: int, side=None) -> None:
    """Until `count` WATCHDOG=1 datagrams have arrived (more may follow)."""
    n, end = 0, time.monotonic() + DEADLINE_S
    while n < count:
        if side is not None and side.p.poll() is not None:
            raise AssertionError(f"the sidecar exited ({side.p.returncode}) after {n} of {count} pings:\n{side.err()}")
        assert time.monotonic() < end, f"{n} of {count} pings within {DEADLINE_S:.0f} s"
        try:
            n += sock.recv(64) == b"WATCHDOG=1"
        except TimeoutError:
            pass


def drain(sock) -> int:
    """The pings already queued on the socket (datagrams: a ping sent is a ping queued)."""
    n = 0
    sock.setblocking(False)
    try:
        while True:
            try:
                n += sock.recv(64) == b"WATCHDOG=1"
            except BlockingIOError:
                return n
    finally:
        sock.settimeout(0.1)


class Health:
    """/health with a settable answer: a status code, or 'hang'. Counts what it was asked:
    `probes` requests in all, `hung` of them answered by hanging, `ok` answered 200."""

    def __init__(self):
        self.answer: int | str = 503
        self.probes = self.hung = self.ok = 0
        lock = threading.Lock()
        owner = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                answer = owner.answer
                with lock:
                    owner.probes += 1
                    owner.hung += answer == "hang"
                    owner.ok += answer == 200
                if answer == "hang":
                    time.sleep(5)
                    return
                self.send_response(int(answer))
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
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    p.kill()
    p.wait()


class Sidecar:
    """The sidecar process, its stderr lines collected as they come."""

    def __init__(self, p: subprocess.Popen):
        self.p = p
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.p.stderr:
            self.lines.append(line)

    def err(self) -> str:
        return "".join(self.lines)

    def wait_line(self, text: str) -> None:
        wait_for(f"the sidecar says {text!r}", lambda: text in self.err(), self)

    def stop(self) -> None:
        self.p.kill()
        self.p.wait()

    def wait_exit(self) -> int:
        code = self.p.wait(timeout=DEADLINE_S)
        self._reader.join(DEADLINE_S)
        return code


def start_sidecar(pid, url, address, sock=None) -> Sidecar:
    """Start the sidecar; with sock, return once its first ping arrived (Python start-up
    time is not part of what is measured)."""
    env = dict(os.environ, PYTHONPATH=str(SRC), NOTIFY_SOCKET=address, WATCHDOG_USEC=WATCHDOG_USEC)
    side = Sidecar(subprocess.Popen([sys.executable, "-m", "pdnode.node.watchdog", "--pid", str(pid), "--url", url,
                                     "--probe-timeout", "0.3"], env=env, stderr=subprocess.PIPE, text=True))
    if sock is not None:
        wait_pings(sock, 1, side)
    return side


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
    """Event-ordered, not timed: the probes /health counts and the sidecar's own lines say
    which decision came when, so a slow machine only makes the test take longer."""
    address, sock = notify_socket
    side = start_sidecar(engine.pid, health.url, address, sock)
    try:
        wait_pings(sock, 3, side)  # loading (/health 503, process alive): alive is enough
        health.answer = 200
        side.wait_line("/health answered 200")
        wait_pings(sock, 2, side)
        health.answer = "hang"
        # A probe that hangs has begun: every earlier probe has decided, its ping is queued.
        wait_for("a probe of the hanging /health", lambda: health.hung >= 1, side)
        drain(sock)
        hung = health.hung
        # two more probes have hung since: each decided (no ping) before the next one started
        wait_for("two more probes of the hanging /health", lambda: health.hung >= hung + 2, side)
        assert drain(sock) == 0, "pinged for an engine whose /health hangs"
        assert "not pinging systemd's watchdog (1 s): /health: timed out" in side.err()
        health.answer = 200
        wait_pings(sock, 2, side)
        side.wait_line("pdnode.watchdog: pinging again")
    finally:
        side.stop()


def test_no_pings_for_a_stopped_engine_even_while_loading(notify_socket, health, engine):
    address, sock = notify_socket
    side = start_sidecar(engine.pid, health.url, address, sock)
    try:
        wait_pings(sock, 2, side)
        os.kill(engine.pid, signal.SIGSTOP)
        side.wait_line("the engine process is stopped")
        drain(sock)  # the pings decided before the stop
        # the next rounds (about three in a second on a quiet machine; fewer on a busy one,
        # which can only hide a ping, not invent one) decide the same: no ping
        time.sleep(1.0)
        assert drain(sock) == 0, "pinged for a SIGSTOPped engine"
        os.kill(engine.pid, signal.SIGCONT)
        wait_pings(sock, 2, side)
        side.wait_line("pdnode.watchdog: pinging again")
    finally:
        side.stop()


def test_exits_with_the_engine(notify_socket, health, engine):
    address, _ = notify_socket
    side = start_sidecar(engine.pid, health.url, address)
    wait_for("the sidecar's first probe", lambda: health.probes >= 1, side)  # it watches the engine
    engine.kill()
    engine.wait()
    assert side.wait_exit() == 0


def test_launcher_starts_the_sidecar_outside_the_engines_children(notify_socket, health, tmp_path):
    """The launcher's exec path: the sidecar gets the notify socket, the engine does not,
    the sidecar is not the engine's child, and it ends when the engine ends."""
    address, sock = notify_socket
    health.answer = 200
    report = tmp_path / "engine-env"
    stop = tmp_path / "stop-engine"
    # The engine lives until the test has seen what it needs (not for a fixed time).
    engine_code = textwrap.dedent(f"""
        import os, time
        open({str(report)!r} + ".tmp", "w").write(",".join(k for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
                                                            if k in os.environ))
        os.replace({str(report)!r} + ".tmp", {str(report)!r})
        end = time.monotonic() + 600
        while not os.path.exists({str(stop)!r}) and time.monotonic() < end:
            time.sleep(0.05)
    """)
    script = textwrap.dedent(f"""
        import os, sys
        from pdnode.node import launcher
        env = dict(os.environ, WATCHDOG_PID=str(os.getpid()))
        pid = launcher.start_watchdog({health.url!r}, env)
        print(pid, flush=True)
        os.execve(sys.executable, [sys.executable, "-c", {engine_code!r}], env)
    """)
    env = dict(os.environ, PYTHONPATH=str(SRC), NOTIFY_SOCKET=address, WATCHDOG_USEC=WATCHDOG_USEC)
    eng = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    try:
        sidecar = int(eng.stdout.readline())
        wait_pings(sock, 2)
        ppid = int(Path(f"/proc/{sidecar}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid != eng.pid, "the sidecar must not be the engine's child"
        wait_for("the engine's report of its environment", report.exists)
        assert report.read_text() == "", "the engine must not see the notify socket"
    finally:
        stop.touch()
    eng.wait(timeout=DEADLINE_S)
    wait_for("the sidecar's exit after the engine's",
             lambda: watchdog.process_state(sidecar) in (None, "Z"))


def test_launcher_without_a_watchdog_starts_nothing():
    from pdnode.node import launcher
    assert launcher.start_watchdog("http://127.0.0.1:1/health", {"PATH": "/bin"}) is None


def test_an_unreachable_notify_socket_is_one_line_not_a_crash(tmp_path, health, engine):
    health.answer = 200
    side = start_sidecar(engine.pid, health.url, str(tmp_path / "missing"))
    # three probes: the first two rounds have each tried to ping (and said so once)
    wait_for("three rounds of the sidecar", lambda: health.probes >= 3, side)
    assert side.p.poll() is None, "the sidecar died"
    engine.kill()
    engine.wait()
    assert side.wait_exit() == 0
    err = side.err()
    assert err.count("cannot reach") == 1 and "Traceback" not in err, err
