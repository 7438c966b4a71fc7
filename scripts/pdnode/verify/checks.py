"""The checks, in the order they run, and the runner that applies their dependencies.

Order: an early failure explains later ones. A check whose prerequisite failed (or was
skipped) is SKIP "because X failed", never PASS; a check whose data source cannot be
reached from where the verifier runs is N/A.

    services -> bootstrap -> prefill -> decode -> router -> proxy -> access
      -> completion -> correctness -> disaggregation -> metrics -> burst -> threshold.*
"""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable
from urllib.parse import urlsplit

from . import access as acc
from . import metrics as pm
from . import services as svc
from ..secrets import read_secret_file
from .config import ROUTE_QUERY, Run
from .http import Deadline, Response, port_open, request, stream_sse

PASS, WARN, FAIL, SKIP, NA = "PASS", "WARN", "FAIL", "SKIP", "N/A"
RUNBOOK = "docs/runbooks/verification-failed.md"

# Metric names this verifier relies on (SGLang 0.5.23). role -> name -> what needs it.
M_PROMPT = "sglang:prompt_tokens_total"
M_GEN = "sglang:generation_tokens_total"
M_REQS = "sglang:num_requests_total"
M_TTFT = "sglang:time_to_first_token_seconds"
M_ITL = "sglang:inter_token_latency_seconds"
M_E2E = "sglang:e2e_request_latency_seconds"
M_KV_MB = "sglang:kv_transfer_total_mb"
M_KV_SPEED = "sglang:kv_transfer_speed_gb_s"
M_BOOT_FAIL = "sglang:num_bootstrap_failed_reqs_total"
M_XFER_FAIL = "sglang:num_transfer_failed_reqs_total"

# threshold key -> (role whose /metrics has it, metric, quantile or kind, unit, comparison)
THRESHOLDS: dict[str, tuple[str, str, float | str, str, str]] = {
    "ttft_p50_max_s": ("decode", M_TTFT, 0.50, "s", "max"),
    "ttft_p99_max_s": ("decode", M_TTFT, 0.99, "s", "max"),
    "itl_p50_max_s": ("decode", M_ITL, 0.50, "s", "max"),
    "itl_p99_max_s": ("decode", M_ITL, 0.99, "s", "max"),
    "e2e_p99_max_s": ("decode", M_E2E, 0.99, "s", "max"),
    "decode_throughput_min_tok_s": ("decode", M_GEN, "rate", "tok/s", "min"),
    "kv_transfer_speed_min_gb_s": ("prefill", M_KV_SPEED, "mean", "GB/s", "min"),
}
REQUIRED_METRICS: dict[str, dict[str, str]] = {
    "prefill": {M_PROMPT: "disaggregation", M_KV_MB: "disaggregation", M_BOOT_FAIL: "disaggregation",
                M_XFER_FAIL: "disaggregation", M_KV_SPEED: "threshold kv_transfer_speed_min_gb_s"},
    "decode": {M_GEN: "disaggregation, threshold decode_throughput_min_tok_s", M_BOOT_FAIL: "disaggregation",
               M_XFER_FAIL: "disaggregation", M_TTFT: "thresholds ttft_p50_max_s, ttft_p99_max_s",
               M_ITL: "thresholds itl_p50_max_s, itl_p99_max_s", M_E2E: "threshold e2e_p99_max_s"},
}

WORDS = ("the quick brown fox jumps over a lazy dog while seven tired engineers deploy "
         "prefill and decode servers across eight bright GPUs before morning coffee").split()


def make_prompt(words: int) -> str:
    head = "Summarize the following text in one sentence:"
    n = max(words - len(head.split()), 1)
    return head + " " + " ".join(WORDS[i % len(WORDS)] for i in range(n))


@dataclass
class Result:
    status: str
    evidence: str
    hint: str = ""
    cause: str = ""  # for SKIP: the root cause, as "because ..." continues it


@dataclass
class CheckResult:
    id: str
    title: str
    status: str
    evidence: str
    hint: str
    duration_s: float
    cause: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "evidence": self.evidence,
                "hint": self.hint, "duration_s": round(self.duration_s, 3)}


@dataclass
class Check:
    id: str
    title: str
    fn: Callable[[Ctx], Result]
    # dependency id -> mode: "pass" (must PASS or WARN; N/A allowed), "ran" (must have
    # run: PASS, WARN or FAIL), "not_failed" (anything but FAIL). A dependency in `na` that is N/A makes
    # this check N/A (its data comes from there).
    deps: dict[str, str] = field(default_factory=dict)
    na: tuple[str, ...] = ()


class Ctx:
    """State shared by the checks of one run."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.t = run.targets
        self.s = run.settings
        self.deadline = Deadline(run.settings.overall_s)
        self.results: dict[str, CheckResult] = {}
        self.measurements: dict[str, Any] = {}
        self.snaps: dict[str, dict[str, pm.Snapshot | str]] = {}
        self.reached: dict[str, bool] = {}  # target -> answered at least once
        self.key_raw: str | None = None
        self.key: str | None = None
        self.key_refused: dict[str, str] = {}  # check id -> evidence of a 401/403
        self.internal_error: str | None = None
        self.burst_wall_s = 0.0
        # router circuit breakers not closed at the router check: "worker (open, ...)"
        self.circuits: list[str] = []
        self.circuit_open = False  # one of them was open (1), not only half-open (2)
        if run.api_key_file:
            with open(run.api_key_file, encoding="utf-8", newline="") as fh:
                self.key_raw = fh.read()
            self.key = acc.key_from_file_content(self.key_raw)
        # The router's control-plane key: read like the router's launcher reads it
        # (pdnode.secrets refuses files others can read); sent to /workers only.
        self.admin_key = read_secret_file(run.admin_key_file) if run.admin_key_file else None

    # --- HTTP --------------------------------------------------------------------------
    def limit(self) -> float:
        return max(min(self.s.timeout_s, self.deadline.left()), 0.05)

    def node_headers(self) -> dict[str, str]:
        """Headers for the node's own services: the key as the services read it."""
        if self.key is None:
            return {}
        return {"Authorization": f"Bearer {self.key.strip()}"}

    def client_header(self) -> str | None:
        """The Authorization value a client sends (--auth-template applied to the key)."""
        if self.key is None:
            return None
        return self.run.auth_template.replace("{key}", self.key)

    def admin_headers(self) -> dict[str, str]:
        """Headers for the router's control plane (/workers): the admin key, never the client's."""
        return {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}

    def get(self, url: str, *, auth: bool = True, timeout: float | None = None,
            headers: dict[str, str] | None = None) -> Response:
        hdrs = headers if headers is not None else (self.node_headers() if auth else None)
        resp = request("GET", url, headers=hdrs, timeout_s=min(timeout or self.limit(), self.limit()))
        self._mark(url, resp)
        return resp

    def _mark(self, url: str, resp: Response) -> None:
        root = _root(url)
        self.reached[root] = self.reached.get(root, False) or resp.reached

    def scrape(self, role: str) -> pm.Snapshot | str:
        """Snapshot of prefill's or decode's /metrics, or why there is none."""
        base = self.t.prefill_url if role == "prefill" else self.t.decode_url
        if base is None:
            return f"{role} is not reachable from here"
        resp = self.get(base + "/metrics")
        if resp.status == 404:
            return (f"{role} /metrics answered 404: metrics are off (start with --enable-metrics; "
                    "the plan sets enable_metrics: true)")
        if not resp.ok:
            return f"{role} /metrics: {resp.short()}"
        try:
            return pm.parse(resp.text)
        except pm.MetricsParseError as exc:
            return f"{role} /metrics: {exc}"

    def snapshot(self, label: str) -> None:
        self.snaps[label] = {role: self.scrape(role) for role in ("prefill", "decode")}


def _root(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"


def _fmt(x: float | None, unit: str = "", digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if unit == "s" and x < 1:
        return f"{x * 1000:.1f} ms"
    return f"{x:.{digits}g} {unit}".strip()


def _unit_hint(ctx: Ctx, role: str) -> str:
    units = {u.split("-")[-1].split(".")[0]: u for u in ctx.run.expect.units}
    unit = units.get(role)
    if unit and ctx.t.on_node:
        return f"systemctl status {unit}; journalctl -u {unit} -n 100"
    return f"on the node: systemctl status <prefix>-{role}; journalctl -u <prefix>-{role} -n 100"


def _conn_hint(resp: Response, what: str, ctx: Ctx, role: str) -> str:
    if resp.error_kind == "refused":
        return f"nothing listens there: {what} is not running or listens elsewhere; {_unit_hint(ctx, role)}"
    if resp.error_kind == "timeout":
        return f"{what} accepted the connection but did not answer in {ctx.limit():.0f} s: overloaded or stuck; " \
               f"{_unit_hint(ctx, role)}"
    if resp.error_kind == "dns":
        return "the host name does not resolve here: pass the address (--base-url/--router-url http://IP:PORT)"
    return _unit_hint(ctx, role)


def _refused(ctx: Ctx, check: str, url: str, resp: Response) -> Result:
    ctx.key_refused[check] = f"{url}: HTTP {resp.status}"
    sent = "no API key was sent" if ctx.key is None else "the API key was refused"
    return Result(SKIP, f"skipped: because {sent} (GET {urlsplit(url).path} -> HTTP {resp.status}); "
                        "the access check says why",
                  "fix the API key first (see access)", cause=f"{sent} (see access)")


# --- 1. services --------------------------------------------------------------------
def check_services(ctx: Ctx) -> Result:
    units = ctx.run.expect.units
    if not ctx.t.on_node:
        return Result(NA, "not applicable (remote): systemd state is read on the node itself",
                      "run on the node (ansible-playbook playbooks/verify.yml does)")
    if not units or not svc.systemctl_available():
        return Result(NA, "not applicable: no systemctl on this machine")
    first = _read_units(ctx, units)
    if first is None:
        return Result(NA, "not applicable: systemctl cannot answer here (systemd is not PID 1)")
    states, now = first
    if all(s.load == "not-found" for s in states):
        return Result(NA, f"not applicable: {', '.join(units)} are not installed on this machine")
    earlier: list[svc.UnitState | None] = [None] * len(states)
    watched = 0.0
    # A recent restart or a unit between states: watch a few seconds; a loop shows as
    # NRestarts rising (or the unit not active at the end), one recovered restart does not.
    wait = min(svc.OBSERVE_S, ctx.deadline.left() - ctx.s.timeout_s)
    if wait > 0 and any(svc.needs_second_look(s, now) for s in states):
        time.sleep(wait)
        second = _read_units(ctx, units)
        if second is not None:
            earlier, watched = list(states), second[1] - now
            states, now = second
    judged = [svc.judge(s, now, first=e, watched_s=watched) for s, e in zip(states, earlier)]
    evidence = "; ".join(ev for _, ev in judged)
    failing = [s.unit for s, (v, _) in zip(states, judged) if v == svc.FAIL]
    if failing:
        return Result(FAIL, evidence, f"journalctl -u {failing[0]} -n 100 --no-pager; systemctl status {failing[0]}; "
                                      f"{RUNBOOK}#services")
    warned = [s.unit for s, (v, _) in zip(states, judged) if v == svc.WARN]
    if warned:
        return Result(WARN, evidence, f"a restart recovered; why it went down: journalctl -u {warned[0]} -n 100 "
                                      f"--no-pager; if NRestarts keeps rising it is a loop; {RUNBOOK}#services")
    return Result(PASS, evidence)


def _read_units(ctx: Ctx, units: list[str]) -> tuple[list[svc.UnitState], float] | None:
    now = time.monotonic()
    states = []
    for unit in units:
        out = svc.show(unit, timeout_s=min(5.0, ctx.limit()))
        if out is None:
            return None
        states.append(svc.parse_show(out, unit))
    return states, now


# --- 2. bootstrap -------------------------------------------------------------------
def check_bootstrap(ctx: Ctx) -> Result:
    url = ctx.t.bootstrap_url
    if url is None:
        return Result(NA, "not applicable (remote): the bootstrap server listens on the node's loopback",
                      "run on the node, or tunnel it and pass --bootstrap-url")
    p = urlsplit(url)
    why = port_open(p.hostname or "127.0.0.1", p.port or 8998, timeout_s=min(3.0, ctx.limit()))
    ctx.reached[_root(url)] = why is None
    if why is not None:
        return Result(FAIL, f"{p.netloc}: {why}",
                      "prefill's bootstrap server is not listening: decode cannot find the prefill ranks and "
                      "PD requests hang or fail; check prefill's disaggregation_bootstrap_port and its log: "
                      f"{_unit_hint(ctx, 'prefill')}")
    health = ctx.get(url + "/health", auth=False)
    if not (health.ok and health.text.strip() == "OK"):
        return Result(FAIL, f"{p.netloc} listening; /health: {health.short()}",
                      f"the process on {p.netloc} is not SGLang's bootstrap server (port clash?)")
    route = ctx.get(url + ROUTE_QUERY, auth=False)
    want = ctx.run.expect.prefill["tp_size"]
    if route.status == 503:
        return Result(FAIL, f"{p.netloc} /health OK; /route: {route.short()}",
                      f"prefill's ranks have not all registered (plan: {want}); prefill is still loading or a rank "
                      f"died: {_unit_hint(ctx, 'prefill')}")
    info = route.json() if route.ok else None
    if not isinstance(info, dict):
        return Result(FAIL, f"{p.netloc} /health OK; /route: {route.short()}", "unexpected answer from /route")
    attn_tp = int(info.get("attn_tp_size") or 0)
    dp = int(info.get("dp_size") or 1)
    cp = int(info.get("attn_cp_size") or 1)
    pp = int(info.get("pp_size") or 1)
    ranks = attn_tp * dp * cp
    evidence = (f"{p.netloc} /health OK; /route: attn_tp {attn_tp} x dp {dp}" + (f" x cp {cp}" if cp > 1 else "")
                + f" = {ranks} ranks per pipeline stage registered" + (f", pp {pp}" if pp > 1 else "")
                + f" (plan: prefill tp_size {want})")
    if ranks != want:
        return Result(FAIL, evidence, "the running prefill has another parallel layout than the plan: redeploy "
                                      "(playbooks/deploy.yml) or restart prefill")
    return Result(PASS, evidence)


# --- 3. workers ---------------------------------------------------------------------
def _worker(ctx: Ctx, role: str) -> Result:
    base = ctx.t.prefill_url if role == "prefill" else ctx.t.decode_url
    if base is None:
        return Result(NA, f"not applicable (remote): {role} listens on the node's loopback",
                      f"run on the node, or tunnel it and pass --{role}-url")
    health = ctx.get(base + "/health", auth=False)
    if not health.reached:
        return Result(FAIL, f"{base}/health: {health.short()}", _conn_hint(health, role, ctx, role))
    if not health.ok:
        return Result(FAIL, f"{base}/health: {health.short()}",
                      f"{role} answers but is not healthy (503 while loading the model; a dead peer makes "
                      f"health checks fail too): {_unit_hint(ctx, role)}")
    info_resp = ctx.get(base + "/server_info")
    if info_resp.status == 404:
        info_resp = ctx.get(base + "/get_server_info")
    if info_resp.status in (401, 403):
        return _refused(ctx, role, base + "/server_info", info_resp)
    info = info_resp.json() if info_resp.ok else None
    if not isinstance(info, dict):
        return Result(FAIL, f"/health OK; /server_info: {info_resp.short()}", "unexpected answer from /server_info")
    want = ctx.run.expect.prefill if role == "prefill" else ctx.run.expect.decode
    got_dp = info.get("attn_dp_size")
    if got_dp is None:  # older spelling: enable_dp_attention + dp_size
        got_dp = info.get("dp_size", 1) if info.get("enable_dp_attention") else 1
    got = {"disaggregation_mode": info.get("disaggregation_mode"), "tp_size": info.get("tp_size"),
           "attn_dp_size": got_dp, "served_model_name": info.get("served_model_name")}
    expected = {"disaggregation_mode": role, "tp_size": want["tp_size"], "attn_dp_size": want["attn_dp_size"],
                "served_model_name": ctx.run.expect.served_model_name}
    diffs = [f"{k} {got[k]!r} (plan {expected[k]!r})" for k in expected if got[k] != expected[k]]
    version = info.get("version")
    evidence = (f"{base}: /health OK; mode {got['disaggregation_mode']}, tp {got['tp_size']}, attn-DP {got_dp}, "
                f"model {got['served_model_name']!r}" + (f", SGLang {version}" if version else ""))
    if diffs:
        return Result(FAIL, f"{base}: /server_info disagrees with the plan: " + "; ".join(diffs),
                      f"the running {role} was started with other arguments: redeploy (playbooks/deploy.yml) or "
                      f"restart the unit so it reads the plan's {role}.json")
    return Result(PASS, evidence)


def check_prefill(ctx: Ctx) -> Result:
    return _worker(ctx, "prefill")


def check_decode(ctx: Ctx) -> Result:
    return _worker(ctx, "decode")


def check_router(ctx: Ctx) -> Result:
    base = ctx.t.router_url
    ready = ctx.get(base + "/readiness", auth=False)
    if not ready.reached:
        return Result(FAIL, f"{base}/readiness: {ready.short()}", _conn_hint(ready, "the router", ctx, "router"))
    if not ready.ok:
        return Result(FAIL, f"{base}/readiness: {ready.short()}",
                      "the router has no healthy prefill+decode pair: a worker is down or failed registration "
                      "(the router gives up after worker_startup_timeout_secs): check prefill/decode above, then "
                      f"restart the router; {_unit_hint(ctx, 'router')}")
    problems: list[str] = []
    hint = ""
    # Worker management must answer only to the admin key (docs/security.md): probe it
    # read-only, without a key and with the client key, when the plan gives the router one.
    if ctx.run.expect.admin_key:
        tries = [("without a key", {})] + ([("with the client API key", ctx.node_headers())] if ctx.key else [])
        for label, hdrs in tries:
            probe = ctx.get(base + "/workers", headers=hdrs)
            if probe.ok:
                problems.append(f"GET /workers answered 200 {label}: worker management is open to "
                                + ("anyone who reaches the router" if not hdrs else "every client")
                                + " (DELETE /workers/{id} takes a worker out)")
                hint = ("the router runs without its admin key: redeploy (playbooks/deploy.yml) so it starts with "
                        "--admin-key-file <config_dir>/router-admin-key, then restart it; docs/security.md")
                break
    headers = ctx.admin_headers() or ctx.node_headers()
    workers = ctx.get(base + "/workers", headers=headers)
    listed = ""
    if workers.status in (401, 403):
        if ctx.admin_key:
            return Result(FAIL, f"{base}: /readiness 200; GET /workers with the admin key -> {workers.short()}",
                          "the router refused the admin key given: it was started with another one (restart the "
                          "router after the key file changed) or without one (then it takes only the client key "
                          "there); compare `sha256sum <config_dir>/router-admin-key` with the file you passed")
        if not ctx.run.expect.admin_key:
            return _refused(ctx, "router", base + "/workers", workers)
        listed = ("; worker list not read: /workers needs the router's admin key (--admin-key-file; on the node "
                  "<config_dir>/router-admin-key), clients get " + f"HTTP {workers.status}")
    body = workers.json() if workers.ok else None
    got_p: list[tuple[str, Any]] = []
    got_d: list[str] = []
    if not listed:
        if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
            return Result(FAIL, f"/readiness 200; /workers: {workers.short()}", "unexpected answer from /workers")
        got_p = sorted((str(w.get("url", "")).rstrip("/"), w.get("bootstrap_port")) for w in body["workers"]
                       if w.get("worker_type") == "prefill")
        got_d = sorted(str(w.get("url", "")).rstrip("/") for w in body["workers"] if w.get("worker_type") == "decode")
        unhealthy = [w.get("url") for w in body["workers"] if w.get("is_healthy") is False]
        want_p = sorted((u, b) for u, b in ctx.run.expect.router_prefill)
        want_d = sorted(ctx.run.expect.router_decode)
        if got_p != want_p:
            problems.append(f"prefill workers {got_p} (plan {want_p})")
        if got_d != want_d:
            problems.append(f"decode workers {got_d} (plan {want_d})")
        if unhealthy:
            problems.append(f"unhealthy: {unhealthy}")
        listed = (f"; /workers: {len(got_p)} prefill {[u for u, _ in got_p]} (bootstrap {[b for _, b in got_p]}), "
                  f"{len(got_d)} decode {got_d}")
    metrics_note = ""
    if ctx.t.router_metrics_url:
        m = ctx.get(ctx.t.router_metrics_url, auth=False)
        if not m.ok:
            problems.append(f"metrics listener {ctx.t.router_metrics_url}: {m.short()}")
        else:
            metrics_note = "; metrics listener answers"
            try:
                states = circuit_states(pm.parse(m.text))
            except pm.MetricsParseError as exc:
                states, metrics_note = [], f"; metrics listener: {exc}"
            # Not a failure by itself: an open circuit turns half-open on its own after
            # cb_timeout_duration_secs, and the gauge is only updated when the router
            # looks at the breaker. Whether requests fail is the completion check's call.
            ctx.circuits = [desc for _, _, desc in states]
            ctx.circuit_open = any(state == 1 for _, state, _ in states)
            if states:
                metrics_note += ("; circuit breaker not closed for " + ", ".join(ctx.circuits)
                                 + f" (an open one lets requests through again after {ctx.run.expect.circuit_open_s} s"
                                   ", cb_timeout_duration_secs; successful requests close a half-open one): the "
                                   "completion check judges whether requests fail")
    evidence = f"{base}: /readiness 200{listed}{metrics_note}"
    if problems:
        return Result(FAIL, f"{base}: " + "; ".join(problems),
                      hint or "the router's workers differ from the plan: redeploy so router.json matches, or "
                              f"restart the router; {_unit_hint(ctx, 'router')}")
    return Result(PASS, evidence)


def circuit_states(router: pm.Snapshot) -> list[tuple[str, int, str]]:
    """(worker, state, description) of the router's circuit breakers that are not closed
    (smg_worker_cb_state: 0 closed, 1 open, 2 half-open), with consecutive failures."""
    fails = {dict(lab).get("worker"): v for lab, v in router.series("smg_worker_cb_consecutive_failures").items()}
    out = []
    for labels, state in sorted(router.series("smg_worker_cb_state").items()):
        if state:
            worker = dict(labels).get("worker", "?")
            what = "open" if state == 1 else "half-open"
            n = fails.get(worker)
            out.append((worker, int(state), f"{worker} ({what}" + (f", {n:g} consecutive failures)" if n is not None
                                                                   else ")")))
    return out


def circuit_open(router: pm.Snapshot) -> list[str]:
    """Descriptions of the circuit breakers that are not closed (see circuit_states)."""
    return [desc for _, _, desc in circuit_states(router)]


def _circuit_hint(ctx: Ctx) -> str:
    if not ctx.circuits:
        return ""
    return (f"the router's circuit breaker was not closed for {', '.join(ctx.circuits)}: after repeated failures "
            f"it sends nothing to that worker for {ctx.run.expect.circuit_open_s} s (cb_timeout_duration_secs in "
            "the plan, pdnode_router_circuit_open_s) and answers 503; find the failures' cause in the engines' "
            "logs; restarting the router closes the circuits")


# --- 8. access layer ----------------------------------------------------------------
def check_proxy(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    env = ctx.run.env
    choice = acc.proxy_for(url, env)
    host = urlsplit(url).hostname or ""
    set_vars = acc.proxy_variables_set(env)
    if choice is None:
        if set_vars:
            return Result(PASS, f"proxy variables set ({', '.join(set_vars)}) but none applies to {host}")
        return Result(PASS, f"no proxy variable set: clients here connect to {host} directly")
    if choice.scheme.startswith("socks"):
        return Result(PASS, f"{choice.shown()} applies to {host} (SOCKS: not tested by this verifier; curl and "
                            "httpx send requests through it)", acc.bypass_hint(host, choice))
    probe = acc.join(ctx.t.base_url, "/v1/models")
    hdr = ctx.node_headers()
    direct = request("GET", probe, headers=hdr, timeout_s=min(5.0, ctx.limit()))
    via = request("GET", probe, headers=hdr, timeout_s=min(5.0, ctx.limit()), proxy=choice.url)
    finding = acc.diagnose_proxy(url, choice, direct.status, direct.error, via.status, via.error, via.text)
    if finding:
        return Result(FAIL, finding.problem, finding.hint)
    return Result(PASS, f"{choice.shown()} carries requests for {host}; through it GET /v1/models -> "
                        f"{via.short(80)} (directly: HTTP {direct.status})", acc.bypass_hint(host, choice))


def _chat_body(ctx: Ctx, content: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ctx.run.expect.served_model_name,
                            "messages": [{"role": "user", "content": content}],
                            "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _client_post(ctx: Ctx, url: str, body: Any, header: str | None) -> Response:
    headers = {"Authorization": header} if header is not None else {}
    resp = request("POST", url, body=body, headers=headers, timeout_s=ctx.limit())
    ctx._mark(url, resp)
    return resp


def check_access(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    sent = ctx.client_header()
    body = _chat_body(ctx, "Reply with the word OK.", ctx.s.max_tokens)
    # The disaggregation proof covers every request the verifier sends, this one included
    # (a failing probe can already trip the router's circuit breaker).
    ctx.snapshot("completion_before")
    resp = _client_post(ctx, url, body, sent)
    what = f"POST {url} with {acc.describe_header(sent)}"
    if resp.error_kind == "header":
        f = acc.diagnose_header_error(resp.error or "", sent, ctx.run.api_key_file, ctx.key_raw)
        return Result(FAIL, f.problem, f.hint)
    if not resp.reached:
        return Result(FAIL, f"{what}: {resp.short()}", _conn_hint(resp, "the endpoint", ctx, "router"))
    if resp.status == 404:
        fixed = acc.doubled_v1(ctx.t.base_url)
        corrected = None
        if fixed is not None:
            corrected = _client_post(ctx, acc.join(fixed, acc.CHAT_PATH), body, sent).status
        f = acc.diagnose_url(ctx.t.base_url, 404, corrected)
        assert f is not None
        return Result(FAIL, f.problem, f.hint)
    if resp.status in (401, 403):
        fixed_by = None
        for label, variant in acc.header_variants(sent, ctx.key):
            if _client_post(ctx, url, body, variant).status not in (401, 403):
                fixed_by = label
                break
        f = acc.diagnose_auth(resp.status, sent, ctx.run.api_key_file, ctx.key_raw, fixed_by, resp.text)
        return Result(FAIL, f.problem, f.hint)
    if resp.status == 400 and ctx.s.max_tokens <= 0:
        return Result(FAIL, f"{what}: {resp.short()}: max_tokens was {ctx.s.max_tokens}",
                      "max_tokens 0 asks for no tokens (the router refuses it, servers answer empty content); "
                      "send max_tokens >= 1 (pdnode_verify_max_tokens, --max-tokens)")
    finding = acc.diagnose_body(resp.status, resp.json() if resp.ok else None, ctx.s.max_tokens)
    if resp.ok and resp.json() is None:
        finding = acc.diagnose_body(200, resp.text, ctx.s.max_tokens)
    if finding:
        return Result(FAIL, f"{what}: {finding.problem}", finding.hint)
    if resp.ok:
        data = resp.json()
        usage = data.get("usage") or {}
        return Result(PASS, f"{what}: HTTP 200, {usage.get('completion_tokens', '?')} tokens in {resp.elapsed_s:.2f} s")
    return Result(PASS, f"{what}: key and URL accepted; the server answered {resp.short(120)} "
                        "(generation is judged by the completion check)")


# --- 4. completion ------------------------------------------------------------------
def _error_hint(resp: Response, ctx: Ctx) -> str:
    text = resp.text.lower()
    if resp.status is None and resp.error_kind == "timeout":
        return (f"no answer in {ctx.limit():.0f} s: PD requests hang when decode cannot reach the bootstrap server or "
                "the KV cache never arrives (see bootstrap and disaggregation); " + RUNBOOK + "#completion")
    if "server_selection_failed" in text:
        return "the router has no healthy worker pair: see router"
    if "waitingforinput" in text or "transfer" in text:
        return ("the KV cache did not reach decode (SGLANG_DISAGGREGATION_WAITING_TIMEOUT expired or the transfer "
                "failed): check the transfer backend (Mooncake devices, MC_TCP_BIND_ADDRESS, firewalled dynamic ports); "
                "see disaggregation")
    if "bootstrap" in text or "handshake" in text:
        return "decode could not bootstrap with prefill: see bootstrap; check prefill's bootstrap port and host"
    return f"read the error above and the engines' logs ({_unit_hint(ctx, 'decode')})"


def _wait_settled(ctx: Ctx, before: dict[str, Any], n: int, max_wait: float = 1.0) -> None:
    """Metrics are recorded when a request finishes inside the engine, a moment after the
    client has its answer: wait (bounded) until decode counted ``n`` more requests."""
    b = before.get("decode")
    if not isinstance(b, pm.Snapshot) or ctx.t.decode_url is None:
        return
    end = time.monotonic() + max_wait
    while time.monotonic() < end:
        snap = ctx.scrape("decode")
        if not isinstance(snap, pm.Snapshot):
            return
        d = pm.counter_delta(b, snap, M_REQS)
        if d is None or d >= n:
            return
        time.sleep(0.05)


def check_completion(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    header = ctx.client_header()
    hdrs = {"Authorization": header} if header else {}
    prompt = make_prompt(ctx.s.prompt_words)
    if "completion_before" not in ctx.snaps:
        ctx.snapshot("completion_before")
    problems: list[str] = []
    hint = ""
    m: dict[str, Any] = {"prompt_words": ctx.s.prompt_words, "max_tokens": ctx.s.max_tokens}
    ctx.measurements["completion"] = m
    # non-streaming
    resp = request("POST", url, body=_chat_body(ctx, prompt, ctx.s.max_tokens), headers=hdrs, timeout_s=ctx.limit())
    ctx._mark(url, resp)
    parts = []
    if not resp.ok:
        problems.append(f"non-streaming: {resp.short()}")
        hint = _error_hint(resp, ctx)
    else:
        data = resp.json() or {}
        finding = acc.diagnose_body(200, data, ctx.s.max_tokens)
        choice = (data.get("choices") or [{}])[0] if isinstance(data, dict) else {}
        usage = data.get("usage") or {} if isinstance(data, dict) else {}
        finish = choice.get("finish_reason")
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        m["non_streaming"] = {"latency_s": round(resp.elapsed_s, 4), "finish_reason": finish,
                              "prompt_tokens": pt, "completion_tokens": ct}
        if finding:
            problems.append(f"non-streaming: {finding.problem}")
            hint = finding.hint
        if finish not in ("stop", "length"):
            problems.append(f"non-streaming: finish_reason {finish!r}")
        if not (isinstance(pt, int) and pt > 0 and isinstance(ct, int) and 0 < ct <= max(ctx.s.max_tokens, 1)):
            problems.append(f"non-streaming: usage prompt_tokens {pt}, completion_tokens {ct} "
                            f"(max_tokens {ctx.s.max_tokens})")
        parts.append(f"non-streaming {resp.elapsed_s:.2f} s, {pt} prompt + {ct} completion tokens, finish {finish}")
    # streaming (not tried when the plain request already failed: it would fail the same way, slowly)
    tried = resp.ok
    if not tried:
        parts.append("streaming not tried")
    else:
        sresp, events = stream_sse(url, body=_chat_body(ctx, prompt, ctx.s.max_tokens, stream=True), headers=hdrs,
                                   timeout_s=ctx.limit())
        ctx._mark(url, sresp)
    if not tried:
        pass
    elif not sresp.ok:
        problems.append(f"streaming: {sresp.short()}")
        hint = hint or _error_hint(sresp, ctx)
    else:
        text, finish, usage, ttft, errors = _fold_stream(events)
        m["streaming"] = {"ttft_s": None if ttft is None else round(ttft, 4), "latency_s": round(sresp.elapsed_s, 4),
                          "chunks": len(events), "finish_reason": finish,
                          "completion_tokens": (usage or {}).get("completion_tokens")}
        if errors:
            problems.append(f"streaming: error chunk {errors[0]}")
            hint = hint or _error_hint(Response(url, 500, json.dumps(errors[0]).encode()), ctx)
        elif not text:
            problems.append(f"streaming: no content in {len(events)} chunks")
        if not errors and finish not in ("stop", "length"):
            problems.append(f"streaming: finish_reason {finish!r}")
        if not events or events[-1].data != "[DONE]":
            problems.append("streaming: no [DONE] at the end")
        parts.append(f"streaming first token {_fmt(ttft, 's')}, {len(events)} chunks, finish {finish}")
    _wait_settled(ctx, ctx.snaps["completion_before"], 3)
    ctx.snapshot("completion_after")
    if problems:
        circuit = _circuit_hint(ctx)
        if circuit:
            hint = circuit + (f"; {hint}" if hint and "no healthy worker pair" not in hint else "")
        return Result(FAIL, "; ".join(problems), hint or f"{RUNBOOK}#completion")
    if ctx.circuits:
        parts.append(f"served although the router's circuit breaker was not closed for {', '.join(ctx.circuits)} "
                     "at the router check (it let these requests through)")
    return Result(PASS, f"{ctx.s.prompt_words}-word prompt: " + "; ".join(parts))


def _fold_stream(events: list[Any]) -> tuple[str, Any, dict | None, float | None, list[Any]]:
    text, finish, usage, ttft, errors = "", None, None, None, []
    for ev in events:
        data = ev.data
        if not isinstance(data, dict):
            continue
        if "error" in data:
            errors.append(data["error"])
            continue
        if data.get("usage"):
            usage = data["usage"]
        for ch in data.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = ev.t
                text += piece
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    return text, finish, usage, ttft, errors


def check_correctness(ctx: Ctx) -> Result:
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    header = ctx.client_header()
    body = _chat_body(ctx, ctx.s.reference_prompt, max(ctx.s.max_tokens, 8))
    resp = request("POST", url, body=body, headers={"Authorization": header} if header else {},
                   timeout_s=ctx.limit())
    if not resp.ok:
        return Result(FAIL, f"reference probe: {resp.short()}", _error_hint(resp, ctx))
    data = resp.json() or {}
    try:
        answer = data["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        return Result(FAIL, f"reference probe: no answer in {acc._clip(data)}", "see access")
    want = ctx.s.reference_answer
    ctx.measurements["correctness"] = {"prompt": ctx.s.reference_prompt, "expected": want, "answer": answer[:200]}
    if want.lower() not in answer.lower():
        return Result(FAIL, f"{ctx.s.reference_prompt!r} -> {answer[:120]!r} (expected to contain {want!r})",
                      "HTTP 200 with a wrong answer: prefill and decode disagree on the KV layout (e.g. attention "
                      "TP/DP mismatch with few KV heads) or the wrong model is loaded; compare with one server "
                      f"without disaggregation; {RUNBOOK}#correctness")
    return Result(PASS, f"{ctx.s.reference_prompt!r} -> {answer[:80]!r} (contains {want!r})")


# --- 5. disaggregation proof --------------------------------------------------------
def _kv_moved(before: pm.Snapshot, after: pm.Snapshot) -> tuple[float | None, float | None, str]:
    """(transfers, MB) moved between snapshots; histograms in 0.5.23, gauges in older."""
    kind = after.kind(M_KV_MB)
    if kind == "histogram":
        d = pm.histogram_delta(before, after, M_KV_MB)
        return (d.count, d.sum, "histogram") if d else (None, None, "absent")
    if kind == "gauge":
        b, a = before.total(M_KV_MB), after.total(M_KV_MB)
        moved = None if a is None else (1.0 if a != (b or 0.0) else 0.0)
        return moved, a, "gauge"
    return None, None, "absent"


def check_disaggregation(ctx: Ctx) -> Result:
    before, after = ctx.snaps.get("completion_before", {}), ctx.snaps.get("completion_after", {})
    for role in ("prefill", "decode"):
        for snap in (before.get(role), after.get(role)):
            if not isinstance(snap, pm.Snapshot):
                return Result(FAIL, f"cannot read metrics: {snap}",
                              "the proof of disaggregation needs prefill's and decode's /metrics")
    pb, pa, db, da = before["prefill"], after["prefill"], before["decode"], after["decode"]
    assert isinstance(pb, pm.Snapshot) and isinstance(pa, pm.Snapshot)
    assert isinstance(db, pm.Snapshot) and isinstance(da, pm.Snapshot)
    prompt = pm.counter_delta(pb, pa, M_PROMPT)
    gen = pm.counter_delta(db, da, M_GEN)
    kv_n, kv_mb, kv_kind = _kv_moved(pb, pa)
    fails = {f"{role}_{kind}_failed": pm.counter_delta(b, a, name)
             for role, b, a in (("prefill", pb, pa), ("decode", db, da))
             for kind, name in (("bootstrap", M_BOOT_FAIL), ("transfer", M_XFER_FAIL))}
    ctx.measurements["disaggregation"] = {
        "prefill_prompt_tokens": prompt, "decode_generation_tokens": gen, "kv_transfers": kv_n,
        "kv_transfer_mb": kv_mb, "kv_metric_kind": kv_kind, **fails}
    evidence = (f"prefill prompt tokens +{_n(prompt)}, decode generation tokens +{_n(gen)}, prefill KV transfers "
                f"+{_n(kv_n)} ({_n(kv_mb, '.3f')} MB); failed requests (bootstrap/transfer): prefill "
                f"+{_n(fails['prefill_bootstrap_failed'])}/+{_n(fails['prefill_transfer_failed'])}, decode "
                f"+{_n(fails['decode_bootstrap_failed'])}/+{_n(fails['decode_transfer_failed'])}")
    problems, hint = [], ""
    moved_fail = {k: v for k, v in fails.items() if v}
    if any("transfer" in k for k in moved_fail):
        problems.append("KV transfers failed")
        hint = ("the KV cache did not reach decode: decode gave up after SGLANG_DISAGGREGATION_WAITING_TIMEOUT or the "
                "transfer engine failed; check the transfer backend (RDMA devices per GPU, memlock, Mooncake TCP "
                f"ports) and prefill's log: {_unit_hint(ctx, 'prefill')}; {RUNBOOK}#disaggregation")
    if any("bootstrap" in k for k in moved_fail):
        problems.append("bootstrap failed")
        hint = hint or ("decode could not bootstrap with prefill (bootstrap server, rank registration, advertised "
                        f"IP): see bootstrap; {RUNBOOK}#disaggregation")
    if prompt is None or gen is None:
        missing = [n for n, v in ((M_PROMPT + " on prefill", prompt), (M_GEN + " on decode", gen)) if v is None]
        problems.append(f"metric(s) missing: {', '.join(missing)}")
        hint = hint or "see metrics (a renamed metric)"
    else:
        if not prompt:
            problems.append("prefill processed no prompt tokens")
            hint = hint or "requests do not reach prefill: is the router in PD mode with this prefill?"
        if not gen:
            problems.append("decode generated no tokens")
            hint = hint or "decode did not generate: see completion and decode's log"
    if kv_n is not None and not kv_n and not moved_fail:
        problems.append("prefill recorded no KV transfer")
        hint = hint or "no KV moved from prefill to decode: is a real transfer backend configured (not 'fake')?"
    if kv_n is None and not problems:
        problems.append(f"{M_KV_MB} missing on prefill")
        hint = "see metrics (a renamed metric)"
    if problems:
        return Result(FAIL, "; ".join(problems) + ": " + evidence, hint)
    return Result(PASS, evidence)


def _n(x: float | None, fmt: str = "g") -> str:
    return "?" if x is None else format(x, fmt)


# --- 6. metric contract -------------------------------------------------------------
def check_metrics(ctx: Ctx) -> Result:
    after = ctx.snaps.get("completion_after", {})
    missing, present = [], 0
    for role, names in REQUIRED_METRICS.items():
        snap = after.get(role)
        if not isinstance(snap, pm.Snapshot):
            return Result(FAIL, f"cannot read metrics: {snap}", "enable metrics on both engines (enable_metrics: true)")
        for name, needed_by in names.items():
            if snap.has(name):
                present += 1
                continue
            close = pm.close_names(name, snap.names())
            missing.append(f"{role} lacks {name} (needed by {needed_by})"
                           + (f"; it exposes {', '.join(close)}" if close else ""))
    ctx.measurements["metrics_missing"] = missing
    if missing:
        return Result(FAIL, "; ".join(missing),
                      "the engine's metric names differ from the ones this verifier (and the dashboards) use: a "
                      "renamed metric in another SGLang version; update the names in pdnode/verify/checks.py and "
                      f"templates/ together, or pin the SGLang version the plan names; {RUNBOOK}#metrics")
    return Result(PASS, f"all {present} metrics the checks and thresholds use exist on prefill and decode")


# --- 7. burst and thresholds --------------------------------------------------------
def check_burst(ctx: Ctx) -> Result:
    if ctx.s.skip_burst:
        return Result(SKIP, "skipped: because --skip-burst was given", cause="--skip-burst was given")
    n, c = ctx.s.burst_requests, ctx.s.burst_concurrency
    url = acc.join(ctx.t.base_url, acc.CHAT_PATH)
    header = ctx.client_header()
    hdrs = {"Authorization": header} if header else {}
    prompt = make_prompt(ctx.s.prompt_words)
    ctx.snapshot("burst_before")
    lock = threading.Lock()
    outcomes: list[dict[str, Any]] = []

    def one(i: int) -> None:
        if ctx.deadline.expired():
            with lock:
                outcomes.append({"ok": False, "error": "overall time bound reached"})
            return
        # vary the prompt a little so a prefix cache does not turn the burst into no work
        resp, events = stream_sse(url, body=_chat_body(ctx, f"[{i}] " + prompt, ctx.s.max_tokens, stream=True),
                                  headers=hdrs, timeout_s=ctx.limit())
        text, finish, usage, ttft, errors = _fold_stream(events) if resp.ok else ("", None, None, None, [])
        ok = resp.ok and not errors and bool(text)
        with lock:
            outcomes.append({"ok": ok, "ttft": ttft, "e2e": resp.elapsed_s, "error": None if ok else (
                json.dumps(errors[0])[:200] if errors else resp.short())})

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=c) as pool:
        list(pool.map(one, range(n)))
    wall = time.monotonic() - t0
    good = [o for o in outcomes if o["ok"]]
    _wait_settled(ctx, ctx.snaps["burst_before"], len(good))
    ctx.snapshot("burst_after")
    ttfts = sorted(o["ttft"] for o in good if o["ttft"] is not None)
    e2es = sorted(o["e2e"] for o in good)
    ctx.measurements["burst"] = {
        "requests": n, "concurrency": c, "ok": len(good), "failed": n - len(good), "wall_s": round(wall, 4),
        "client_ttft_p50_s": _exact_q(ttfts, 0.5), "client_ttft_p99_s": _exact_q(ttfts, 0.99),
        "client_e2e_p50_s": _exact_q(e2es, 0.5), "client_e2e_p99_s": _exact_q(e2es, 0.99),
    }
    ctx.burst_wall_s = wall
    evidence = (f"{len(good)}/{n} streaming requests ok at concurrency {c} in {wall:.2f} s; client-side TTFT p50 "
                f"{_fmt(_exact_q(ttfts, 0.5), 's')}, e2e p99 {_fmt(_exact_q(e2es, 0.99), 's')}")
    if len(good) < n:
        first = next(o["error"] for o in outcomes if not o["ok"])
        return Result(FAIL, f"{n - len(good)} of {n} failed (first: {first}); " + evidence,
                      "requests fail under load only: queue limits, KV pool size, WAITING_TIMEOUT under load; "
                      f"{RUNBOOK}#burst")
    return Result(PASS, evidence)


def _exact_q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    k = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return round(values[k], 4)


def threshold_value(key: str, before: dict[str, Any], after: dict[str, Any], wall_s: float
                    ) -> tuple[float | None, str]:
    """(measured value, how) of one threshold from the burst's before/after snapshots."""
    role, metric, stat, unit, _ = THRESHOLDS[key]
    b, a = before.get(role), after.get(role)
    if not isinstance(a, pm.Snapshot) or not isinstance(b, pm.Snapshot):
        return None, f"{role} metrics unreadable"
    if stat == "rate":
        delta = pm.counter_delta(b, a, metric)
        value = pm.throughput(delta, wall_s)
        return value, f"{role} {metric} +{_n(delta)} over {wall_s:.2f} s"
    kind = a.kind(metric)
    if stat == "mean":
        if kind == "gauge":
            vals = list(a.series(metric).values())
            return (max(vals) if vals else None), f"{role} gauge {metric}"
        d = pm.histogram_delta(b, a, metric)
        if d is None or d.count <= 0:
            return None, f"no {metric} observations on {role} during the burst"
        return d.mean, f"{role} {metric}: mean of {d.count:g} transfers (sum/count of the histogram delta)"
    d = pm.histogram_delta(b, a, metric)
    if d is None or d.count <= 0:
        return None, f"no {metric} observations on {role} during the burst"
    q = float(stat)
    return d.quantile(q), f"{role} {metric}: p{int(q * 100)} of {d.count:g} observations (histogram delta)"


def make_threshold_check(key: str) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        role, metric, _, unit, cmp = THRESHOLDS[key]
        limit = ctx.s.thresholds.get(key)
        before, after = ctx.snaps.get("burst_before", {}), ctx.snaps.get("burst_after", {})
        snap = after.get(role)
        if isinstance(snap, pm.Snapshot) and not snap.has(metric):
            return Result(SKIP, f"skipped: because metrics failed: {role} lacks {metric}", "see metrics",
                          cause="metrics failed")
        value, how = threshold_value(key, before, after, ctx.burst_wall_s)
        shown = _fmt(value, "s") if unit == "s" else f"{_n(value, '.4g')} {unit}"
        entry = {"value": value, "limit": limit, "unit": unit, "comparison": cmp, "source": how}
        ctx.measurements.setdefault("thresholds", {})[key] = entry
        if limit is None:
            return Result(NA, f"{shown} ({how}); no threshold set",
                          f"set pdnode_verify_thresholds.{key} to judge it")
        lim = _fmt(limit, "s") if unit == "s" else f"{limit:g} {unit}"
        if value is None or math.isnan(value):
            return Result(FAIL, f"not measurable: {how} (limit {lim})", "the burst produced no observations")
        ok = value <= limit if cmp == "max" else value >= limit
        entry["ok"] = ok
        evidence = f"{shown} {'<=' if cmp == 'max' else '>='} {lim}" if ok else \
            f"{shown} {'>' if cmp == 'max' else '<'} {lim} (limit)"
        if ok:
            return Result(PASS, f"{evidence}; {how}")
        return Result(FAIL, f"{evidence}; {how}", _threshold_hint(key, ctx))
    return run


def _threshold_hint(key: str, ctx: Ctx) -> str:
    if key.startswith("itl") or key.startswith("decode_throughput"):
        return ("decode is slow: check decode's GPU utilisation and batch (num_running_reqs), attention-DP/EP layout, "
                f"and whether another process shares its GPUs; {RUNBOOK}#thresholds")
    if key.startswith("ttft"):
        return ("first tokens are slow: prefill queueing (num_queue_reqs), long prompts, or slow KV transfer "
                f"(kv_transfer_latency_ms); {RUNBOOK}#thresholds")
    if key.startswith("kv_transfer"):
        return ("KV moves slower than the floor: RDMA not in use (fell back to TCP), wrong NIC per GPU "
                f"(nvidia-smi topo -m), or congestion; {RUNBOOK}#thresholds")
    return f"end-to-end latency too high: see TTFT and ITL; {RUNBOOK}#thresholds"


# --- the list -----------------------------------------------------------------------
def all_checks(run: Run) -> list[Check]:
    node = ("bootstrap", "prefill", "decode", "router")
    access_deps = {k: "not_failed" for k in node} if run.targets.base_url == run.targets.router_url else {}
    checks = [
        Check("services", "systemd units active and stable", check_services),
        Check("bootstrap", "prefill bootstrap server: listening, ranks registered", check_bootstrap),
        Check("prefill", "prefill: healthy, runs the plan's arguments", check_prefill),
        Check("decode", "decode: healthy, runs the plan's arguments", check_decode),
        Check("router", "router: ready, exactly the planned workers", check_router),
        Check("proxy", "client environment: proxy variables", check_proxy),
        Check("access", "OpenAI access: URL, API key, response shape", check_access, deps=access_deps),
        Check("completion", "chat completion through the router (plain and streaming)", check_completion,
              deps={**{k: "pass" for k in node}, "access": "pass"}),
        Check("correctness", "reference prompt gives the reference answer", check_correctness,
              deps={"completion": "pass"}),
        Check("disaggregation", "prefill prefilled, KV moved, decode decoded, no failures", check_disaggregation,
              deps={"prefill": "pass", "decode": "pass", "completion": "ran"}, na=("prefill", "decode")),
        Check("metrics", "metric names the thresholds use exist", check_metrics,
              deps={"prefill": "pass", "decode": "pass", "completion": "pass"}, na=("prefill", "decode")),
        Check("burst", "burst of streaming requests", check_burst, deps={"completion": "pass"}),
    ]
    for key in THRESHOLDS:
        role = THRESHOLDS[key][0]
        checks.append(Check(f"threshold.{key}", f"threshold {key}", make_threshold_check(key),
                            deps={"burst": "pass", role: "pass"}, na=(role,)))
    return checks


def gate(check: Check, results: dict[str, CheckResult]) -> Result | None:
    """SKIP/N/A result when a dependency does not allow the check to run, else None."""
    for dep in check.na:
        r = results.get(dep)
        if r is not None and r.status == NA:
            return Result(NA, f"not applicable: needs {dep}, which is not applicable here ({r.evidence})",
                          r.hint)
    for dep, mode in check.deps.items():
        r = results.get(dep)
        if r is None:
            continue
        if r.status == FAIL and mode in ("pass", "not_failed"):
            return Result(SKIP, f"skipped: because {dep} failed", cause=f"{dep} failed")
        if r.status == SKIP and mode in ("pass", "ran"):
            why = r.cause or f"{dep} was skipped"
            return Result(SKIP, f"skipped: because {why}", cause=why)
    return None
