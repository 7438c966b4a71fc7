"""The checks, in the order they run, with their dependencies (one module per job does the
work: checks_services, checks_engines, checks_router, checks_access, checks_completion,
checks_disagg, checks_kvlink, checks_metrics, checks_load; the threshold table is thresholds.py).

Order: an early failure explains later ones. A check whose prerequisite failed (or was
skipped) is SKIP "because X failed", never PASS; a check whose data source cannot be
reached from where the verifier runs is N/A. Engine instances are checked one by one,
each check named by the instance's id (prefill-0, decode-1, ...):

    services -> bootstrap.<prefill> -> <instance> -> router -> proxy -> access
      -> completion -> correctness -> disaggregation -> disaggregation.<instance>
      -> kv.link -> kv.transport -> metrics -> burst -> threshold.*
"""

from __future__ import annotations

from .base import FAIL, NA, PASS, SKIP, WARN, Check, CheckResult, Ctx, Result, gate
from .checks_access import check_access, check_proxy
from .checks_completion import check_completion, check_correctness
from .checks_disagg import check_disaggregation, instance_check, own_checks
from .checks_engines import bootstrap_check, engine_check
from .checks_kvlink import check_kv_link
from .checks_transport import check_kv_transport
from .checks_load import check_burst, make_threshold_check
from .checks_metrics import check_metrics
from .checks_router import check_router
from .checks_services import check_services
from .config import Run
from ..core.inventory.thresholds import THRESHOLDS

__all__ = ["FAIL", "NA", "PASS", "SKIP", "WARN", "Check", "CheckResult", "Ctx", "Result", "all_checks", "gate"]


def all_checks(run: Run) -> list[Check]:
    instances = run.targets.instances
    node = [f"bootstrap.{i.id}" for i in instances if i.role == "prefill"] + [i.id for i in instances] + ["router"]
    access_deps = {k: "not_failed" for k in node} if run.targets.base_url == run.targets.router_url else {}
    engines = tuple(i.id for i in instances)
    checks = [Check("services", "systemd units active and stable", check_services)]
    checks += [Check(f"bootstrap.{i.id}", f"{i.id} bootstrap server: listening, ranks registered",
                     bootstrap_check(i.id)) for i in instances if i.role == "prefill"]
    checks += [Check(i.id, f"{i.id}: healthy, runs the plan's arguments", engine_check(i.id)) for i in instances]
    checks += [
        Check("router", "router: ready, exactly the planned workers", check_router),
        Check("proxy", "client environment: proxy variables", check_proxy),
        Check("access", "OpenAI access: URL, API key, response shape", check_access, deps=access_deps),
        Check("completion", "chat completion through the router (plain and streaming)", check_completion,
              deps={**{k: "pass" for k in node}, "access": "pass"}),
        Check("correctness", "reference prompt gives the reference answer", check_correctness,
              deps={"completion": "pass"}),
        Check("disaggregation", "over the router's traffic: prefills prefilled, KV moved, decodes decoded, "
                                "no failures", check_disaggregation,
              deps={**{k: "pass" for k in engines}, "completion": "ran"}, na=engines),
    ]
    checks += [Check(f"disaggregation.{i.id}", f"{i.id} did its part of a PD request sent to it",
                     instance_check(i.id), deps={k: "pass" for k in own_checks(i)}, na=(i.id,))
               for i in instances]
    checks.append(Check("kv.link", "the KV path's link, measured with the Mooncake check (GPU to GPU)",
                        check_kv_link))
    checks.append(Check("kv.transport", "the transport each engine's Mooncake installed is the plan's KV path",
                        check_kv_transport))
    checks += [
        Check("metrics", "metric names the checks and thresholds use exist", check_metrics,
              deps={**{k: "pass" for k in engines}, "completion": "pass"}, na=engines),
        Check("burst", "burst of streaming requests", check_burst, deps={"completion": "pass"}),
    ]
    for key, t in THRESHOLDS.items():
        of_role = tuple(i.id for i in instances if i.role == t.role)
        checks.append(Check(f"threshold.{key}", f"threshold {key}", make_threshold_check(key),
                            deps={"burst": "pass", **{k: "pass" for k in of_role}}, na=of_role))
    return checks
