"""One stand-in instance over two "hosts" (SGLang --nnodes 2): two processes on 127.0.0.1,
free ports picked at run time. What is proven is SGLang's behaviour (docs/multi-host.md):
rank 0 is not ready before rank 1 has joined its dist-init rendezvous, a lost rank takes the
other down (exit 1), a rank >= 1 serves only a dummy /health and waits for rank 0 to stop it.

Why a process ended is read from its log (connection closed, not the silence limit), never
from how fast it ended; every wait ends as soon as its event happened, or at once when a
process it waits on has died, and its deadline (DEADLINE_S) only a broken stand-in misses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .node import FAST_ENV, REPO, free_ports, request

ROUTE_ALL = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
DEADLINE_S = 120.0  # what takes a second or two on a quiet machine


def _args(port: int, dist_port: int, node_rank: int, **extra) -> dict:
    return {"model_path": "m", "host": "127.0.0.1", "port": port, "tp_size": 2, "nnodes": 2,
            "node_rank": node_rank, "dist_init_addr": f"127.0.0.1:{dist_port}", **extra}


class Proc:
    def __init__(self, tmp: Path, name: str, args: dict):
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(args))
        self.log_path = tmp / f"{name}.log"
        env = {**os.environ, **FAST_ENV, "PYTHONPATH": str(REPO / "src")}
        with self.log_path.open("wb") as log:
            self.p = subprocess.Popen([sys.executable, "-m", "pdnode.standin", str(path)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_exit(self, timeout: float = DEADLINE_S) -> int | None:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def wait_log(self, text: str, timeout: float = DEADLINE_S) -> None:
        """Until the log holds `text`; fails at the deadline or when the process exited first."""
        end = time.monotonic() + timeout
        while text not in self.log():
            assert self.p.poll() is None, f"exited {self.p.returncode} before logging {text!r}:\n{self.log()}"
            assert time.monotonic() < end, f"{text!r} not logged within {timeout:.0f} s:\n{self.log()}"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


def _status(url: str) -> int | None:
    try:
        return request("GET", url, timeout=1).status
    except OSError:
        return None


def _wait_status(url: str, want: int, timeout: float, *procs: Proc) -> float:
    """Seconds until GET url answers `want`; fails early when one of procs has exited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _status(url) == want:
            return time.monotonic() - t0
        for p in procs:
            assert p.p.poll() is None, f"exited {p.p.returncode} before {url} gave {want}:\n{p.log()}"
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer {want} within {timeout} s:\n" + "\n".join(p.log() for p in procs))


def _joined_ranks(tmp: Path, procs: list) -> tuple[Proc, Proc]:
    """Node ranks 0 and 1 of one decode, started and joined (rank 0 healthy)."""
    port0, port1, dist = free_ports(3)
    rank0 = Proc(tmp, "rank0", _args(port0, dist, 0))
    rank1 = Proc(tmp, "rank1", _args(port1, dist, 1))
    procs += [rank0, rank1]
    _wait_status(f"http://127.0.0.1:{port0}/health", 200, DEADLINE_S, rank0, rank1)
    return rank0, rank1


@pytest.fixture
def procs():
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()


@pytest.mark.integration
def test_prefill_ready_only_after_rank1_joins_and_dies_with_it(tmp_path, procs):
    port0, port1, bootstrap, dist = free_ports(4)
    rank0 = Proc(tmp_path, "rank0", _args(port0, dist, 0, disaggregation_mode="prefill",
                                          disaggregation_bootstrap_port=bootstrap,
                                          disaggregation_transfer_backend="mooncake_tcp"))
    procs.append(rank0)
    base0 = f"http://127.0.0.1:{port0}"
    _wait_status(base0 + "/health", 503, DEADLINE_S, rank0)  # HTTP up, "loading"
    rank0.wait_log("waiting for 1 other node rank(s)")  # the missing rank is what holds it back
    time.sleep(2.0)  # and keeps holding it (load can only shorten what this sees)
    assert _status(base0 + "/health") == 503
    assert _status(f"http://127.0.0.1:{bootstrap}{ROUTE_ALL}") != 200, "ranks registered before rank 1 joined"

    rank1 = Proc(tmp_path, "rank1", _args(port1, dist, 1, disaggregation_mode="prefill", enable_metrics=True,
                                          disaggregation_bootstrap_port=bootstrap,
                                          disaggregation_transfer_backend="mooncake_tcp"))
    procs.append(rank1)
    _wait_status(base0 + "/health", 200, DEADLINE_S, rank0, rank1)
    _wait_status(f"http://127.0.0.1:{bootstrap}{ROUTE_ALL}", 200, DEADLINE_S, rank0)
    # rank >= 1: SGLang's dummy health check server on its own host:port, no API
    _wait_status(f"http://127.0.0.1:{port1}/health", 200, DEADLINE_S, rank1)
    assert _status(f"http://127.0.0.1:{port1}/server_info") == 404
    assert _status(f"http://127.0.0.1:{port1}/metrics") == 200  # enable_metrics on rank 1
    assert "node rank 1 joined" in rank0.log()

    rank1.p.kill()
    code = rank0.wait_exit()
    assert code is not None and code != 0, f"rank 0 survived the loss of rank 1:\n{rank0.log()}"
    # at once, on the closed connection: not after the silence limit
    assert "node rank 1: connection" in rank0.log() and "silent for" not in rank0.log(), rank0.log()


@pytest.mark.integration
def test_rank1_waits_for_rank0_and_dies_with_it(tmp_path, procs):
    port0, port1, dist = free_ports(3)
    rank1 = Proc(tmp_path, "rank1", _args(port1, dist, 1))
    procs.append(rank1)
    time.sleep(2.0)  # rank 0 is not listening yet: rank 1 keeps retrying
    assert rank1.p.poll() is None, rank1.log()
    assert _status(f"http://127.0.0.1:{port1}/health") is None  # nothing served before the join

    rank0 = Proc(tmp_path, "rank0", _args(port0, dist, 0))
    procs.append(rank0)
    _wait_status(f"http://127.0.0.1:{port0}/health", 200, DEADLINE_S, rank0, rank1)
    _wait_status(f"http://127.0.0.1:{port1}/health", 200, DEADLINE_S, rank1)
    assert _status(f"http://127.0.0.1:{port1}/metrics") == 404  # no enable_metrics

    # a second process claiming node rank 1 is refused; the instance keeps running
    dup = Proc(tmp_path, "dup", _args(free_ports(1)[0], dist, 1))
    procs.append(dup)
    assert dup.wait_exit() == 1
    assert "already joined" in dup.log()
    assert rank0.p.poll() is None and rank1.p.poll() is None

    rank0.p.kill()
    code = rank1.wait_exit()
    assert code == 1, f"rank 1 exit {code} after rank 0 was killed:\n{rank1.log()}"
    # on the closed connection, not after the silence limit
    assert "node rank 0: connection" in rank1.log() and "silent for" not in rank1.log(), rank1.log()


@pytest.mark.integration
def test_sigterm_on_rank1_waits_for_rank0_like_sglang(tmp_path, procs):
    rank0, rank1 = _joined_ranks(tmp_path, procs)
    rank1.p.send_signal(signal.SIGTERM)
    rank1.wait_log("SIGTERM received on node_rank 1")  # handled (it fails here if rank 1 exited)
    assert rank1.p.poll() is None, "rank 1 stopped on SIGTERM; SGLang's waits for rank 0"
    rank0.p.send_signal(signal.SIGTERM)
    assert rank0.wait_exit() == 0, rank0.log()
    assert rank1.wait_exit() == 0, rank1.log()  # rank 0's shutdown, not a lost connection


@pytest.mark.integration
def test_a_silent_rank_counts_as_lost(tmp_path, procs):
    """A host cut off the network sends no FIN: a frozen rank 1 (SIGSTOP) stands in for it."""
    from pdnode.standin.rendezvous import SILENCE_S

    rank0, rank1 = _joined_ranks(tmp_path, procs)
    rank1.p.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert rank0.wait_exit(SILENCE_S + DEADLINE_S) == 1, rank0.log()
        assert time.monotonic() - t0 >= SILENCE_S - 1  # not before the silence limit
        assert f"node rank 1: silent for {SILENCE_S:.0f} s" in rank0.log()
    finally:
        rank1.p.send_signal(signal.SIGCONT)
    assert rank1.wait_exit() == 1, rank1.log()  # woken up, it finds rank 0 gone


@pytest.mark.integration
def test_missing_ranks_time_out_with_dist_timeout(tmp_path, procs):
    port0, port1, dist0, dist1 = free_ports(4)
    rank0 = Proc(tmp_path, "rank0", _args(port0, dist0, 0, dist_timeout=2))
    rank1 = Proc(tmp_path, "rank1", _args(port1, dist1, 1, dist_timeout=2))
    procs += [rank0, rank1]
    assert rank0.wait_exit() == 1
    assert f"node rank(s) 1 did not join 127.0.0.1:{dist0} within 2 s" in rank0.log()
    assert rank1.wait_exit() == 1
    assert f"node rank 0 at 127.0.0.1:{dist1} (dist_init_addr) not reachable within 2 s" in rank1.log()


# --- no processes: configuration --------------------------------------------------------------
@pytest.mark.parametrize(("changes", "needle"), [
    ({"nnodes": 3}, "tp_size x pp_size must be divisible by nnodes"),
    ({"node_rank": 2}, "node_rank=2, nnodes=2: node_rank must be below nnodes"),
    ({"dist_init_addr": None}, "dist_init_addr is required with nnodes=2"),
    ({"dist_init_addr": "10.0.0.2"}, "dist_init_addr='10.0.0.2': must be HOST:PORT"),
    ({"dist_init_addr": "fd00::2:32000"}, "must be in brackets"),
    ({"dist_init_addr": "10.0.0.2:70000"}, "port 70000 is not in 1-65535"),
    ({"dp_size": 2}, "multi-node data-parallel replicas are not supported"),
    ({"node_rank": -1}, "node_rank=-1: must be >= 0"),
])
def test_config_refuses_what_cannot_start(changes, needle):
    from pdnode.standin.config import ConfigError, server_settings_from_dict

    with pytest.raises(ConfigError, match=None) as err:
        server_settings_from_dict({**_args(30000, 32000, 1, tp_size=16), **changes})
    assert needle in str(err.value)


def test_config_reads_the_multi_node_fields():
    from pdnode.standin.config import server_settings_from_dict

    s = server_settings_from_dict(_args(30000, 32000, 1, tp_size=16, dist_init_addr="[fd00::2]:32000",
                                        dist_timeout=30))
    assert (s.nnodes, s.node_rank, s.dist_init, s.dist_timeout_s) == (2, 1, ("fd00::2", 32000), 30.0)
    assert (s.resolved["nnodes"], s.resolved["node_rank"]) == (2, 1)
    one = server_settings_from_dict({"model_path": "m"})
    assert (one.nnodes, one.node_rank, one.dist_init) == (1, 0, None)
