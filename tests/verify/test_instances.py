"""Per-instance verification against small fake engines (no processes): two prefills and
one decode behind a fake router whose policy sends every request to prefill-0 -- the
case where judging instances by the router's traffic would give a false FAIL. Each
instance's proof is the hand-off the verifier sends it (checks_disagg.py); the router's
worker list must be exactly the plan's instances, each named by its id."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any

import pytest
from conftest import chat_reply, fake_server
from nodeplan import contract_plan

from pdnode.verify.base import FAIL, PASS, SKIP
from pdnode.verify.config import ConfigError, build_run
from pdnode.verify.engine import verify

ZERO_HISTOGRAMS = ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                   "sglang:e2e_request_latency_seconds", "sglang:kv_transfer_speed_gb_s")


class FakeEngine:
    """/health, /server_info, /metrics and /generate of one SGLang instance; its counters
    rise with every request it serves (``counts``: False for one that answers without
    counting, ``status``: the HTTP status /generate answers)."""

    def __init__(self, role: str, tp: int = 4, attn_dp: int = 1):
        self.role, self.tp, self.attn_dp = role, tp, attn_dp
        self.requests = self.prompt = self.gen = self.kv = 0
        self.counts, self.status = True, 200
        self.generate_bodies: list[dict] = []
        self.lock = threading.Lock()

    def serve(self, prompt_tokens: int = 50, gen_tokens: int = 4) -> None:
        if not self.counts:
            return
        with self.lock:
            self.requests += 1
            self.prompt += prompt_tokens
            self.gen += gen_tokens if self.role == "decode" else 0
            self.kv += 1 if self.role == "prefill" else 0

    def metrics(self) -> str:
        # Like SGLang's labelled metrics: a counter has only its # TYPE line until it first moves.
        lines = []
        for name, value in (("num_requests", self.requests), ("prompt_tokens", self.prompt),
                            ("generation_tokens", self.gen), ("num_bootstrap_failed_reqs", 0),
                            ("num_transfer_failed_reqs", 0)):
            lines += [f"# TYPE sglang:{name} counter"] + ([f"sglang:{name}_total {value}"] if value else [])
        for name, count in ((n, 0) for n in ZERO_HISTOGRAMS):
            lines += [f"# TYPE {name} histogram", f'{name}_bucket{{le="1.0"}} {count}',
                      f'{name}_bucket{{le="+Inf"}} {count}', f"{name}_count {count}", f"{name}_sum 0"]
        lines += ["# TYPE sglang:kv_transfer_total_mb histogram", f'sglang:kv_transfer_total_mb_bucket{{le="1.0"}} {self.kv}',
                  f'sglang:kv_transfer_total_mb_bucket{{le="+Inf"}} {self.kv}',
                  f"sglang:kv_transfer_total_mb_count {self.kv}", f"sglang:kv_transfer_total_mb_sum {self.kv * 0.5}"]
        return "\n".join(lines) + "\n"

    def handler(self, req: Any, body: dict | None) -> tuple[int, Any]:
        if req.path == "/health":
            return 200, b""
        if req.path == "/server_info":
            return 200, {"disaggregation_mode": self.role, "tp_size": self.tp, "attn_dp_size": self.attn_dp,
                         "served_model_name": "m"}
        if req.path == "/metrics":
            return 200, self.metrics().encode()
        if req.path == "/generate":
            self.generate_bodies.append(body or {})
            if self.status != 200:
                return self.status, {"error": "boom"}
            self.serve()
            return 200, {"text": "Paris" if self.role == "decode" else "", "meta_info": {}}
        return 404, {}


def bootstrap_handler(req: Any, body: dict | None) -> tuple[int, Any]:
    if req.path == "/health":
        return 200, b"OK"
    return 200, {"attn_tp_size": 4, "dp_size": 1, "attn_cp_size": 1, "pp_size": 1}


class Node:
    """Fake prefill-0, prefill-1, decode-0, their bootstrap servers and a router that
    routes every request to (prefill-0, decode-0)."""

    def __init__(self, stack: ExitStack):
        self.plan = contract_plan(prefills=2, decodes=1)
        self.engines = {"prefill-0": FakeEngine("prefill"), "prefill-1": FakeEngine("prefill"),
                        "decode-0": FakeEngine("decode", attn_dp=4)}
        self.urls = {iid: stack.enter_context(fake_server(e.handler)) for iid, e in self.engines.items()}
        self.boots = {iid: stack.enter_context(fake_server(bootstrap_handler)) for iid in ("prefill-0", "prefill-1")}
        svc = self.plan["services"]
        self.workers = [{"url": svc["prefill-0"]["url"], "worker_type": "prefill", "is_healthy": True,
                         "bootstrap_port": svc["prefill-0"]["bootstrap_port"]},
                        {"url": svc["prefill-1"]["url"], "worker_type": "prefill", "is_healthy": True,
                         "bootstrap_port": svc["prefill-1"]["bootstrap_port"]},
                        {"url": svc["decode-0"]["url"], "worker_type": "decode", "is_healthy": True}]
        self.router = stack.enter_context(fake_server(self.route))
        self.router_metrics = stack.enter_context(fake_server(lambda r, b: (200, b"")))

    def route(self, req: Any, body: dict | None) -> tuple[int, Any]:
        if req.path == "/readiness":
            return 200, {"status": "ready"}
        if req.path == "/workers":
            return 200, {"workers": self.workers}
        if req.path == "/v1/chat/completions":
            # the policy: always prefill-0 (cache_aware with a warm prefix does this)
            self.engines["prefill-0"].serve()
            self.engines["decode-0"].serve()
            return chat_reply(body, "Paris", 2)
        return 404, {}

    def run(self, **kw: Any):
        return build_run(self.plan, router_url=self.router, base_url=self.router,
                         router_metrics_url=self.router_metrics + "/metrics",
                         instance_urls=[f"{k}={v}" for k, v in self.urls.items()],
                         bootstrap_urls=[f"{k}={v}" for k, v in self.boots.items()],
                         env={}, skip_burst=True, on_node=True, **kw)


@pytest.fixture
def node():
    with ExitStack() as stack:
        yield Node(stack)


def checks_of(rep) -> dict[str, Any]:
    return {c.id: c for c in rep.checks}


def explain(rep) -> str:
    return "\n".join(f"{c.id} {c.status}: {c.evidence} | {c.hint}" for c in rep.checks)


def test_an_instance_the_router_never_picked_is_proven_by_its_own_hand_off(node):
    rep = verify(node.run())
    c = checks_of(rep)
    assert rep.exit_code == 0, explain(rep)
    ids = [x.id for x in rep.checks]
    for iid in ("bootstrap.prefill-0", "bootstrap.prefill-1", "prefill-0", "prefill-1", "decode-0",
                "disaggregation.prefill-0", "disaggregation.prefill-1", "disaggregation.decode-0"):
        assert iid in ids and c[iid].status == PASS, explain(rep)
    # the router sent prefill-1 nothing (its counters have no series yet): shown, not judged
    assert "prefill-1 +0 requests" in c["disaggregation"].evidence
    assert rep.measurements["disaggregation"]["router_traffic"]["prefill-1"]["requests"] == 0
    # its own proof: the hand-off with decode-0, and its counters
    ev = c["disaggregation.prefill-1"].evidence
    assert "prefill-1 + decode-0 hand-off" in ev and "prefill-1 counted +1 requests, +50 prompt tokens, +1 KV" in ev
    # what the router would send: one room, prefill-1's bootstrap port, to both sides
    p_body, d_body = node.engines["prefill-1"].generate_bodies[0], node.engines["decode-0"].generate_bodies[-1]
    assert p_body == d_body and p_body["bootstrap_port"] == node.plan["services"]["prefill-1"]["bootstrap_port"]
    # max(N, M) hand-offs: decode-0 reuses the pair it made with prefill-0
    assert len(node.engines["decode-0"].generate_bodies) == 2
    assert rep.measurements["instances"]["decode-0"]["partner"] == "prefill-0"
    assert "2 prefill [prefill-0 http://127.0.0.1:2 bootstrap 3, prefill-1 http://127.0.0.1:4 bootstrap 5]" \
        in c["router"].evidence


def test_an_instance_that_answers_but_does_not_count_fails(node):
    node.engines["prefill-1"].counts = False  # e.g. another process answers on its port
    rep = verify(node.run())
    c = checks_of(rep)
    assert rep.exit_code == 1 and [x.id for x in rep.failed()] == ["disaggregation.prefill-1"], explain(rep)
    assert "prefill-1's counters did not rise (sglang:num_requests_total +0" in c["disaggregation.prefill-1"].evidence
    assert c["disaggregation.prefill-0"].status == PASS and c["disaggregation.decode-0"].status == PASS


def test_an_instance_that_fails_requests_is_named_and_blamed(node):
    node.engines["prefill-1"].status = 500
    rep = verify(node.run())
    c = checks_of(rep)
    assert [x.id for x in rep.failed()] == ["disaggregation.prefill-1"], explain(rep)
    res = c["disaggregation.prefill-1"]
    assert "prefill-1 did not serve its part" in res.evidence and "prefill-1 HTTP 500" in res.evidence
    # decode-0 served with prefill-0: the fault is prefill-1's
    assert "the fault is prefill-1's: decode-0 serves with prefill-0" in res.hint


def test_a_decode_that_fails_with_every_prefill_is_the_one_blamed(node):
    node.engines["decode-0"].status = 500
    rep = verify(node.run())
    c = checks_of(rep)
    assert {x.id for x in rep.failed()} == {"disaggregation.prefill-0", "disaggregation.prefill-1",
                                            "disaggregation.decode-0"}, explain(rep)
    assert "the fault is decode-0's: decode-0 failed with every partner tried (prefill-0, prefill-1)" \
        in c["disaggregation.decode-0"].hint
    for iid in ("prefill-0", "prefill-1"):
        assert "the fault is likely decode-0's" in c[f"disaggregation.{iid}"].hint, c[f"disaggregation.{iid}"]


def test_one_decode_for_two_hand_offs_and_a_second_decode_proven_alone():
    """1P2D: prefill-0 is proven with decode-0; decode-1 gets its own hand-off with prefill-0."""
    with ExitStack() as stack:
        plan = contract_plan(prefills=1, decodes=2)
        engines = {"prefill-0": FakeEngine("prefill"), "decode-0": FakeEngine("decode", attn_dp=4),
                   "decode-1": FakeEngine("decode", attn_dp=4)}
        urls = {k: stack.enter_context(fake_server(e.handler)) for k, e in engines.items()}
        boot = stack.enter_context(fake_server(bootstrap_handler))
        run = build_run(plan, router_url="http://127.0.0.1:1", instance_urls=[f"{k}={v}" for k, v in urls.items()],
                        bootstrap_urls=[boot], env={}, skip_burst=True, on_node=True)
        rep = verify(run)
    c = checks_of(rep)
    assert c["disaggregation.decode-1"].status == PASS and "prefill-0 + decode-1 hand-off" in \
        c["disaggregation.decode-1"].evidence, explain(rep)
    assert c["disaggregation.decode-0"].status == c["disaggregation.prefill-0"].status == PASS
    assert len(engines["prefill-0"].generate_bodies) == 2  # max(N, M) hand-offs
    assert c["router"].status == FAIL  # nothing listens on the router's port: it says so, the proofs still ran


def test_router_lists_exactly_the_plans_instances(node):
    node.workers = [w for w in node.workers if not w["url"].endswith(":4")]  # prefill-1 missing
    node.workers.append({"url": "http://127.0.0.1:9", "worker_type": "decode", "is_healthy": False})
    rep = verify(node.run(admin_key_file=None))
    ev = checks_of(rep)["router"].evidence
    assert checks_of(rep)["router"].status == FAIL
    assert "prefill-1 http://127.0.0.1:4 (bootstrap 5) not listed as a prefill worker" in ev
    assert "decode worker http://127.0.0.1:9 is not in the plan" in ev and "unhealthy: http://127.0.0.1:9" in ev
    node.workers[0]["bootstrap_port"] = 99
    ev = checks_of(verify(node.run()))["router"].evidence
    assert "prefill-0 http://127.0.0.1:2 (bootstrap 3) listed with bootstrap port 99" in ev


def test_a_decode_the_router_does_not_list_is_named_by_its_id(node):
    """An interrupted drain (out, never in) leaves a decode out of the router's list
    (docs/field-failures.md row 11): the router check FAILs naming the planned instance."""
    node.workers = [w for w in node.workers if w["worker_type"] != "decode"]
    router = checks_of(verify(node.run()))["router"]
    url = node.plan["services"]["decode-0"]["url"]
    assert router.status == FAIL and f"decode-0 {url} not listed as a decode worker" in router.evidence, \
        router.evidence


def test_a_stopped_prefill_fails_and_the_others_are_still_proven(node):
    """prefill-1 listens nowhere: it FAILs by name; decode-0 is proven with prefill-0."""
    plan = contract_plan(prefills=2, decodes=1)
    with ExitStack() as stack:
        engines = {"prefill-0": FakeEngine("prefill"), "decode-0": FakeEngine("decode", attn_dp=4)}
        urls = {k: stack.enter_context(fake_server(e.handler)) for k, e in engines.items()}
        boot = stack.enter_context(fake_server(bootstrap_handler))
        run = build_run(plan, router_url=node.router, base_url=node.router,
                        router_metrics_url=node.router_metrics + "/metrics",
                        instance_urls=[f"{k}={v}" for k, v in urls.items()] + ["prefill-1=http://127.0.0.1:1"],
                        bootstrap_urls=[f"prefill-0={boot}", "prefill-1=http://127.0.0.1:1"],
                        env={}, skip_burst=True, on_node=True)
        rep = verify(run)
    c = checks_of(rep)
    assert c["prefill-1"].status == FAIL and "connection refused" in c["prefill-1"].evidence, explain(rep)
    assert c["bootstrap.prefill-1"].status == FAIL
    assert c["disaggregation.prefill-1"].status == SKIP and \
        c["disaggregation.prefill-1"].evidence == "skipped: because prefill-1 failed"
    assert c["disaggregation.prefill-0"].status == PASS and c["disaggregation.decode-0"].status == PASS


def test_urls_name_their_instance():
    plan = contract_plan(prefills=2, decodes=1)
    with pytest.raises(ConfigError, match=r"the plan has 2 prefill instances \(prefill-0, prefill-1\); name one: "
                                          r"--instance-url prefill-0=URL"):
        build_run(plan, prefill_url="http://127.0.0.1:9", env={})
    with pytest.raises(ConfigError, match="the plan has no instance 'prefill-7'"):
        build_run(plan, instance_urls=["prefill-7=http://127.0.0.1:9"], env={})
    with pytest.raises(ConfigError, match="give ID=http://HOST:PORT"):
        build_run(plan, instance_urls=["http://127.0.0.1:9"], env={})
    run = build_run(plan, instance_urls=["prefill-1=http://10.0.0.1:9/"], env={})  # remote: only what is given
    assert [(i.id, i.url) for i in run.targets.instances] == [("prefill-0", None), ("prefill-1", "http://10.0.0.1:9"),
                                                               ("decode-0", None)]


def test_an_old_plan_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"an old plan \(top-level prefill/decode\): re-render it"):
        build_run({"prefill": {}, "decode": {}, "router": {}}, env={})
