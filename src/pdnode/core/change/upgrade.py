"""The upgrade's decisions, on the controller: which release serves, where a rollback goes,
the host's release record and the report. playbooks/upgrade.yml calls them through their
command line, pdnode.commands.upgrade, with one JSON object on standard input and reads one
JSON object on standard output:

    python -m pdnode.commands.upgrade decide   {record, unit_venv (a venv or the router's ExecStart), target, host_model} -> {from, to, record}
    python -m pdnode.commands.upgrade finish   {record, from, to, outcome}          -> record
    python -m pdnode.commands.upgrade report   {host, from, to, steps, verify, probe, rollback} -> report (schema pdnode.upgrade/1)

A release is the versions that name a release virtualenv (VERSION_KEYS) and that venv,
and, where the inventory names the model's source, the model commit it serves with the
lock it was verified against ({commit, lock}): a model change is a release change too, and
its way back goes to the commit that served (the host keeps it).
The record (/var/lib/pdnode/releases/<prefix>.json on the host) names the release that
serves (last verified), the one before it, and while an upgrade runs the one it switches
to: a re-run after an interruption starts from the last verified release, so its
rollback target never is a half-switched one.
"""

from __future__ import annotations

import json
import re
from typing import Any

RECORD_SCHEMA = "pdnode.release-record/1"
REPORT_SCHEMA = "pdnode.upgrade/1"
VERSION_KEYS = ("pdnode_sglang_version", "pdnode_router_package", "pdnode_sglang_router_version",
                "pdnode_smg_version", "pdnode_mooncake_version", "pdnode_mooncake_cuda13_version")
OUTCOMES = ("upgraded", "rolled_back", "rollback_failed")
# The release directory names plan._release makes: <engine part>-<router part>-mooncake-V-cu13-V.
_RELEASE_RE = re.compile(
    r"^(?:sim|sglang-(?P<sglang>[^-/]+))-(?:router-(?P<router>[^-/]+)|smg-(?P<smg>[^-/]+))"
    r"-mooncake-(?P<mooncake>[^-/]+)-cu13-(?P<cu13>[^-/]+)$")
# The router's own venv (plan.router_venv_name): router-<package>-<version>.
_ROUTER_VENV_RE = re.compile(r"^router-(?P<package>smg|sglang-router)-(?P<version>[^/]+)$")
_ROUTER_PART_RE = re.compile(r"-(?:router-[^-/]+|smg-[^-/]+)-mooncake-")
# systemctl show -p ExecStart --value: "{ path=<venv>/bin/python ; argv[]=... }"
_EXEC_VENV_RE = re.compile(r"path=(/[^ ;]+)/bin/python[0-9.]* ")
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}$")


class UpgradeError(ValueError):
    pass


def release_of_venv(venv: str, target: dict[str, Any]) -> dict[str, Any]:
    """The versions a release venv's directory name says (a node deployed before the
    upgrade playbook has no record: its units name its venv). Versions the name does not
    carry (SGLang's for the stand-in, the other router package's) are the target's."""
    name = venv.rstrip("/").rsplit("/", 1)[-1]
    r = _ROUTER_VENV_RE.match(name)
    if r:
        return _release_of_router_venv(r["package"], r["version"], target)
    m = _RELEASE_RE.match(name)
    if not m:
        raise UpgradeError(f"release venv {venv!r}: not a pdnode release directory name; fix: deploy the node "
                           "with playbooks/deploy.yml first")
    versions = {k: target["versions"][k] for k in VERSION_KEYS}
    if m["sglang"]:
        versions["pdnode_sglang_version"] = m["sglang"]
    if m["smg"]:
        versions.update(pdnode_router_package="smg", pdnode_smg_version=m["smg"])
    else:
        versions.update(pdnode_router_package="sglang-router", pdnode_sglang_router_version=m["router"])
    versions.update(pdnode_mooncake_version=m["mooncake"], pdnode_mooncake_cuda13_version=m["cu13"])
    return {"versions": versions, "venv": venv.rstrip("/")}


def _release_of_router_venv(package: str, version: str, target: dict[str, Any]) -> dict[str, Any]:
    """A host that runs only the router names no release in its unit (the router runs from
    its own venv, router-<package>-<version>): its release is the target's with that
    router (the host's release venv serves only the verifier and the drain there)."""
    versions = {k: target["versions"][k] for k in VERSION_KEYS}
    versions["pdnode_router_package"] = package
    versions["pdnode_smg_version" if package == "smg" else "pdnode_sglang_router_version"] = version
    part = f"-smg-{version}-mooncake-" if package == "smg" else f"-router-{version}-mooncake-"
    head, _, name = target["venv"].rstrip("/").rpartition("/")
    return {"versions": versions, "venv": f"{head}/{_ROUTER_PART_RE.sub(part, name, count=1)}"}


def _check_model(model: Any, what: str) -> dict[str, Any] | None:
    if model is None:
        return None
    if (not isinstance(model, dict) or not isinstance(model.get("commit"), str)
            or not re.fullmatch(r"[0-9a-f]{40}", model["commit"]) or not isinstance(model.get("lock"), dict)
            or model["lock"].get("commit") != model["commit"]):
        raise UpgradeError(f"{what}.model: must be null or {{commit (40 hex), lock (that commit's lock)}}, got "
                           f"{json.dumps(model)[:200]}")
    return {"commit": model["commit"], "lock": model["lock"]}


def _check_release(rel: Any, what: str) -> dict[str, Any]:
    if not isinstance(rel, dict) or not isinstance(rel.get("versions"), dict) or not isinstance(rel.get("venv"), str):
        raise UpgradeError(f"{what}: must be {{versions, venv}}, got {json.dumps(rel)[:200]}")
    for k in VERSION_KEYS:
        v = rel["versions"].get(k)
        if not isinstance(v, str) or not _VERSION_RE.match(v):
            raise UpgradeError(f"{what}.versions.{k} is {json.dumps(v)}: must be a version string")
    out = {"versions": {k: rel["versions"][k] for k in VERSION_KEYS}, "venv": rel["venv"]}
    return _with_model(out, _check_model(rel.get("model"), what))


def _with_model(release: dict[str, Any], model: dict[str, Any] | None) -> dict[str, Any]:
    """The release with its model; without one it has no "model" key (a record from before
    pdnode knew the model reads the same)."""
    out = {k: v for k, v in release.items() if k != "model"}
    return {**out, "model": model} if model is not None else out


def decide(record: dict[str, Any] | None, unit_venv: str, target: dict[str, Any],
           host_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """From (the release that serves, verified) and to; the record to write before switching.
    ``host_model``: the model commit the host serves now, with its lock (the model role's
    record on the host; null without one): what a release from before the model's record,
    or changed by a deploy since, serves."""
    to = _check_release(target, "target")
    here = _check_model(host_model if host_model and host_model.get("commit") else None, "host_model")
    m = _EXEC_VENV_RE.search(unit_venv)
    running = m[1] if m else (unit_venv.rstrip("/") if unit_venv.startswith("/") else "")
    if record and _ROUTER_VENV_RE.match(running.rsplit("/", 1)[-1]):
        running = ""  # a router-only host: its router's venv names no release; the record does
    if record:
        if record.get("schema") != RECORD_SCHEMA:
            raise UpgradeError(f"release record schema {record.get('schema')!r}: expected {RECORD_SCHEMA!r}; "
                               "fix: move the file away and re-run (the units then name the serving release)")
        frm = _check_release(record.get("serving"), "record.serving")
        previous = record.get("previous")
        pending = record.get("switching_to") or {}
        # The units name neither the recorded release nor an interrupted switch's target:
        # a deploy (playbooks/deploy.yml) changed the release since; what runs is the start.
        if running and running not in (frm["venv"], pending.get("venv")):
            frm, previous = _with_model(release_of_venv(running, to), here), frm
        elif here is not None and here["commit"] not in ((frm.get("model") or {}).get("commit"),
                                                          (pending.get("model") or {}).get("commit")):
            # the host serves neither the recorded commit nor an interrupted switch's: a
            # deploy changed the model since (or the record predates it); what serves is the start
            frm = _with_model(frm, here)
    elif running:
        frm, previous = _with_model(release_of_venv(running, to), here), None
    else:
        raise UpgradeError("no release serves on this host (no record, no router unit); "
                           "fix: deploy it with playbooks/deploy.yml first")
    return {"from": frm, "to": to,
            "record": {"schema": RECORD_SCHEMA, "serving": frm, "previous": previous, "switching_to": to}}


def finish(record: dict[str, Any], frm: dict[str, Any], to: dict[str, Any], outcome: str) -> dict[str, Any]:
    """The record after the upgrade: the new release serves, or the old one still does."""
    if outcome not in OUTCOMES:
        raise UpgradeError(f"outcome {outcome!r}: must be one of {', '.join(OUTCOMES)}")
    out = {"schema": RECORD_SCHEMA}
    if outcome == "upgraded":
        same = frm["venv"] == to["venv"]
        out.update(serving=to, previous=record.get("previous") if same else frm, switching_to=None)
    elif outcome == "rolled_back":
        out.update(serving=frm, previous=record.get("previous"), switching_to=None, failed=to)
    else:
        # Neither release verified: keep the switch pending, so the next run starts from
        # the last verified release again and tries the same two.
        out.update(serving=frm, previous=record.get("previous"), switching_to=to)
    return out


def _failed_checks(report: Any) -> list[str]:
    if not isinstance(report, dict):
        return []
    return [c.get("id", "?") for c in report.get("checks", []) if c.get("status") == "FAIL"]


def build_report(doc: dict[str, Any]) -> dict[str, Any]:
    """steps: [{name, start, end, ok}] (epoch seconds); verify: {name: verify report or
    null}; probe: the prober's result or null; rollback: whether it was attempted."""
    steps = []
    for s in doc.get("steps", []):
        start, end = s.get("start"), s.get("end")
        took = round(float(end) - float(start), 3) if start is not None and end is not None else None
        steps.append({"name": s["name"], "ok": bool(s.get("ok")), "duration_s": took})
    failed = {s["name"] for s in steps if not s["ok"]}
    verify = {name: {"passed": isinstance(r, dict) and r.get("exit_code") == 0, "failed_checks": _failed_checks(r)}
              for name, r in (doc.get("verify") or {}).items()}
    upgraded = not failed & {"build", "switch", "verify"} and verify.get("verify", {}).get("passed", False)
    if upgraded:
        outcome = "upgraded"
    elif not failed & {"rollback", "reverify"} and verify.get("reverify", {}).get("passed", False):
        outcome = "rolled_back"
    else:
        outcome = "rollback_failed"
    probe = doc.get("probe") or {}
    rollback_s = sum(s["duration_s"] or 0 for s in steps if s["name"] in ("rollback", "reverify")) or None
    return {
        "schema": REPORT_SCHEMA, "host": doc.get("host"), "outcome": outcome,
        "from": doc.get("from", {}).get("versions"), "to": doc.get("to", {}).get("versions"),
        "from_venv": doc.get("from", {}).get("venv"), "to_venv": doc.get("to", {}).get("venv"),
        # the model commit each side serves with (null: the inventory names no source)
        "from_model": ((doc.get("from") or {}).get("model") or {}).get("commit"),
        "to_model": ((doc.get("to") or {}).get("model") or {}).get("commit"),
        "steps": steps, "verify": verify,
        "probe": {"interval_s": probe.get("interval_s"),
                  "requests_started": probe.get("requests_started"), "requests": probe.get("requests"),
                  "failed": probe.get("failed"), "failures": probe.get("failures"), "codes": probe.get("codes"),
                  "longest_gap_s": probe.get("longest_gap_s"), "longest_request_s": probe.get("longest_request_s"),
                  "started_at": probe.get("started_at"), "outages": probe.get("outages", []),
                  "first_failures": probe.get("first_failures", [])}
        if probe else None,
        "failed_requests": probe.get("failed") if probe else None,
        "longest_outage_s": probe.get("longest_gap_s") if probe else None,
        "rollback_s": round(rollback_s, 3) if rollback_s else None,
    }
