"""Post-deploy verification of a PD node, through its public surface only.

One engine (engine.verify) behind two entry points with identical results:
``pdnode verify INVENTORY`` and ``python -m pdnode.verify --plan PLAN.json`` (the node,
where every engine instance listens on loopback). Standard library + prometheus_client
only, Python >= 3.11: it runs inside the release virtualenv on the host and on
operators' machines.

Modules
    config.py      plan["services"] + options -> Run (one Instance per engine instance)
    http.py        bounded HTTP (urllib): whole-request time limits, SSE, TCP probes
    metrics.py     Prometheus text -> snapshots; deltas, histogram_quantile, instances merged
    access.py      access-layer diagnoses: proxies, API key/Bearer, /v1/v1, 200 without choices
    services.py    systemctl show -> unit state, crash-loop detection
    base.py        statuses, results, the run's context, the gate
    checks.py      the checks in order, with their dependencies; one module per job:
                   checks_services, checks_engines, checks_router, checks_access,
                   checks_completion, checks_disagg, checks_metrics, checks_load
    engine.py      runs the checks, builds the Report; exit codes
    report.py      table and JSON (schema pdnode.verify/1)
    cli.py         `pdnode verify` and `python -m pdnode.verify`
Documentation: docs/verification.md; runbook: docs/runbooks/verification-failed.md.
"""

from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK

SCHEMA = "pdnode.verify/1"

__all__ = ["EXIT_CANNOT_RUN", "EXIT_FAILED", "EXIT_OK", "SCHEMA", "Report", "verify"]


def __getattr__(name: str):
    # The engine (HTTP, metrics parsing) loads on first use, so that `pdnode check`,
    # which registers the verify subcommand, stays fast.
    if name in ("Report", "verify"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)
