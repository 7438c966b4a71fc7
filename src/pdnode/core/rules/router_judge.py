"""The router package decides whether it starts with the plan's arguments: `pdnode check`
asks it (called by pdnode.core.plan.build.build_plan on the router's host).

The judge is pdnode.node.router_launch.judge, in this process: the launcher's own check of
the router JSON, then the installed package's parser on the argv the launcher builds
(keys as placeholders) and the package's steps before ``start()``. It is asked only when
the controller has the release the plan installs (.venv has both pinned packages);
otherwise a warning says the router was not asked. A refusal becomes one line per
refused `pdnode_router_extra_args` entry: each entry the whole set refuses is asked
alone on top of the plan's own arguments.

Importing sglang-router 0.3.2 takes ~0.3 s, so each verdict is kept under
~/.cache/pdnode/router-verdicts/ (``$XDG_CACHE_HOME`` is honoured), keyed by the
sha256 of what was asked: package, release, router arguments, which keys are added.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...node.router_launch import PACKAGES, judge
from .guards import shown

# (rule id, field, value, rule, fix): the plan checker's error() and warn()
Report = Callable[[str, str, Any, str, str], None]
JUDGE_VERSION = 1  # bump when what is asked, or how a verdict is read, changes
CACHE_MAX = 1000  # verdicts kept (16 bytes each, mostly)


def installed_version(dist: str) -> str | None:
    """DIST's release on this Python's path (its .dist-info), without importing
    importlib.metadata (~60 ms, most of a `pdnode check`)."""
    pattern = re.compile(re.escape(dist.replace("-", "_")) + r"-([^-]+)\.dist-info$", re.IGNORECASE)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            m = pattern.match(name)
            if m:
                return m.group(1)
    return None


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdnode" / "router-verdicts"


def _load(digest: str) -> list[list[str]] | None:
    try:
        data = json.loads((cache_dir() / f"{digest}.json").read_text())
    except (OSError, ValueError):
        return None
    problems = data.get("problems") if isinstance(data, dict) else None
    ok = isinstance(problems, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in problems)
    return problems if ok else None


def _store(digest: str, problems: list[list[str]]) -> None:
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".verdict-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump({"problems": problems}, fh)
        os.replace(tmp, d / f"{digest}.json")
        names = os.listdir(d)
        if len(names) > CACHE_MAX:  # keep the newest half
            paths = sorted((d / n for n in names), key=lambda p: p.stat().st_mtime)
            for old in paths[: len(paths) - CACHE_MAX // 2]:
                old.unlink(missing_ok=True)
    except OSError:
        pass  # no cache: the next check asks again


OWN, TOGETHER = "", "*"  # verdict keys: the plan's own arguments; several extras only together


def verdict(router: dict[str, Any], package: str, extras: list[str], api_key: bool) -> list[list[str]]:
    """[[key, reason], ...], empty when the router would start. The key is the extra
    refused alone, OWN when the plan's own arguments (no extra) are refused, TOGETHER
    when the extras are refused only together."""
    def ask(args: dict[str, Any]) -> list[str]:
        return judge(args, package, api_key=api_key)

    whole = ask(router)
    if not whole:
        return []
    base = {k: v for k, v in router.items() if k not in extras}
    own = ask(base) if extras else whole
    if own:
        return [[OWN, own[0]]]
    alone = [[k, r[0]] for k in extras for r in [ask({**base, k: router[k]})] if r]
    return alone or [[TOGETHER, whole[0]]]


def check(error: Report, warn: Report, router: dict[str, Any], package: str, version: str, extras: list[str],
          api_key: bool) -> None:
    """Ask PACKAGE (the plan installs VERSION) about ROUTER (the router JSON the plan writes;
    EXTRAS: the keys that come from pdnode_router_extra_args)."""
    installed = installed_version(package) if package in PACKAGES else None
    if installed != version:
        if extras:
            have = f"{package} {installed}" if installed else f"no {package}"
            warn("router-judge-unavailable", "pdnode_router_package", package,
                 f"the router's own validation was not asked about pdnode_router_extra_args: the controller has "
                 f"{have} ({sys.prefix}), the plan installs {version}",
                 f"install {package}=={version} beside pdnode (scripts/setup pins it) to have check ask it")
        return
    asked = json.dumps({"judge": JUDGE_VERSION, "package": package, "version": version, "router": router,
                        "extras": sorted(extras), "api_key": api_key}, sort_keys=True, default=str)
    digest = hashlib.sha256(asked.encode()).hexdigest()
    problems = _load(digest)
    if problems is None:
        try:
            problems = verdict(router, package, extras, api_key)
        except Exception as exc:  # a broken install: say so, never a traceback
            warn("router-judge-unavailable", "pdnode_router_package", package,
                 f"the router's own validation could not be asked: {type(exc).__name__}: {exc}".splitlines()[0],
                 f"reinstall {package}=={version} beside pdnode (scripts/setup)")
            return
        _store(digest, problems)
    how = "(`python -m pdnode.node.router_launch ROUTER.json --dry-run` asks it the same way)"
    for key, reason in problems:
        reason = shown(reason)
        if key == TOGETHER:
            error("router-arg-refused", "pdnode_router_extra_args", shown({k: router[k] for k in extras}),
                  f"{package} {version} refuses these together: {reason}",
                  f"remove or change them until {package} accepts them {how}")
        elif key == OWN:
            error("router-arg-refused", "pdnode_router_package", package,
                  f"{package} {version} refuses the plan's own router arguments: {reason}",
                  f"use the {package} release this bundle pins {how}")
        else:
            error("router-arg-refused", f"pdnode_router_extra_args.{key}", shown(router.get(key)),
                  f"{package} {version} refuses it: {reason}",
                  f"remove it from pdnode_router_extra_args, or give it a value {package} accepts {how}")
