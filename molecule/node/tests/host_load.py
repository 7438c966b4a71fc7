"""The one load generator on the scenario's host, for the changes under load: the upgrade's
probe (src/pdnode/node/upgrade_probe.py with loadgen.py beside it, as
playbooks/upgrade.yml lays them) run by the host's python3 in the background through the
router, with the node's API key file; stopped by SIGTERM or its --max-seconds; its result
is loadgen's counts (what fails, by kind: src/pdnode/node/loadgen.py)."""

from __future__ import annotations

import base64
import json
import shlex
import time
from pathlib import Path

from pdnode.node import loadgen

NODE = Path(__file__).resolve().parents[3] / "src" / "pdnode" / "node"
FILES = {"probe.py": NODE / "upgrade_probe.py", "loadgen.py": NODE / "loadgen.py"}
# A zero-drop change under load: no request may stall this long, nor the load go this long
# without a success (a request takes well under a second on the stand-in), unless the load
# was that slow before the change (loadgen.PACE_FACTOR x its median request then).
STALL_S = 5.0
# The change begins this long after the load's start (the caller sleeps it): the requests
# before it give the load's pace.
CHANGE_AFTER_S = 4.0


def start(host, folder: str, *args: str) -> None:
    """Copy the probe into FOLDER on HOST and start it there (its result: FOLDER/result.json)
    with ARGS (e.g. --clients 4 --stream)."""
    for name, src in FILES.items():
        data = base64.b64encode(src.read_bytes()).decode()
        host.check_output(f"mkdir -p {folder} && echo {data} | base64 -d > {folder}/{name}")
    argv = ["python3", f"{folder}/probe.py", "--url", "http://127.0.0.1:8000", "--model", "demo-moe",
            "--key-file", "/etc/sglang-pd/api-key", "--out", f"{folder}/result.json",
            "--change-after", str(CHANGE_AFTER_S), *args]
    host.check_output(f"rm -f {folder}/result.json; nohup {shlex.join(argv)} > /dev/null 2>&1 & "
                      f"echo $! > {folder}/pid")


def stop(host, folder: str) -> None:
    host.run(f"kill -TERM $(cat {folder}/pid)")


def result(host, folder: str, wait_s: float = 120) -> dict:
    """The probe's result, once it wrote it (after its last requests ended)."""
    end = time.monotonic() + wait_s
    while not host.run(f"test -s {folder}/result.json").succeeded:
        assert time.monotonic() < end, "the load wrote no result"
        time.sleep(0.5)
    return json.loads(host.check_output(f"cat {folder}/result.json"))


def zero_drop(result: dict, min_requests: int) -> list[str]:
    """What a change that must lose no request got wrong, one line each with its counts."""
    return loadgen.zero_drop_problems(result, min_requests=min_requests, max_gap_s=STALL_S, max_request_s=STALL_S)
