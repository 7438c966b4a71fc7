"""Every router metric that the alert rules, the dashboard, the runbooks, the verifier and the
bench read is exported by the REAL router of each package pdnode installs (smg 1.13.0, the
default, and sglang-router 0.3.2), scraped from its metrics listener in PD mode in front of
stand-in workers after the traffic the readers watch: plain and streamed completions, and
a failing prefill (the error and circuit-breaker series).

The names are read from the readers themselves (the alert rules rendered from a plan of
that package, the dashboard and runbook templates, pdnode.verify and pdnode.commands.bench*), so a
name added there is checked here without a list to keep. Routers export a family only once
something touched it, hence the traffic; a name the routers never export fails, naming it.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nodeplan import plan_for
from routerproc import REPO, key_file, router_process
from test_router_smg import _require_smg

from pdnode.core.plan import monitoring

pytestmark = pytest.mark.integration

PACKAGES = ("smg", "sglang-router")
CLIENT = "sk-client-metric-names"
ADMIN = "adm-metric-names"
# Where the readers live: the router's metric names they read all start with smg_ (both
# packages export smg_*: sglang-router 0.3.2 already used its successor's names).
READERS = [REPO / "templates" / "grafana", REPO / "templates" / "runbooks", REPO / "src" / "pdnode" / "verify",
           *sorted((REPO / "src" / "pdnode").rglob("bench*.py"))]
NAME = re.compile(r"\bsmg_[a-z0-9_]*(?:\([a-z0-9_|]+\))?[a-z0-9_]*")


def expand(found: str) -> list[str]:
    """A grep pattern `smg_worker_(health|cb_state)` -> both names; a plain name -> itself."""
    m = re.fullmatch(r"([a-z0-9_]*)\(([a-z0-9_|]+)\)([a-z0-9_]*)", found)
    return [m.group(1) + alt + m.group(3) for alt in m.group(2).split("|")] if m else [found]


def names_in(text: str) -> set[str]:
    return {name for found in NAME.findall(text) for name in expand(found)}


def referenced(plan: dict[str, Any]) -> dict[str, set[str]]:
    """metric name -> the readers that name it."""
    out: dict[str, set[str]] = {}
    sources = {"alert rules": monitoring.render_alert_rules(plan)}
    for place in READERS:
        assert place.exists(), f"{place} is gone: point READERS at where the readers live now"
        for f in sorted(place.rglob("*") if place.is_dir() else [place]):
            if f.is_file() and f.suffix in (".py", ".json", ".j2", ".yml"):
                sources[str(f.relative_to(REPO))] = f.read_text()
    for where, text in sources.items():
        for name in names_in(text):
            out.setdefault(name, set()).add(where)
    return out


def exported(text: str) -> set[str]:
    """Every name a Prometheus text exposes: the families (# TYPE) and the samples."""
    out = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            out.add(line.split()[2])
        elif line and not line.startswith("#"):
            out.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return out


@contextlib.contextmanager
def router_node(d: Path, package: str) -> Iterator[Any]:
    from node import standin_node

    if package == "smg":
        _require_smg()
    with standin_node(d, api_key=CLIENT, router=False) as node:
        plan = plan_for(node, pdnode_router_package=package)
        # the failing prefill opens the breakers at once, for a moment
        router = dict(plan["services"]["router"]["args"], worker_startup_check_interval=1,
                      shutdown_grace_period_secs=1, cb_failure_threshold=2, cb_timeout_duration_secs=1)
        (d / "router.json").write_text(json.dumps(router))
        argv = [sys.executable, "-m", "pdnode.node.router_launch", str(d / "router.json"), "--router-package", package,
                "--admin-key-file", key_file(d, "router-admin-key", ADMIN),
                "--api-key-file", key_file(d, "api-key", CLIENT)]
        with router_process(argv, d, node.router_url + "/readiness", {"HF_HUB_OFFLINE": "1"}):
            node.plan = plan
            yield node


def traffic(node: Any) -> None:
    """What the readers watch: completions, plain and streamed, then a prefill failing."""
    from node import request

    headers = {"Authorization": f"Bearer {CLIENT}"}
    body = {"model": "fake-model", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    for stream in (False, True, False):
        resp = request("POST", node.router_url + "/v1/chat/completions", {**body, "stream": stream},
                       headers=headers, timeout=60)
        assert resp.status == 200, resp.text
    node.set_faults("prefill", ["error500"])
    for _ in range(2):
        resp = request("POST", node.router_url + "/v1/chat/completions", body, headers=headers, timeout=60)
        assert resp.status >= 500, resp.text
    node.set_faults("prefill", [])


@pytest.mark.parametrize("package", PACKAGES)
def test_every_router_metric_the_readers_name_is_exported(tmp_path, package):
    from node import request

    with router_node(tmp_path, package) as node:
        names = referenced(node.plan)
        # the readers name the router's metrics at all (an empty set would prove nothing)
        assert {"smg_worker_cb_state", "smg_worker_health", "smg_http_responses_total"} <= set(names)
        traffic(node)
        resp = request("GET", node.plan["services"]["router"]["metrics_url"], timeout=10)
        assert resp.status == 200, resp.text
        have = exported(resp.text)
        # PdRouterWorkersMissing compares the pool size per worker_type with the plan's counts
        from node import parse_metrics
        pools = {lab.get("worker_type"): v for _, lab, v in parse_metrics(resp.text).get("smg_worker_pool_size", [])}
        router = node.plan["services"]["router"]["args"]
        assert pools == {"prefill": len(router["prefill"]), "decode": len(router["decode"])}, pools
    missing = {name: sorted(where) for name, where in names.items() if name not in have}
    assert not missing, f"{package} does not export: {json.dumps(missing)}"
