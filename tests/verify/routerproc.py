"""A real router (sglang-router or smg) started by pdnode.node.router_launch for the router tests:
key files as the unit writes them, the process started, awaited and stopped."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def key_file(d: Path, name: str, value: str) -> str:
    f = d / name
    f.write_text(value + "\n")
    f.chmod(0o600)
    return str(f)


@contextlib.contextmanager
def router_process(argv: Sequence[str], d: Path, ready_url: str, env: Mapping[str, str] | None = None,
                   ready: Callable[[Any], bool] = lambda resp: True) -> Iterator[subprocess.Popen]:
    """Start ARGV (its output in D/router.log), wait up to 60 s for READY_URL to answer 200 (and
    READY(response)), yield the process, and stop it."""
    from node import request

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    with open(d / "router.log", "wb") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        end = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                resp = request("GET", ready_url, timeout=2)
                if resp.status == 200 and ready(resp):
                    break
            assert proc.poll() is None and time.monotonic() < end, (d / "router.log").read_text()[-3000:]
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def call(node: Any, method: str, path: str, key: str | None, body: Any = None) -> Any:
    """METHOD NODE's router PATH with KEY as the bearer token (none: no Authorization header)."""
    from node import request

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return request(method, node.router_url + path, body, headers=headers, timeout=30)


def decode_out_and_back(node: Any, decode_id: str, decode_url: str, admin: str, client: str) -> None:
    """Take decode out of NODE's router with the ADMIN key (the router then is not ready) and
    put it back (ready again), as an operator does around a decode restart."""
    def worker_types() -> list[str]:
        resp = call(node, "GET", "/workers", admin)
        assert resp.status == 200, resp.text
        return [w["worker_type"] for w in resp.json()["workers"]]

    resp = call(node, "DELETE", f"/workers/{decode_id}", admin)
    assert resp.status in (200, 202), resp.text
    end = time.monotonic() + 120  # these waits end when the router has changed (a second or two)
    while "decode" in worker_types():
        assert time.monotonic() < end
        time.sleep(0.2)
    assert call(node, "GET", "/readiness", None).status == 503
    resp = call(node, "POST", "/workers", admin, {"url": decode_url, "worker_type": "decode", "api_key": client})
    assert resp.status in (200, 202), resp.text
    end = time.monotonic() + 120
    while call(node, "GET", "/readiness", None).status != 200:
        assert time.monotonic() < end, worker_types()
        time.sleep(0.2)
