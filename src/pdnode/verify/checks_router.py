"""router: ready, /workers (read with the admin key) lists exactly the plan's prefill
instances (with their bootstrap ports) and decode instances, all healthy, worker
management closed to clients; circuit breakers reported, never failed here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import metrics as pm
from .base import FAIL, PASS, Ctx, Result, conn_hint, refused, unit_hint


@dataclass
class Workers:
    problems: list[str] = field(default_factory=list)
    hint: str = ""
    listed: str = ""


def compare_workers(ctx: Ctx, workers: list[Any]) -> Workers:
    """The router's worker list against the plan, every instance named by its id."""
    out = Workers()
    by_url = {i.router_url: i for i in ctx.t.instances}

    def name(url: str) -> str:
        inst = by_url.get(url)
        return f"{inst.id} {url}" if inst else url

    rows = [w for w in workers if isinstance(w, dict)]
    got_p = sorted((str(w.get("url", "")).rstrip("/"), w.get("bootstrap_port")) for w in rows
                   if w.get("worker_type") == "prefill")
    got_d = sorted(str(w.get("url", "")).rstrip("/") for w in rows if w.get("worker_type") == "decode")
    want_p = sorted((str(u), b) for u, b in ctx.run.expect.router_prefill)
    want_d = sorted(ctx.run.expect.router_decode)
    for url, boot in want_p:
        if (url, boot) not in got_p:
            listed = [b for u, b in got_p if u == url]
            out.problems.append(f"{name(url)} (bootstrap {boot}) " + (
                f"listed with bootstrap port {listed[0]}" if listed else "not listed as a prefill worker"))
    for url, boot in got_p:
        if (url, boot) not in want_p and url not in [u for u, _ in want_p]:
            out.problems.append(f"prefill worker {url} (bootstrap {boot}) is not in the plan")
    for url in want_d:
        if url not in got_d:
            out.problems.append(f"{name(url)} not listed as a decode worker")
    for url in got_d:
        if url not in want_d:
            out.problems.append(f"decode worker {url} is not in the plan")
    unhealthy = [name(str(w.get("url", "")).rstrip("/")) for w in rows if w.get("is_healthy") is False]
    if unhealthy:
        out.problems.append(f"unhealthy: {', '.join(unhealthy)}")
        out.hint = ("the router marks these workers unhealthy (its health checks fail): see their own checks above "
                    "and their logs")
    order = {i.router_url: n for n, i in enumerate(ctx.t.instances)}  # the plan's order, unknown ones last
    got_p.sort(key=lambda ub: (order.get(ub[0], len(order)), ub[0]))
    got_d.sort(key=lambda u: (order.get(u, len(order)), u))
    out.listed = (f"{len(got_p)} prefill [" + ", ".join(f"{name(u)} bootstrap {b}" for u, b in got_p) + "], "
                  f"{len(got_d)} decode [" + ", ".join(name(u) for u in got_d) + "]")
    return out


LEFT_OUT_HINT = ("a planned worker the router does not list was taken out (a drain before a planned stop, "
                 "interrupted?): playbooks/deploy.yml or playbooks/restart.yml puts it back once its engine is ready "
                 "(pdnode.node.drain reconcile)")


def check_router(ctx: Ctx) -> Result:
    base = ctx.t.router_url
    ready = ctx.get(base + "/readiness", auth=False)
    if not ready.reached:
        return Result(FAIL, f"{base}/readiness: {ready.short()}", conn_hint(ready, "the router", ctx, "router"))
    if not ready.ok:
        # A planned worker missing from the list (a drain taken out and never put back) is
        # named here too: the router is not ready without it.
        found = None
        if ctx.admin_key:
            listing = ctx.get(base + "/workers", headers=ctx.admin_headers())
            body = listing.json() if listing.ok else None
            if isinstance(body, dict) and isinstance(body.get("workers"), list):
                found = compare_workers(ctx, body["workers"])
        if found is not None and found.problems:
            return Result(FAIL, f"{base}/readiness: {ready.short()}; /workers: " + "; ".join(found.problems),
                          LEFT_OUT_HINT)
        return Result(FAIL, f"{base}/readiness: {ready.short()}",
                      "the router has no healthy prefill+decode pair: a worker is down or failed registration "
                      "(the router gives up after worker_startup_timeout_secs): check prefill/decode above, then "
                      f"restart the router; {unit_hint(ctx, 'router')}")
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
            return refused(ctx, "router", base + "/workers", workers)
        listed = ("; worker list not read: /workers needs the router's admin key (--admin-key-file; on the node "
                  "<config_dir>/router-admin-key), clients get " + f"HTTP {workers.status}")
    body = workers.json() if workers.ok else None
    if not listed:
        if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
            return Result(FAIL, f"/readiness 200; /workers: {workers.short()}", "unexpected answer from /workers")
        found = compare_workers(ctx, body["workers"])
        problems += found.problems
        hint = hint or found.hint
        listed = f"; /workers: {found.listed}"
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
                      hint or f"{LEFT_OUT_HINT}; a worker the plan lacks: redeploy so router.json matches, or "
                              f"restart the router; {unit_hint(ctx, 'router')}")
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


def circuit_hint(ctx: Ctx) -> str:
    if not ctx.circuits:
        return ""
    return (f"the router's circuit breaker was not closed for {', '.join(ctx.circuits)}: after repeated failures "
            f"it sends nothing to that worker for {ctx.run.expect.circuit_open_s} s (cb_timeout_duration_secs in "
            "the plan, pdnode_router_circuit_open_s) and answers 503; find the failures' cause in the engines' "
            "logs; restarting the router closes the circuits")
