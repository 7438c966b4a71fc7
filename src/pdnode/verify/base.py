"""What every check shares: statuses, results, the run's context (HTTP, snapshots of every
engine instance's /metrics), the gate that applies dependencies, and the common hints."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable
from urllib.parse import urlsplit

from . import access as acc
from . import metrics as pm
from ..node.secrets import read_secret_file
from .config import Instance, Run
from .http import Deadline, Response, request
from ..core.inventory.thresholds import M_REQS

PASS, WARN, FAIL, SKIP, NA = "PASS", "WARN", "FAIL", "SKIP", "N/A"
RUNBOOK = "docs/runbooks/verification-failed.md"

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


Snaps = dict[str, "pm.Snapshot | str"]  # instance id -> snapshot of its /metrics, or why there is none


class Ctx:
    """State shared by the checks of one run."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.t = run.targets
        self.s = run.settings
        self.deadline = Deadline(run.settings.overall_s)
        self.results: dict[str, CheckResult] = {}
        self.measurements: dict[str, Any] = {}
        self.snaps: dict[str, Snaps] = {}
        self.reached: dict[str, bool] = {}  # target -> answered at least once
        self.key_raw: str | None = None
        self.key: str | None = None
        self.key_refused: dict[str, str] = {}  # check id -> evidence of a 401/403
        self.internal_error: str | None = None
        # (prefill id, decode id) -> the hand-off the verifier sent that pair (checks_disagg)
        self.handoffs: dict[tuple[str, str], Any] = {}
        # router circuit breakers not closed at the router check: "worker (open, ...)"
        self.circuits: list[str] = []
        self.circuit_open = False  # one of them was open (1), not only half-open (2)
        if run.api_key_file:
            with open(run.api_key_file, encoding="utf-8", newline="") as fh:
                self.key_raw = fh.read()
            self.key = acc.key_from_file_content(self.key_raw)
        # The router's control-plane key: read like the router's launcher reads it
        # (pdnode.node.secrets refuses files others can read); sent to /workers only.
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
        self.mark(url, resp)
        return resp

    def mark(self, url: str, resp: Response) -> None:
        root = root_of(url)
        self.reached[root] = self.reached.get(root, False) or resp.reached

    # --- metrics of the engine instances ---------------------------------------------------
    def scrape(self, inst: Instance) -> pm.Snapshot | str:
        """Snapshot of one instance's /metrics, or why there is none."""
        if inst.url is None:
            return f"{inst.id} is not reachable from here"
        resp = self.get(inst.url + "/metrics")
        if resp.status == 404:
            return (f"{inst.id} /metrics answered 404: metrics are off (start with --enable-metrics; "
                    "the plan sets enable_metrics: true)")
        if not resp.ok:
            return f"{inst.id} /metrics: {resp.short()}"
        try:
            return pm.parse(resp.text)
        except pm.MetricsParseError as exc:
            return f"{inst.id} /metrics: {exc}"

    def snapshot(self, label: str) -> None:
        """Every engine instance's /metrics now, kept as snaps[label][instance id]."""
        self.snaps[label] = {i.id: self.scrape(i) for i in self.t.instances}

    def wait_settled(self, before: Snaps, n: int, max_wait: float = 1.0) -> None:
        """Metrics are recorded when a request finishes inside the engine, a moment after the
        client has its answer: wait (bounded) until the decode instances together counted
        ``n`` more requests."""
        decodes = [i for i in self.t.role("decode") if isinstance(before.get(i.id), pm.Snapshot) and i.url]
        if not decodes:
            return
        end = time.monotonic() + max_wait
        while time.monotonic() < end:
            total = 0.0
            for inst in decodes:
                snap = self.scrape(inst)
                b = before[inst.id]
                if not isinstance(snap, pm.Snapshot) or not isinstance(b, pm.Snapshot):
                    return
                d = pm.counter_rise(b, snap, M_REQS)
                if d is None:
                    return
                total += d
            if total >= n:
                return
            time.sleep(0.05)


def root_of(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"


def fmt(x: float | None, unit: str = "", digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if unit == "s" and x < 1:
        return f"{x * 1000:.1f} ms"
    return f"{x:.{digits}g} {unit}".strip()


def num(x: float | None, spec: str = "g") -> str:
    return "?" if x is None else format(x, spec)


def unit_hint(ctx: Ctx, what: str) -> str:
    """How to look at a service's unit: WHAT is an instance id ("prefill-1") or "router"."""
    inst = next((i for i in ctx.t.instances if i.id == what), None)
    if inst is not None and inst.host:
        return (f"is {inst.host} up and reachable from here (network, its firewall's peers)? on {inst.host}: "
                f"systemctl status <prefix>-{what}; journalctl -u <prefix>-{what} -n 100")
    unit = inst.unit if inst is not None else None
    if unit is None and what == "router":
        unit = next((u for u in ctx.run.expect.units if u.endswith("-router.service")), None)
    if unit and ctx.t.on_node:
        return f"systemctl status {unit}; journalctl -u {unit} -n 100"
    return f"on the node: systemctl status <prefix>-{what}; journalctl -u <prefix>-{what} -n 100"


def conn_hint(resp: Response, what: str, ctx: Ctx, sid: str) -> str:
    if resp.error_kind == "refused":
        return f"nothing listens there: {what} is not running or listens elsewhere; {unit_hint(ctx, sid)}"
    if resp.error_kind == "timeout":
        return f"{what} accepted the connection but did not answer in {ctx.limit():.0f} s: overloaded or stuck; " \
               f"{unit_hint(ctx, sid)}"
    if resp.error_kind == "dns":
        return "the host name does not resolve here: pass the address (--base-url/--router-url http://IP:PORT)"
    return unit_hint(ctx, sid)


def refused(ctx: Ctx, check: str, url: str, resp: Response) -> Result:
    ctx.key_refused[check] = f"{url}: HTTP {resp.status}"
    sent = "no API key was sent" if ctx.key is None else "the API key was refused"
    return Result(SKIP, f"skipped: because {sent} (GET {urlsplit(url).path} -> HTTP {resp.status}); "
                        "the access check says why",
                  "fix the API key first (see access)", cause=f"{sent} (see access)")


def chat_body(ctx: Ctx, content: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ctx.run.expect.served_model_name,
                            "messages": [{"role": "user", "content": content}],
                            "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def fold_stream(events: list[Any]) -> tuple[str, Any, dict | None, float | None, list[Any]]:
    """SSE chunks -> (text, finish_reason, usage, time to first content, error chunks)."""
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
