"""`pdnode bench INVENTORY`: load through the router, measured by SGLang's own client.

The load client is `sglang.benchmark.serving` (the module behind `python -m
sglang.bench_serving`) from the CPU SGLang environment that scripts/sglang-validator
builds on the controller (no second environment). It sends random token ids
(--dataset-name random-ids --tokenize-prompt) to the router's /generate, streaming, with
ignore_eos: prompt lengths are exact whatever the model's tokenizer, output lengths are
the ones asked for, and both are counted by the server. docs/bench.md says why this
client, and what each number means.

Per-instance work comes from the engines' own counters (requests, prompt and generation
tokens), read on the node (they listen on its loopback) before and after the load:
playbooks/bench.yml runs `python -m pdnode.node.bench_counters` there; with
ansible_connection: local this machine is the node and they are read directly.

Exit codes: 0 every request completed, 1 bad input or some requests failed, 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..core import resources
from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from . import bench_report

CLIENT_MODULE = "sglang.benchmark.serving"
CLIENT_NAME = "sglang.bench_serving"
# bench_client.py runs CLIENT_MODULE and keeps each request's start time and latencies,
# which the client measures but does not write; copied beside the datasets stub as this:
WRAPPER_MODULE = "pdnode_bench_client"
# What the inventory's relative controller paths (the key file) are relative to.
REPO = resources.controller_dir()
# The demo model's tokenizer (tokenizer.json beside its config.json): 1024 ids, the demo
# model's vocab_size, counting text like the stand-in. The client only draws random ids
# below its vocabulary size from it, so it serves any model with a larger vocabulary.
DEFAULT_TOKENIZER = resources.resource("playbooks", "files", "demo-moe")
WARMUP_TIMEOUT_S = 120.0
COUNTERS_TIMEOUT_S = 300.0
DEFAULTS = {"requests": 64, "concurrency": 8, "input_len": 512, "output_len": 64, "range_ratio": 1.0}
# bench_serving imports HF `datasets` at module level for datasets we never use (MMMU);
# the validator environment does not have it (pyarrow and pandas for nothing). A stub
# on the client's path satisfies the import; selecting such a dataset would fail loudly.
_DATASETS_STUB = ('"""pdnode bench: stand-in for HF datasets (not needed by --dataset-name random-ids)."""\n\n\n'
                  "def load_dataset(*args, **kwargs):\n"
                  "    raise RuntimeError('HF datasets is not installed in the pdnode bench client environment')\n")


class BenchError(Exception):
    """One line for the user; .code is the exit code."""

    def __init__(self, message: str, code: int = EXIT_CANNOT_RUN) -> None:
        super().__init__(message)
        self.code = code


# --- the workload ---------------------------------------------------------------------------
def _int_arg(name: str, raw: str | None, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise BenchError(f"{name} {raw!r} is not an integer from {low} to {high}: give e.g. {name} {default}", EXIT_FAILED)
    return value


def workload(args: argparse.Namespace) -> dict[str, Any]:
    """The validated workload, or BenchError (exit 1) naming the option, the value and the fix."""
    requests = _int_arg("--requests", args.requests, DEFAULTS["requests"], 1, 1_000_000)
    input_len = _int_arg("--input-len", args.input_len, DEFAULTS["input_len"], 1, 10_000_000)
    output_len = _int_arg("--output-len", args.output_len, DEFAULTS["output_len"], 1, 10_000_000)
    rate = None
    concurrency = None
    if args.rate is not None:
        try:
            rate = float(args.rate)
        except ValueError:
            rate = math.nan
        if not (math.isfinite(rate) and rate > 0):
            raise BenchError(f"--rate {args.rate!r} is not a positive number of requests per second: give e.g. "
                             "--rate 4 (or --concurrency C for a closed loop)", EXIT_FAILED)
    else:
        concurrency = _int_arg("--concurrency", args.concurrency, DEFAULTS["concurrency"], 1, 100_000)
    try:
        ratio = float(args.range_ratio) if args.range_ratio is not None else DEFAULTS["range_ratio"]
    except ValueError:
        ratio = math.nan
    if not (math.isfinite(ratio) and 0 < ratio <= 1):
        raise BenchError(f"--range-ratio {args.range_ratio!r} is not in (0, 1]: 1 gives fixed lengths, 0.5 lengths "
                         "drawn uniformly from half to the full --input-len/--output-len", EXIT_FAILED)
    warmup = _int_arg("--warmup", args.warmup, 1, 0, 1000)
    seed = _int_arg("--seed", args.seed, 1, 0, 2**31 - 1)
    return {"requests": requests, "concurrency": concurrency, "rate": rate, "input_len": input_len,
            "output_len": output_len, "range_ratio": ratio, "dataset": "random-ids", "warmup_requests": warmup,
            "seed": seed}


# --- where the router is ----------------------------------------------------------------------
def _wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "", "[::]")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


def checked_base_url(raw: str) -> str:
    """--base-url as given, or BenchError (exit 1): http(s)://HOST[:PORT] and nothing else."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(raw.strip())
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        parts, port_ok = None, False
    if (parts is None or not port_ok or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.path.strip("/") or parts.query or parts.fragment or parts.username):
        raise BenchError(f"--base-url {raw!r} is not http(s)://HOST[:PORT]: give the router's root, e.g. "
                         "--base-url http://10.0.0.5:8000", EXIT_FAILED)
    return f"{parts.scheme}://{parts.netloc}"


def _url_hostname(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).hostname or ""


def docker_address(container: str) -> str:
    """The container's address on its docker network (the demo node's router is there)."""
    try:
        out = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                              container], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"cannot ask docker for the address of {container}: {exc}; "
                         "give --base-url http://ADDRESS:PORT") from None
    addresses = out.stdout.split()
    if out.returncode != 0 or not addresses:
        raise BenchError(f"docker knows no address for container {container} ({out.stderr.strip()[:200]}); "
                         "give --base-url http://ADDRESS:PORT")
    return addresses[0]


def router_base_url(plan: Mapping[str, Any], variables: Mapping[str, Any], host: str,
                    resolve_docker: Callable[[str], str] = docker_address) -> str:
    """http://ADDRESS:PORT of the router as this machine reaches it."""
    router = (plan.get("services") or {}).get("router") or {}
    args = router.get("args") or {}
    bind, port = str(args.get("host", "0.0.0.0")), int(args.get("port", 8000))
    conn = str(variables.get("ansible_connection") or "ssh")
    if conn == "local":
        address = "127.0.0.1" if _wildcard(bind) else bind
    elif _loopback(bind):
        raise BenchError(f"the router listens on {bind} only (the node's loopback), unreachable from here: run on "
                         "the node, or tunnel its port and give --base-url http://127.0.0.1:PORT")
    elif not _wildcard(bind):
        address = bind
    elif conn in ("community.docker.docker", "docker"):
        address = resolve_docker(str(variables.get("ansible_host") or host))
    else:
        address = str(variables.get("ansible_host") or host)
    return f"http://{_url_host(address)}:{port}"


# --- the client ------------------------------------------------------------------------------
def client_python(override: str | None) -> str:
    """The python that runs the client: --client-python, else the validator environment
    (scripts/sglang-validator prints its python; builds it the first time, minutes)."""
    if override:
        if not os.access(override, os.X_OK):
            raise BenchError(f"--client-python {override} is not an executable file", EXIT_FAILED)
        return override
    script = REPO / "scripts" / "sglang-validator"
    if not script.is_file():
        raise BenchError(f"{script} not found: give --client-python (a python with sglang {CLIENT_NAME} installed)")
    print("pdnode bench: finding the client environment (scripts/sglang-validator; the first time it builds, "
          "a few minutes)", file=sys.stderr)
    proc = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True, check=False)
    path = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not os.access(path, os.X_OK):
        raise BenchError(f"scripts/sglang-validator could not provide the client environment (exit "
                         f"{proc.returncode}; its messages are above)")
    return path


def client_version(python: str) -> str:
    proc = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('sglang'))"],
                          capture_output=True, text=True, timeout=60, check=False)
    version = proc.stdout.strip()
    if proc.returncode != 0 or not version:
        raise BenchError(f"{python} has no sglang installed (it runs the load client {CLIENT_NAME}): "
                         "use scripts/sglang-validator's environment or give --client-python")
    return version


def client_argv(python: str, *, base_url: str, tokenizer: str, served_model_name: str, wl: Mapping[str, Any],
                output_file: str) -> list[str]:
    argv = [python, "-m", WRAPPER_MODULE, "--backend", "sglang", "--base-url", base_url,
            "--dataset-name", "random-ids", "--tokenize-prompt", "--tokenizer", tokenizer, "--model", tokenizer,
            "--served-model-name", served_model_name, "--num-prompts", str(wl["requests"]),
            "--random-input-len", str(wl["input_len"]), "--random-output-len", str(wl["output_len"]),
            "--random-range-ratio", repr(float(wl["range_ratio"])), "--seed", str(wl["seed"]),
            # pdnode warms up itself, before the first counter reading (docs/bench.md)
            "--warmup-requests", "0", "--ready-check-timeout-sec", "0",
            "--output-file", output_file, "--output-details"]
    if wl.get("rate") is not None:
        argv += ["--request-rate", repr(float(wl["rate"]))]
    else:
        argv += ["--max-concurrency", str(wl["concurrency"])]
    return argv


def client_env(base: Mapping[str, str], *, api_key: str | None, router_host: str, stub_dir: str,
               requests_file: str | None = None) -> dict[str, str]:
    from .bench_client import REQUESTS_FILE_ENV

    env = {k: v for k, v in base.items() if k not in ("OPENAI_API_KEY", "API_KEY", REQUESTS_FILE_ENV)}
    if requests_file:
        env[REQUESTS_FILE_ENV] = requests_file
    if api_key:
        env["OPENAI_API_KEY"] = api_key  # bench_serving sends it as "Authorization: Bearer KEY"
    # Nothing from the network: the tokenizer is a local directory.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    # Its `requests` calls honour proxy variables; the router is reached directly.
    no_proxy = ",".join(x for x in (env.get("NO_PROXY") or env.get("no_proxy") or "", router_host) if x)
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    env["PYTHONPATH"] = os.pathsep.join(x for x in (stub_dir, env.get("PYTHONPATH", "")) if x)
    return env


def run_client(argv: list[str], env: Mapping[str, str], log_path: Path) -> int:
    """Runs the client; its progress bar (stderr) shows, its printed summary goes to LOG_PATH."""
    with open(log_path, "wb") as log:
        return subprocess.run(argv, stdout=log, stderr=None, env=dict(env), check=False).returncode


def warm_up(base_url: str, api_key: str | None, wl: Mapping[str, Any]) -> None:
    """WARMUP requests of the workload's shape through the router (also the reachability
    check: a refused key or a dead router is one line here, not a failed benchmark)."""
    from ..verify.http import request

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"input_ids": [4 + j % 1000 for j in range(wl["input_len"])],
            "sampling_params": {"max_new_tokens": min(wl["output_len"], 16), "ignore_eos": True, "temperature": 0},
            "stream": False}
    for _ in range(wl["warmup_requests"]):
        resp = request("POST", base_url + "/generate", body=body, headers=headers, timeout_s=WARMUP_TIMEOUT_S)
        if not resp.ok:
            hint = " (the API key: pdnode_api_key_file)" if resp.status in (401, 403) else ""
            raise BenchError(f"warm-up request to {base_url}/generate failed: {resp.short()}{hint}")


# --- the counters ------------------------------------------------------------------------------
def counters_local(plan: Mapping[str, Any]) -> Callable[[], tuple[dict[str, Any] | None, str | None]]:
    from ..node.bench_counters import snapshot

    return lambda: (snapshot(plan), None)


def counters_ansible(inventory: Path, hosts: list[str], workdir: Path) -> Callable[[], tuple[dict[str, Any] | None,
                                                                                          str | None]]:
    """Reads them on the hosts (every host of a layout spanning several) through
    playbooks/bench.yml (the project's ansible-playbook); one snapshot of them all."""
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    playbook, playbook_env = resources.playbook("bench")

    def read() -> tuple[dict[str, Any] | None, str | None]:
        if not os.access(ansible_playbook, os.X_OK):
            return None, f"ansible-playbook is not installed next to {sys.executable} (scripts/setup)"
        out_dir = Path(tempfile.mkdtemp(dir=workdir, prefix="counters-"))
        argv = [str(ansible_playbook), playbook, "-i", str(inventory), "--limit", ",".join(hosts),
                "-e", json.dumps({"bench_counters_dir": str(out_dir)})]
        env = dict(os.environ, **playbook_env, ANSIBLE_NOCOLOR="1")
        env["PATH"] = f"{ansible_playbook.parent}{os.pathsep}{env.get('PATH', '')}"
        try:
            proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=COUNTERS_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None, f"playbooks/bench.yml did not finish in {COUNTERS_TIMEOUT_S:.0f} s"
        got = [out_dir / f"{host}.json" for host in hosts]
        if proc.returncode != 0 or not all(g.is_file() for g in got):
            tail = " | ".join(line.strip() for line in proc.stdout.splitlines()[-6:] if line.strip())
            return None, f"playbooks/bench.yml failed (exit {proc.returncode}): {tail[-600:]}"
        snaps = [json.loads(g.read_text()) for g in got]
        merged = dict(snaps[0])
        merged["instances"] = {iid: inst for snap in snaps for iid, inst in snap["instances"].items()}
        return merged, None

    return read


# --- the command -------------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="load through the router; throughput, TTFT/ITL/E2E and per-instance work "
                                     "(exit 0 all completed, 1 bad input or failures, 2 could not run)",
                       description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="docs/bench.md: which client and why, what each number means.")
    p.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    p.add_argument("--host", help="host of the inventory (needed when it has several)")
    g = p.add_argument_group("workload (random token ids; lengths in tokens)")
    g.add_argument("--requests", metavar="N", help=f"requests to send (default {DEFAULTS['requests']})")
    load = g.add_mutually_exclusive_group()
    load.add_argument("--concurrency", metavar="C", help=f"requests in flight at once, a closed loop "
                                                         f"(default {DEFAULTS['concurrency']})")
    load.add_argument("--rate", metavar="R", help="requests per second, Poisson arrivals, no concurrency cap")
    g.add_argument("--input-len", metavar="I", help=f"prompt tokens (default {DEFAULTS['input_len']})")
    g.add_argument("--output-len", metavar="O", help=f"generated tokens (default {DEFAULTS['output_len']})")
    g.add_argument("--range-ratio", metavar="X", help="lengths drawn uniformly from X*len to len; 1 = fixed (default)")
    g.add_argument("--warmup", metavar="W", help="warm-up requests before the measurement, not counted (default 1)")
    g.add_argument("--seed", metavar="S", help="random seed of the lengths and ids (default 1)")
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help=f"print the report as JSON (schema {bench_report.SCHEMA})")
    g.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
    g.add_argument("--plot", metavar="FILE", help="also draw latency over the run and its distribution to FILE "
                                                  "(.png or .svg; needs matplotlib: pip install 'pdnode[plot]')")
    g = p.add_argument_group("where")
    g.add_argument("--base-url", help="the router as this machine reaches it, e.g. http://10.0.0.5:8000 "
                                      "(default: from the inventory and the plan)")
    g.add_argument("--tokenizer", help="tokenizer directory the client draws ids from (default: the demo model's, playbooks/files/demo-moe)")
    g.add_argument("--client-python", help="python with sglang installed (default: scripts/sglang-validator's)")
    p.set_defaults(func=cmd_bench)


def _load(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], str, Path]:
    from ..core.inventory.read import InventoryError, inventory_hosts
    from ..core.plan.load import load_plan

    host = args.host
    if host is None:  # several hosts and no --host: the one that runs the router of the layout
        try:
            hosts = inventory_hosts(args.inventory)
        except InventoryError:
            hosts = []  # load_plan says why
        if len(hosts) > 1:
            host = load_plan(args.inventory, hosts[0]).plan.cluster["router"]["host"]
    loaded = load_plan(args.inventory, host)  # Unplannable: pdnode's main says why
    return loaded.plan.as_dict(), loaded.variables, loaded.plan.host, Path(args.inventory).resolve()


def _api_key(plan: Mapping[str, Any]) -> str | None:
    from ..node.secrets import SecretError, read_secret_file

    path = (plan.get("settings") or {}).get("pdnode_api_key_file")
    if not path:
        return None
    full = REPO / path  # an absolute path stays as it is (pathlib)
    try:
        return read_secret_file(str(full))
    except SecretError as exc:
        raise BenchError(f"pdnode_api_key_file: {exc}") from None


def say(message: str) -> None:
    print(f"pdnode bench: {message}", file=sys.stderr)


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        return _bench(args)
    except BenchError as exc:
        print(f"pdnode bench: {exc}", file=sys.stderr)
        return exc.code


def _bench(args: argparse.Namespace) -> int:
    wl = workload(args)
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise BenchError(f"--out {args.out}: its directory does not exist; create it or give another path", EXIT_FAILED)
    if args.plot:  # before the load, so that a long run does not end in a refusal
        from . import plot

        try:
            plot.check_target(args.plot)
            plot.pyplot()
        except plot.PlotError as exc:
            raise BenchError(str(exc), exc.code) from None
    tokenizer = Path(args.tokenizer) if args.tokenizer else DEFAULT_TOKENIZER
    if not (tokenizer / "tokenizer.json").is_file() and not (tokenizer / "tokenizer_config.json").is_file():
        raise BenchError(f"--tokenizer {tokenizer}: no tokenizer.json or tokenizer_config.json there; give a model "
                         "directory with a Hugging Face tokenizer", EXIT_FAILED)
    plan, variables, host, inventory = _load(args)
    base_url = checked_base_url(args.base_url) if args.base_url else router_base_url(plan, variables, host)
    api_key = _api_key(plan)
    python = client_python(args.client_python)
    version = client_version(python)
    served = str((plan.get("settings") or {}).get("pdnode_model_served_name") or "default")
    local = str(variables.get("ansible_connection") or "") == "local"

    with tempfile.TemporaryDirectory(prefix="pdnode-bench-") as tmp:
        work = Path(tmp)
        read_counters = counters_local(plan) if local else counters_ansible(inventory, list(plan["cluster"]["hosts"]),
                                                                             work)
        stub = work / "stubs" / "datasets"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text(_DATASETS_STUB)
        shutil.copyfile(Path(__file__).with_name("bench_client.py"), work / "stubs" / f"{WRAPPER_MODULE}.py")
        out_file = work / "client.jsonl"
        requests_file = work / "requests.json"
        argv = client_argv(python, base_url=base_url, tokenizer=str(tokenizer), served_model_name=served, wl=wl,
                           output_file=str(out_file))
        env = client_env(os.environ, api_key=api_key,
                         router_host=_url_hostname(base_url),
                         stub_dir=str(work / "stubs"), requests_file=str(requests_file))

        say(f"router {base_url}; warm-up requests: {wl['warmup_requests']}")
        warm_up(base_url, api_key, wl)
        say("reading the engines' counters (before)")
        before, why_before = read_counters()
        say(f"running {CLIENT_NAME} {version}: {wl['requests']} requests")
        t0 = time.monotonic()
        rc = run_client(argv, env, work / "client.log")
        took = time.monotonic() - t0
        say("reading the engines' counters (after)")
        after, why_after = read_counters()
        if rc != 0 or not out_file.is_file():
            tail = (work / "client.log").read_text(errors="replace").strip().splitlines()[-15:]
            raise BenchError(f"{CLIENT_NAME} failed (exit {rc}, {took:.0f} s); the end of its output:\n  "
                             + "\n  ".join(tail))
        try:
            record = bench_report.parse_client_output(out_file.read_text())
        except bench_report.ClientOutputError as exc:
            raise BenchError(str(exc)) from None
        requests, why_requests = bench_report.parse_request_records(requests_file)

    notes = [f"engine counters: {why}" for why in (why_before, why_after) if why]
    notes += [f"per-request records: {why_requests}"] if why_requests else []
    report = bench_report.build_report(host=host, client={"name": CLIENT_NAME, "version": version}, plan=plan,
                                       workload=wl, record=record, before=before, after=after, notes=notes,
                                       requests=requests)
    text = bench_report.to_json(report)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text if args.json else bench_report.to_table(report))
    if args.plot:
        write_plot(report, args.plot)
    return EXIT_OK if report["results"]["failed"] == 0 else EXIT_FAILED


def write_plot(report: Mapping[str, Any], path: str) -> None:
    """The picture of a report (pdnode.commands.plot); BenchError when it cannot be drawn or written."""
    from . import plot

    try:
        plot.save(plot.bench_figure(report), path)
    except plot.PlotError as exc:
        raise BenchError(str(exc), exc.code) from None
    except OSError as exc:
        raise BenchError(f"cannot write --plot {path}: {exc.strerror or exc}") from None
    say(f"wrote {path}")
