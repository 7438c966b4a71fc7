"""A stand-in node of any layout on 127.0.0.1, from the plan's own ServerArgs, plus a
closed-loop load that reports what `pdnode bench --json` reports (pdnode.bench/1).

    with layout_node(tmp, variables) as node:     # variables: an inventory's pdnode_* values
        report = closed_loop(node, concurrency=16, input_len=256, output_len=64, seconds=10)

Each engine gets the ServerArgs build_plan derives for it (ports and model path replaced
by free local ones) and its plan environment; the real sglang-router joins them in PD
mode with the plan's policy. Standard library only, like node.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .node import MODEL_CONFIG, REPO, NodeError, _status, _stop, _wait, free_ports

from pdnode.core.plan.build import build_plan
from pdnode.verify.metrics import Snapshot, histogram_delta, merge, parse


@dataclasses.dataclass
class LayoutNode:
    dir: Path
    plan: dict[str, Any]
    engines: dict[str, dict[str, Any]]  # id -> {"url", "args", "role"}
    router_port: int
    procs: dict[str, subprocess.Popen[bytes]]

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def logs_tail(self, lines: int = 20) -> str:
        out = []
        for name in self.procs:
            path = self.dir / f"{name}.log"
            tail = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            out.append(f"--- {name}.log ---\n" + "\n".join(tail))
        return "\n".join(out)

    def layout(self) -> dict[str, list[dict[str, Any]]]:
        """The bench report's layout block."""
        out: dict[str, list[dict[str, Any]]] = {"prefill": [], "decode": []}
        for sid, eng in self.engines.items():
            a = eng["args"]
            out[eng["role"]].append({"id": sid, "gpus": eng["gpus"], "tp_size": a.get("tp_size", 1),
                                     "dp_size": a.get("dp_size", 1), "attn_dp_size": a.get("attn_dp_size", 1),
                                     "ep_size": a.get("ep_size", 1)})
        return out


def layout_ports(services: Sequence[Mapping[str, Any]]) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """(router port, metrics port, {service id: (port, bootstrap port)}) for the plan's
    engine SERVICES, drawn as the plan checks them: a service whose ServerArgs have DP
    attention also binds port+233..+239."""
    dp = [2 + 2 * k for k, svc in enumerate(services) if int(svc["args"].get("attn_dp_size") or 1) > 1]
    ports = free_ports(2 + 2 * len(services), dp_attention_at=dp)
    return ports[0], ports[1], {svc["id"]: (ports[2 + 2 * k], ports[3 + 2 * k]) for k, svc in enumerate(services)}


@contextlib.contextmanager
def layout_node(directory: Path, variables: Mapping[str, Any], env: Mapping[str, str] | None = None,
                startup_timeout: float = 90.0) -> Iterator[LayoutNode]:
    plan = build_plan(dict(variables), "local").as_dict()
    services = [s for s in plan["services"].values() if s["role"] in ("prefill", "decode")]
    directory.mkdir(parents=True, exist_ok=True)
    model_dir = directory / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
    router_port, metrics_port, engine_ports = layout_ports(services)
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src")] + (
        [base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else []))
    base_env["PYTHONUNBUFFERED"] = "1"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    engines: dict[str, dict[str, Any]] = {}
    node = LayoutNode(dir=directory, plan=plan, engines=engines, router_port=router_port, procs=procs)
    with contextlib.ExitStack() as stack:
        def spawn(name: str, argv: list[str], extra: Mapping[str, str]) -> None:
            log = open(directory / f"{name}.log", "wb")
            stack.callback(log.close)
            procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=directory,
                                           env={**base_env, **extra}, start_new_session=True)

        stack.callback(lambda: _stop(procs))
        prefill_argv: list[str] = []
        decode_argv: list[str] = []
        for svc in services:
            args = dict(svc["args"])
            port, boot = engine_ports[svc["id"]]
            args.update(host="127.0.0.1", port=port, model_path=str(model_dir))
            if svc["role"] == "prefill":
                args["disaggregation_bootstrap_port"] = boot
            path = directory / f"{svc['id']}.json"
            path.write_text(json.dumps(args, indent=1))
            url = f"http://127.0.0.1:{args['port']}"
            engines[svc["id"]] = {"url": url, "args": args, "role": svc["role"], "gpus": svc["gpus"]}
            spawn(svc["id"], [sys.executable, "-m", "pdnode.standin", str(path)],
                  {**svc.get("environment", {}), **(env or {})})
            if svc["role"] == "prefill":
                prefill_argv += ["--prefill", url, str(boot)]
            else:
                decode_argv += ["--decode", url]
        policy = plan["services"]["router"]["args"].get("policy") or "round_robin"
        spawn("router", [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                         *prefill_argv, *decode_argv, "--host", "127.0.0.1", "--port", str(router_port),
                         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                         "--policy", policy, "--worker-startup-check-interval", "1",
                         "--shutdown-grace-period-secs", "1"], {"HF_HUB_OFFLINE": "1", "NO_COLOR": "1"})
        for sid, eng in engines.items():
            _wait(f"{sid} /health", lambda u=eng["url"]: _status(u + "/health") == 200, startup_timeout, node)
        _wait("router /readiness", lambda: _status(node.router_url + "/readiness") == 200, startup_timeout, node)
        yield node


def _one_request(port: int, body: bytes, timeout: float) -> tuple[float, float, int]:
    """(ttft, mean itl, tokens) of one streamed /generate through the router."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t0 = time.monotonic()
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise NodeError(f"/generate answered {resp.status}: {resp.read()[:300]!r}")
        times = []
        while True:
            line = resp.readline()  # de-chunked; the connection stays open after the stream
            if not line or line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data: "):
                times.append(time.monotonic())
        if not times:
            raise NodeError("/generate streamed no token")
        itl = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        return times[0] - t0, itl, len(times)
    finally:
        conn.close()


def _decode_metrics(node: LayoutNode) -> Snapshot:
    """The decode engines' scrapes as one (their TTFT, ITL and e2e histograms)."""
    snaps = {}
    for sid, eng in node.engines.items():
        if eng["role"] == "decode":
            conn = http.client.HTTPConnection("127.0.0.1", int(eng["url"].rsplit(":", 1)[1]), timeout=60)
            try:
                conn.request("GET", "/metrics")
                snaps[sid] = parse(conn.getresponse().read().decode())
            finally:
                conn.close()
    return merge(snaps)


def closed_loop(node: LayoutNode, *, concurrency: int, input_len: int, output_len: int,
                seconds: float) -> dict[str, Any]:
    """`concurrency` clients, each sending its next request when the last one ends, for
    `seconds`. The clients all start at once, so the first round is a burst, not the
    steady state: what counts starts once every client has finished its first request.

    The report's latencies are the engines' (the decodes' TTFT, ITL and e2e histograms
    over the counted requests), on the stand-in the simulated GPU's; its throughput is
    Little's law over them (a closed loop without think time: X = C / mean e2e). The
    client's clock, which on a busy machine measures the CPU, is kept under "client" for
    information only."""
    t_start = time.monotonic()
    t_stop = t_start + seconds
    lock = threading.Lock()
    samples: list[tuple[float, float, float, float, int]] = []  # start, end, ttft, itl, tokens
    first_done: list[float] = []
    errors: list[str] = []
    before: list[Snapshot] = []  # the decodes' metrics once every client finished its first request

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < t_stop and not errors:
            # distinct first word: no two prompts share a prefix beyond it
            text = f"c{k}r{i} " + " ".join(["word"] * (input_len - 1))
            body = json.dumps({"text": text, "stream": True, "sampling_params": {
                "max_new_tokens": output_len, "ignore_eos": True, "temperature": 0}}).encode()
            t0 = time.monotonic()
            try:
                ttft, itl, tokens = _one_request(node.router_port, body, timeout=120)
                if i == 0:
                    with lock:
                        first_done.append(time.monotonic())
                        last_first = len(first_done) == concurrency
                    if last_first:
                        before.append(_decode_metrics(node))
            except (OSError, NodeError) as exc:
                with lock:
                    errors.append(str(exc))
                return
            if i:
                with lock:
                    samples.append((t0, time.monotonic(), ttft, itl, tokens))
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise NodeError(f"{len(errors)} request(s) failed: {errors[0]}\n{node.logs_tail()}")
    if len(first_done) < concurrency or max(first_done) >= t_stop or not before:
        raise NodeError(f"the run ended before every client finished its first request; run longer than {seconds} s")
    window_start = max(first_done)
    counted = [s for s in samples if s[0] >= window_start]
    done_in_window = [s for s in samples if window_start <= s[1] <= t_stop]
    duration = t_stop - window_start
    if not counted:
        raise NodeError(f"no request started after the first round; run longer than {seconds} s")
    after = _decode_metrics(node)
    engine = {}
    for key, family in (("ttft", "sglang:time_to_first_token_seconds"), ("itl", "sglang:inter_token_latency_seconds"),
                        ("e2e", "sglang:e2e_request_latency_seconds")):
        delta = histogram_delta(before[0], after, family)
        if delta is None or not delta.count > 0:
            raise NodeError(f"the decodes' {family} did not grow over the run\n{node.logs_tail()}")
        engine[key] = delta.mean

    def mean(vals: list[float]) -> float:
        return sum(vals) / len(vals)

    return {
        "schema": "pdnode.bench/1", "host": "local", "client": {
            "kind": "tests/standin/layout_node.py",
            # the client's clock: informational (on a busy machine it measures the CPU)
            "completed_in_window_per_s": len(done_in_window) / duration,
            "ttft_s_mean": mean([s[2] for s in counted]), "itl_s_mean": mean([s[3] for s in counted]),
            "e2e_s_mean": mean([s[1] - s[0] for s in counted])},
        "layout": node.layout(),
        "workload": {"requests": len(samples), "concurrency": concurrency, "rate": None,
                     "input_len": input_len, "output_len": output_len, "range_ratio": 1.0},
        "results": {
            "duration_s": duration, "completed": len(counted), "failed": 0,
            # Little's law for a closed loop without think time (X = C / mean latency): exact
            # in steady state and, unlike completions / window, not biased by requests
            # straddling the window's edges when a request lasts a sizeable part of it
            "request_throughput": concurrency / engine["e2e"],
            "input_token_throughput": concurrency / engine["e2e"] * input_len,
            "output_token_throughput": concurrency / engine["e2e"] * output_len,
            "ttft_s": {"mean": engine["ttft"]},
            "itl_s": {"mean": engine["itl"]},
            "e2e_s": {"mean": engine["e2e"]},
        },
        "instances": {},
    }
