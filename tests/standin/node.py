"""Start and stop a whole stand-in PD node on 127.0.0.1: prefill + decode stand-ins and the
real sglang-router 0.3.2 in PD mode, on free ports picked at run time.

    from node import standin_node   # with tests/standin on sys.path (tests/verify/conftest.py does)
    # or: from standin.node import standin_node, with tests/ on sys.path

    with standin_node(tmp_path) as node:    # returns once the router's /readiness is 200
        node.router_url, node.prefill_url, node.decode_url, node.bootstrap_url
        node.get(node.router_url + "/workers")
        node.post(node.router_url + "/generate", {"text": "hi"})
        node.set_faults("prefill", ["error500"])
        node.metrics("prefill")              # {family name: [(sample name, labels, value)]}

Standard library only (the verification tests may run outside the project venv, as long
as the interpreter can import pdnode.standin and sglang_router). Each process logs to
<dir>/<role>.log; a start failure raises NodeError with the tail of every log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Mapping, Sequence

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "max_position_embeddings": 32768,
}
# Short latencies: a test node answers in milliseconds.
FAST_ENV = {
    "PDNODE_SIM_PREFILL_MS_PER_TOKEN": "0.01",
    "PDNODE_SIM_DECODE_MS_PER_TOKEN": "2",
    "PDNODE_SIM_KV_BYTES_PER_TOKEN": "16384",
    "PDNODE_SIM_KV_POOL_MB": "64",
}


class NodeError(RuntimeError):
    pass


def free_ports(n: int, dp_attention_at: Sequence[int] = ()) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (bound together, then released).

    The ports at the indexes in DP_ATTENTION_AT go to instances with DP attention, which also
    bind port+233..+239: build_plan refuses a set where those hit another port, so such a
    draw is drawn again (a random draw of a node's ports did that about once in 500 suites).
    A helper that draws a node's ports names every such instance's index (the plan's view
    of the node; tests/standin/test_port_draws.py builds the plan of 10,000 draws of each)."""
    for _ in range(50):
        got = _bind_free(n)
        if plan_accepts(got, dp_attention_at):
            return got
    raise NodeError(f"no {n} free ports without a DP-attention overlap in 50 draws")


def plan_accepts(ports: Sequence[int], dp_attention_at: Sequence[int]) -> bool:
    """Whether the plan's own port rule (pdnode.core.rules.ports.allocate, which build_plan
    runs) accepts PORTS: those at DP_ATTENTION_AT as HTTP ports of instances with DP
    attention, the others as plain listeners. The rule itself, not a copy of it: a copy
    that missed the DP-attention range let a draw through that the plan then refused."""
    from pdnode.core.rules.instances import Instance
    from pdnode.core.rules.ports import allocate

    class Refusals(list):  # the plan's collector, as much of it as allocate() uses
        def error(self, *finding: Any) -> None:
            self.append(finding)

        def warn(self, *finding: Any) -> None:
            pass  # a warning is no refusal

    dp = set(dp_attention_at)
    instances = [Instance(role="decode", index=k, name=str(k), gpus=[0, 1], tp_size=2, dp_size=1, attn_dp_size=2,
                          ep_size=None, moe_dense_tp_size=None, enable_dp_lm_head=False, port=ports[i],
                          bootstrap_port=None, nccl_port=None, mem_fraction_static=0.8)
                 for k, i in enumerate(sorted(dp))]
    listeners = {f"listener-{i}.port": (f"port {i}", port) for i, port in enumerate(ports) if i not in dp}
    refusals = Refusals()
    allocate(refusals, instances, listeners)
    return not refusals


def standin_node_ports(prefill_args: Mapping[str, Any] | None = None) -> dict[str, int]:
    """standin_node's five ports, drawn as the plan checks them: tests/verify/nodeplan.py's
    plan_for() gives the decode DP attention (demo's layout), and the prefill has it when
    PREFILL_ARGS set attn_dp_size above 1."""
    names = ("prefill", "bootstrap", "decode", "router", "router_metrics")
    dp = [names.index("decode")]
    if int((prefill_args or {}).get("attn_dp_size", 1)) > 1:
        dp.append(names.index("prefill"))
    return dict(zip(names, free_ports(len(names), dp)))


# Where the test nodes listen: below the kernel's ephemeral range, whose ports any
# outgoing connection on the machine may take between a draw and a late bind (a router
# started after its engines lost its port that way to a busy CI: "Address already in
# use"), and below SGLang's DP replicas' NCCL draw (22000-29999, pdnode.core.rules.ports), where
# the plan warns; 240 below it leaves room for a DP-attention instance's internal ports.
LISTEN_PORTS_FROM = 10000


def _listen_ports() -> range:
    from pdnode.core.rules.ports import REPLICA_NCCL_DRAW

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    return range(LISTEN_PORTS_FROM, min(REPLICA_NCCL_DRAW.start - 240, ephemeral_low))


def _bind_free(n: int) -> list[int]:
    """N distinct ports of _listen_ports() that bind now (held together, then released)."""
    import random

    pool = _listen_ports()
    draw = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _ in range(200 * n):
            if len(socks) == n:
                break
            port = draw.choice(pool)
            if any(s.getsockname()[1] == port for s in socks):
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            raise NodeError(f"no {n} free ports in {pool.start}-{pool.stop - 1}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclasses.dataclass
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str]  # names lower-cased

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def sse(self) -> list[Any]:
        """The data: payloads of an SSE body, JSON-decoded ('[DONE]' stays a string)."""
        out: list[Any] = []
        for block in self.text.split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), f"not an SSE data line: {block!r}"
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out


def request(method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
            timeout: float = 30.0) -> Response:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(), {k.lower(): v for k, v in resp.headers.items()})
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read(), {k.lower(): v for k, v in (exc.headers or {}).items()})


def parse_metrics(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Prometheus text -> {family: [(sample, labels, value)]} (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = [(s.name, dict(s.labels), s.value) for s in fam.samples]
    return out


def metric_sum(families: Mapping[str, list[tuple[str, dict[str, str], float]]], sample: str,
               **labels: str) -> float:
    """Sum of every sample called `sample` (e.g. 'sglang:prompt_tokens_total') matching labels."""
    total = 0.0
    for samples in families.values():
        for name, lab, value in samples:
            if name == sample and all(lab.get(k) == v for k, v in labels.items()):
                total += value
    return total


@dataclasses.dataclass
class StandinNode:
    dir: Path
    ports: dict[str, int]
    api_key: str | None
    procs: dict[str, subprocess.Popen[bytes]]
    started_s: float = 0.0  # seconds from the first spawn to router readiness
    exit_codes: dict[str, int | None] = dataclasses.field(default_factory=dict)  # after the block

    @property
    def prefill_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prefill']}"

    @property
    def decode_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['decode']}"

    @property
    def bootstrap_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['bootstrap']}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['router']}"

    @property
    def router_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['router_metrics']}/metrics"

    def url(self, role: str) -> str:
        return {"prefill": self.prefill_url, "decode": self.decode_url, "router": self.router_url,
                "bootstrap": self.bootstrap_url}[role]

    def _auth(self, auth: bool) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if (auth and self.api_key) else {}

    def get(self, url: str, auth: bool = True, timeout: float = 30.0) -> Response:
        return request("GET", url, headers=self._auth(auth), timeout=timeout)

    def post(self, url: str, body: Any, auth: bool = True, timeout: float = 60.0) -> Response:
        return request("POST", url, body, headers=self._auth(auth), timeout=timeout)

    def set_faults(self, role: str, faults: Sequence[str]) -> list[str]:
        resp = self.post(self.url(role) + "/sim/faults", {"faults": list(faults)})
        if resp.status != 200:
            raise NodeError(f"POST /sim/faults on {role}: {resp.status} {resp.text}")
        return resp.json()["faults"]

    def recent_requests(self, role: str) -> list[dict[str, Any]]:
        return self.get(self.url(role) + "/sim/requests").json()["requests"]

    def metrics(self, role: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
        resp = self.get(self.url(role) + "/metrics")
        if resp.status != 200:
            raise NodeError(f"GET /metrics on {role}: {resp.status}")
        return parse_metrics(resp.text)

    def pd_request(self, path: str, body: dict[str, Any], room: int | None = None,
                   timeout: float = 60.0) -> tuple[Response, Response]:
        """What the router does: the same body, with bootstrap_host/port/room, to prefill
        and decode at the same time. Returns (prefill response, decode response)."""
        body = dict(body, bootstrap_host="127.0.0.1", bootstrap_port=self.ports["bootstrap"],
                    bootstrap_room=room if room is not None else int.from_bytes(os.urandom(8), "big") >> 1)
        results: dict[str, Response] = {}

        def send(role: str) -> None:
            results[role] = self.post(self.url(role) + path, body, timeout=timeout)

        threads = [threading.Thread(target=send, args=(role,)) for role in ("prefill", "decode")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results["prefill"], results["decode"]

    def log(self, role: str) -> str:
        path = self.dir / f"{role}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs_tail(self, lines: int = 30) -> str:
        out = []
        for role in self.procs:
            tail = self.log(role).splitlines()[-lines:]
            out.append(f"--- {role}.log (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(out)


def _wait(what: str, check, timeout: float, node: Any) -> None:
    """Poll check() until true; NODE (a StandinNode or a LayoutNode): its procs and logs_tail()."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in node.procs.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} exited with {proc.returncode} while waiting for {what}\n{node.logs_tail()}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}\n{node.logs_tail()}")


def _status(url: str, headers: Mapping[str, str] | None = None) -> int:
    return request("GET", url, headers=headers, timeout=2.0).status


def _stop(procs: Mapping[str, subprocess.Popen[bytes]], timeout: float = 10.0) -> dict[str, int | None]:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes: dict[str, int | None] = {}
    deadline = time.monotonic() + timeout
    for role, proc in procs.items():
        try:
            codes[role] = proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes[role] = proc.wait()
    return codes


@contextlib.contextmanager
def standin_node(
    directory: str | os.PathLike[str] | None = None,
    *,
    served_model_name: str = "fake-model",
    prefill_args: Mapping[str, Any] | None = None,
    decode_args: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    prefill_env: Mapping[str, str] | None = None,
    decode_env: Mapping[str, str] | None = None,
    api_key: str | None = None,
    router: bool = True,
    router_args: Sequence[str] = (),
    startup_timeout: float = 60.0,
    python: str = sys.executable,
    standin_python: str | None = None,
) -> Iterator[StandinNode]:
    """A running node; on exit every process gets SIGTERM (then SIGKILL after 10 s).

    prefill_args / decode_args add or override ServerArgs fields (defaults: prefill TP 4,
    decode TP 4 with attention DP 4 and EP 4, metrics on); env is added to every stand-in's
    environment after FAST_ENV, prefill_env / decode_env to one side only. `python` runs
    the router (and the stand-ins unless `standin_python` names another interpreter).
    """
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="standin-node-"))
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        model_dir = root / "model"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG))
        ports = standin_node_ports(prefill_args)
        p_port, boot_port, d_port, r_port, m_port = (ports[k] for k in ("prefill", "bootstrap", "decode", "router",
                                                                        "router_metrics"))
        common = {"host": "127.0.0.1", "model_path": str(model_dir), "served_model_name": served_model_name,
                  "enable_metrics": True}
        pargs = {**common, "port": p_port, "disaggregation_mode": "prefill",
                 "disaggregation_bootstrap_port": boot_port, "tp_size": 4, "base_gpu_id": 0,
                 **(prefill_args or {})}
        dargs = {**common, "port": d_port, "disaggregation_mode": "decode", "tp_size": 4,
                 "attn_dp_size": 4, "ep_size": 4, "base_gpu_id": 4, **(decode_args or {})}
        (root / "prefill.json").write_text(json.dumps(pargs, indent=1))
        (root / "decode.json").write_text(json.dumps(dargs, indent=1))
        key_args: list[str] = []
        if api_key:
            key_file = root / "api_key"
            key_file.write_text(api_key + "\n")
            key_file.chmod(0o600)
            key_args = ["--api-key-file", str(key_file)]

        base_env = dict(os.environ)
        base_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "src")] + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else []))
        base_env["PYTHONUNBUFFERED"] = "1"
        base_env.update(FAST_ENV)
        base_env.update(env or {})
        procs: dict[str, subprocess.Popen[bytes]] = {}
        node = StandinNode(dir=root, ports=ports, api_key=api_key, procs=procs)

        def spawn(role: str, argv: list[str], extra_env: Mapping[str, str] | None) -> None:
            log = open(root / f"{role}.log", "wb")
            stack.callback(log.close)
            procs[role] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                                           env={**base_env, **(extra_env or {})}, start_new_session=True)

        stack.callback(lambda: node.exit_codes.update(_stop(procs)))
        t0 = time.monotonic()
        sp = standin_python or python
        spawn("prefill", [sp, "-m", "pdnode.standin", str(root / "prefill.json"), *key_args], prefill_env)
        spawn("decode", [sp, "-m", "pdnode.standin", str(root / "decode.json"), *key_args], decode_env)
        if router:
            # Started together with the workers: it retries registration every second
            # (its Python launcher alone takes seconds to import).
            argv = [
                python, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                "--prefill", node.prefill_url, str(boot_port), "--decode", node.decode_url,
                "--host", "127.0.0.1", "--port", str(r_port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(m_port),
                "--worker-startup-check-interval", "1", "--shutdown-grace-period-secs", "1",
                *(["--api-key", api_key] if api_key else []),
                *router_args,
            ]
            spawn("router", argv, {"HF_HUB_OFFLINE": "1", "NO_COLOR": "1"})
        _wait("prefill /health", lambda: _status(node.prefill_url + "/health") == 200, startup_timeout, node)
        _wait("bootstrap /route", lambda: _status(
            node.bootstrap_url + "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        ) == 200, startup_timeout, node)
        _wait("decode /health", lambda: _status(node.decode_url + "/health") == 200, startup_timeout, node)
        if router:
            _wait("router /readiness", lambda: _status(node.router_url + "/readiness") == 200, startup_timeout, node)
        node.started_s = time.monotonic() - t0
        yield node
