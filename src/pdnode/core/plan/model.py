"""The plan's model section: the source, its lock and the facts its files state.

``resolve`` reads ``pdnode_model_source`` (pdnode.core.inventory.model_source), the lock
file beside the inventory and the controller's cache, and returns the plan's ``model``
record and the model's facts (pdnode.core.plan.model_facts), refusing what cannot be
deployed: an unreadable source, a lock that pins another source, a typed fact the files
contradict. Offline: nothing here reaches an endpoint (`pdnode model lock` does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..inventory import model_source
from ..inventory.model_source import SourceError
from . import model_facts
from .model_facts import ModelFacts

Report = Callable[[str, str, Any, str, str], None]
LOCK_FIX = "run `pdnode model lock INVENTORY` (it resolves the revision and writes {lock}), then commit the lock"


def resolve(error: Report, warn: Report, v: dict[str, Any], inventory_dir: str | None,
            repo_root: Path, lock_override: dict[str, Any] | None = None) -> tuple[dict[str, Any] | None,
                                                                                  ModelFacts | None]:
    """(the plan's model record, the model's facts) for the typed values ``v``; (None, None)
    without a source. Problems go to ``error``/``warn`` (rule id, field, value, why, fix).
    ``lock_override``: the lock of the commit an upgrade goes back to (the host's record),
    used instead of the inventory's file and not held to the source's revision."""
    text = v.get("pdnode_model_source")
    if not isinstance(text, str):
        return None, None
    try:
        source = model_source.parse(text)
    except SourceError as exc:
        error("model-source-form", "pdnode_model_source", text, exc.why, exc.fix)
        return None, None
    endpoint = v.get("pdnode_model_endpoint")
    if isinstance(endpoint, str):
        try:
            model_source.check_endpoint(endpoint)
        except SourceError as exc:
            error("model-endpoint-form", "pdnode_model_endpoint", endpoint, exc.why, exc.fix)
    token = v.get("pdnode_model_token_file")
    if isinstance(token, str) and not _readable_file(repo_root / token):
        error("model-token-file", "pdnode_model_token_file", token,
              f"is not a readable file on the controller ({repo_root / token})",
              "write the hub token into that file (mode 0600) or remove pdnode_model_token_file")
    reserve = v.get("pdnode_model_reserve_gb")
    if isinstance(reserve, float) and reserve < 0:
        error("model-reserve-range", "pdnode_model_reserve_gb", reserve, "must be 0 or more GB",
              "give the free space a download must leave, e.g. 1.0")
    record: dict[str, Any] = {"source": text, "scheme": source.scheme, "path": v.get("pdnode_model_path"),
                              "endpoint": endpoint, "token_file": token}
    if source.scheme == "local":
        if source.path != v.get("pdnode_model_path"):
            error("model-source-local-path", "pdnode_model_source", text,
                  f"names {source.path}, but pdnode_model_path is {v.get('pdnode_model_path')!r}: the engines "
                  "would read another directory than the one validated",
                  f"write local://{v.get('pdnode_model_path')} or set pdnode_model_path to {source.path}")
        return record, None
    where = Path(inventory_dir) if inventory_dir else None
    lock_file = model_source.lock_path(where) if where is not None else None
    record.update(repo=source.repo, revision=source.revision, lock_file=str(lock_file) if lock_file else None)
    if lock_override is not None:
        try:
            lock = model_source.lock_from_dict(lock_override, "the serving commit's recorded lock")
        except SourceError as exc:
            error("model-lock-readable", "pdnode_model_source", text, exc.why, exc.fix)
            return record, None
        return _locked(error, warn, record, lock, v, f"{lock.repo}@{lock.commit[:12]}")
    if lock_file is None:
        error("model-lock-missing", "pdnode_model_source", text,
              "needs the inventory's directory to find its lock file, and this caller gave none",
              "run pdnode or ansible-playbook with -i INVENTORY")
        return record, None
    try:
        lock = model_source.read_lock(lock_file)
    except SourceError as exc:
        error("model-lock-readable", "pdnode_model_source", text, exc.why, exc.fix)
        return record, None
    if lock is None:
        error("model-lock-missing", "pdnode_model_source", text,
              f"is not pinned to a commit yet: {lock_file} does not exist", LOCK_FIX.format(lock=lock_file))
        return record, None
    if (lock.repo, lock.revision) != (source.repo, source.revision):
        error("model-lock-stale", "pdnode_model_source", text,
              f"differs from what {lock_file} pins ({lock.source} at commit {lock.commit[:12]})",
              LOCK_FIX.format(lock=lock_file))
        return record, None
    return _locked(error, warn, record, lock, v, f"{source.repo}@{lock.commit[:12]}")


def _locked(error: Report, warn: Report, record: dict[str, Any], lock: model_source.Lock, v: dict[str, Any],
            where: str) -> tuple[dict[str, Any], ModelFacts | None]:
    """The record of a pinned commit, and the facts its cached files state."""
    text = record["source"]
    record.update(commit=lock.commit, files=len(lock.files), total_bytes=lock.total_bytes, gated=lock.gated,
                  lock=lock.as_dict())
    cache = model_source.cache_path(lock.repo, lock.commit)
    try:
        facts = model_facts.read(cache, lock)
    except ValueError:
        warn("model-cache-missing", "pdnode_model_source", text,
             f"commit {lock.commit[:12]}'s config files are not in the controller's cache ({cache}), so the plan "
             "uses the typed model facts and checks none against the files",
             "run `pdnode model lock INVENTORY` (it fetches them; nothing else needs the endpoint)")
        return record, None
    record["facts"] = facts.as_dict()
    record["cache"] = str(cache)
    typed = {k: v.get(k) for k in ("pdnode_model_kind", "pdnode_model_weights_gb", "pdnode_model_kv_bytes_per_token")}
    for field_, value, why, fix in model_facts.contradictions(facts, typed, where):
        error("model-fact-contradicts-files", field_, value, why, fix)
    return record, facts


def shares(model: dict[str, Any] | None, layout: Any) -> bool:
    """Does this layout share one download among its hosts (an hf:// source, several hosts)?"""
    return bool(model and model.get("scheme") == "hf" and layout is not None and layout.multi_host)


def with_share(model: dict[str, Any], cluster: dict[str, Any], host: str, port: int | None) -> dict[str, Any]:
    """The model record with ``share`` where the layout spans hosts: the first engine host
    (by name) downloads from the endpoint and serves the verified commit on its address
    and ``port`` to the other engine hosts (a host with the router alone needs no model)."""
    if not model or model.get("scheme") != "hf" or port is None or not cluster.get("multi_host"):
        return model
    engine_hosts = sorted(h for h, entry in cluster["hosts"].items()
                          if any(s != "router" for s in entry.get("services", [])))
    if len(engine_hosts) < 2:
        return model
    seed = engine_hosts[0]
    return {**model, "share": {"seed": seed, "address": cluster["hosts"][seed]["address"], "port": port,
                               "peers": engine_hosts[1:], "engine_host": host in engine_hosts}}


def _readable_file(path: Path) -> bool:
    return path.is_file() and os.access(path, os.R_OK)
