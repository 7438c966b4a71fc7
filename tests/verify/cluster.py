"""N prefill + M decode stand-ins and the REAL sglang-router 0.3.2 in PD mode on 127.0.0.1,
on free ports: the multi-instance node of issue 10, for the verifier's tests.

    with standin_cluster(tmp_path, prefills=[[0, 1], [2, 3]], decodes=[[4, 5, 6, 7]]) as c:
        c.instances["prefill-1"].url, c.router_url, c.stop("prefill-1")

Instance ids, GPU lists and TP sizes are the plan's (nodeplan.plan_for builds the plan
of a running cluster with pdnode.core.plan.build.build_plan). Each process logs to <dir>/<id>.log.
The single-pair node of tests/standin/node.py is the same thing with one of each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from node import FAST_ENV, MODEL_CONFIG, REPO, NodeError, _stop, free_ports, request

ROUTE = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


@dataclasses.dataclass
class Member:
    id: str
    role: str
    gpus: list[int]
    port: int
    bootstrap_port: int | None = None
    args: dict[str, Any] = dataclasses.field(default_factory=dict)  # what its JSON holds

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bootstrap_url(self) -> str | None:
        return f"http://127.0.0.1:{self.bootstrap_port}" if self.bootstrap_port else None


@dataclasses.dataclass
class Cluster:
    dir: Path
    instances: dict[str, Member]
    router_port: int
    router_metrics_port: int
    api_key: str | None
    procs: dict[str, subprocess.Popen[bytes]]
    started_s: float = 0.0

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def router_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.router_metrics_port}/metrics"

    def stop(self, iid: str) -> None:
        """SIGKILL one instance (a crashed engine), and wait for it."""
        proc = self.procs[iid]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def log(self, iid: str) -> str:
        path = self.dir / f"{iid}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _layout(role: str, gpus: Sequence[int]) -> dict[str, Any]:
    """The ServerArgs layout of an instance on GPUS (as the 2P1D inventory has it)."""
    n = len(gpus)
    out: dict[str, Any] = {"tp_size": n, "base_gpu_id": gpus[0]}
    if role == "decode" and n > 1:
        out.update(attn_dp_size=n, ep_size=n)
    return out


def cluster_members(prefills: Sequence[Sequence[int]], decodes: Sequence[Sequence[int]],
                    common: Mapping[str, Any]) -> tuple[dict[str, Member], int, int]:
    """(members, router port, router metrics port) of a cluster, its ports drawn as the plan
    checks them: an instance whose layout has DP attention (_layout) also binds
    port+233..+239, and tests/verify/nodeplan.py's plan_for() builds the plan from them."""
    layouts = [(role, i, list(gpus), _layout(role, gpus))
               for role, groups in (("prefill", prefills), ("decode", decodes)) for i, gpus in enumerate(groups)]
    at, dp = 0, []  # the index of each instance's port in the draw: a prefill's bootstrap port follows it
    for role, _, _, layout in layouts:
        if layout.get("attn_dp_size", 1) > 1:
            dp.append(at)
        at += 2 if role == "prefill" else 1
    ports = iter(free_ports(at + 2, dp_attention_at=dp))
    members: dict[str, Member] = {}
    for role, i, gpus, layout in layouts:
        m = Member(f"{role}-{i}", role, gpus, next(ports))
        m.args = {**common, "port": m.port, "disaggregation_mode": role, **layout}
        if role == "prefill":
            m.bootstrap_port = next(ports)
            m.args["disaggregation_bootstrap_port"] = m.bootstrap_port
        members[m.id] = m
    return members, next(ports), next(ports)


@contextlib.contextmanager
def standin_cluster(directory: str | os.PathLike[str], *, prefills: Sequence[Sequence[int]],
                    decodes: Sequence[Sequence[int]], served_model_name: str = "fake-model",
                    api_key: str | None = None, env: Mapping[str, str] | None = None,
                    router_args: Sequence[str] = (), startup_timeout: float = 90.0) -> Iterator[Cluster]:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    model_dir = root / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    common = {"host": "127.0.0.1", "model_path": str(model_dir), "served_model_name": served_model_name,
              "enable_metrics": True}
    members, r_port, m_port = cluster_members(prefills, decodes, common)
    key_args: list[str] = []
    if api_key:
        (root / "api_key").write_text(api_key + "\n")
        (root / "api_key").chmod(0o600)
        key_args = ["--api-key-file", str(root / "api_key")]
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src")] + (
        [base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else []))
    base_env.update({"PYTHONUNBUFFERED": "1", **FAST_ENV, **(env or {})})
    procs: dict[str, subprocess.Popen[bytes]] = {}
    cluster = Cluster(root, members, r_port, m_port, api_key, procs)
    with contextlib.ExitStack() as stack:
        def spawn(name: str, argv: list[str], extra: Mapping[str, str] | None = None) -> None:
            log = open(root / f"{name}.log", "wb")  # noqa: SIM115 -- closed by the stack
            stack.callback(log.close)
            procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                                           env={**base_env, **(extra or {})}, start_new_session=True)

        stack.callback(lambda: _stop(procs))
        t0 = time.monotonic()
        for m in members.values():
            (root / f"{m.id}.json").write_text(json.dumps(m.args, indent=1))
            spawn(m.id, [sys.executable, "-m", "pdnode.standin", str(root / f"{m.id}.json"), *key_args])
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                "--host", "127.0.0.1", "--port", str(r_port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(m_port),
                "--worker-startup-check-interval", "1", "--shutdown-grace-period-secs", "1",
                *(["--api-key", api_key] if api_key else []), *router_args]
        for m in members.values():
            argv += ["--prefill", m.url, str(m.bootstrap_port)] if m.role == "prefill" else ["--decode", m.url]
        spawn("router", argv, {"HF_HUB_OFFLINE": "1", "NO_COLOR": "1"})
        checks = [(f"{m.id} /health", m.url + "/health") for m in members.values()]
        checks += [(f"{m.id} bootstrap /route", m.bootstrap_url + ROUTE) for m in members.values() if m.bootstrap_url]
        checks.append(("router /readiness", cluster.router_url + "/readiness"))
        for what, url in checks:
            _wait_200(what, url, startup_timeout, cluster)
        cluster.started_s = time.monotonic() - t0
        yield cluster


def _wait_200(what: str, url: str, timeout: float, cluster: Cluster) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} exited with {proc.returncode} while waiting for {what}\n"
                                f"{cluster.log(name)[-3000:]}")
        with contextlib.suppress(OSError):
            if request("GET", url, timeout=2.0).status == 200:
                return
        time.sleep(0.1)
    tails = "\n".join(f"--- {name}.log ---\n{cluster.log(name)[-1500:]}" for name in cluster.procs)
    raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
