"""`pdnode model lock INVENTORY`: pin the inventory's hf:// model to a commit (docs/model.md).

It asks the endpoint (huggingface_hub, the same client the hosts download with) what the
source's revision is now, writes the commit and its manifest (every file's path, size and
LFS sha256) to .model.lock.json beside the inventory, and copies the commit's small files
(config.json, the safetensors index, hf_quant_config.json, ...) into the controller's cache,
so that `pdnode check` reads the model's facts offline. The operator commits the lock:
every host and every later run then use that commit, whatever the branch does next.

A lock that already pins the source is kept (no endpoint needed) unless --update asks for
the revision's newest commit; the cache is filled where it lacks the commit's files.
Exit 0 written or current, 1 refused (one line: what, why, the fix), 2 could not run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..core.exits import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_OK
from ..core.inventory import model_source
from ..core.inventory.model_source import Lock, ManifestFile, SourceError
from ..core.inventory.read import InventoryError, inventory_dirs, inventory_variables
from ..core.resources import controller_dir


class Refused(Exception):
    """One line for the operator: what was asked, why it cannot be, the fix."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="pin the inventory's hf:// model to a commit (.model.lock.json beside it) and "
                                     "cache its config files for `pdnode check`")
    verbs = p.add_subparsers(dest="verb", required=True)
    lock = verbs.add_parser("lock", help="write or refresh .model.lock.json beside the inventory")
    lock.add_argument("inventory", help="inventory directory, e.g. inventories/gpu01")
    lock.add_argument("--update", action="store_true",
                      help="resolve the revision again (a branch's newest commit) even where the lock pins it")
    lock.set_defaults(func=cmd_lock)


def _settings(inventory: str) -> tuple[dict[str, Any], Path]:
    """The model settings every host of the inventory shares, and the inventory's directory."""
    try:
        hosts = inventory_variables(inventory)
        dirs = inventory_dirs(inventory)
    except InventoryError as exc:
        raise Refused(str(exc)) from None
    keys = ("pdnode_model_source", "pdnode_model_endpoint", "pdnode_model_token_file")
    seen = {tuple(v.get(k) for k in keys) for v in hosts.values()}
    places = {d for d in dirs.values() if d}
    if len(seen) != 1 or len(places) != 1:
        raise Refused(f"{inventory}: its hosts name different models or inventory directories; one lock pins one "
                      "model per inventory: give every host the same pdnode_model_source (group_vars/all)")
    values = dict(zip(keys, next(iter(seen)), strict=True))
    return values, Path(next(iter(places)))


def _token(path: str | None) -> str | bool:
    """The token file's text (never printed), or False: no token, and none of the
    machine's own huggingface_hub login either (the inventory says what is used)."""
    if not path:
        return False
    full = controller_dir() / path
    try:
        token = full.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise Refused(f"pdnode_model_token_file={path!r}: cannot be read ({exc.strerror or exc}); write the hub "
                      "token into it (mode 0600)") from None
    if not token:
        raise Refused(f"pdnode_model_token_file={path!r}: is empty; write the hub token into it (mode 0600)")
    return token


def _where(endpoint: str | None) -> str:
    return endpoint or "the default endpoint"


def resolve(source: model_source.Source, endpoint: str | None, token: str | bool) -> Lock:
    """Ask the endpoint for the revision's commit, then for that commit's files with
    their sizes and LFS sha256 (huggingface_hub: model_info, list_repo_tree)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    assert source.repo is not None and source.revision is not None
    api = HfApi(endpoint=endpoint, token=token)
    name = f"pdnode_model_source={source.text!r}"
    try:
        try:
            info = api.model_info(source.repo, revision=source.revision)
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            # An unknown revision reads as an unknown repository at some mirrors: ask for
            # the repository alone to say which of the two it is.
            if isinstance(exc, GatedRepoError) or not _exists(api, source.repo):
                raise
            raise Refused(f"{name}: {source.repo} has no revision {source.revision!r} at {_where(endpoint)}; write "
                          "a branch, tag or commit the repository has") from None
        files = [ManifestFile(e.path, int(e.size), e.lfs.sha256 if e.lfs is not None else None)
                 for e in api.list_repo_tree(source.repo, revision=info.sha, recursive=True)
                 if isinstance(e, RepoFile)]
    except GatedRepoError:
        raise Refused(f"{name}: {source.repo} is gated and {_where(endpoint)} refused "
                      f"{'the token' if token else 'access without a token'}; request access on the hub, then give "
                      "pdnode_model_token_file a token that has it") from None
    except RepositoryNotFoundError:
        hint = "the token cannot see it" if token else "give pdnode_model_token_file if it is gated or private"
        raise Refused(f"{name}: {_where(endpoint)} has no repository {source.repo} it shows this caller ({hint}); "
                      "check the name on the hub") from None
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 -- network errors of every kind: one line, the endpoint named
        raise Refused(f"pdnode_model_endpoint={endpoint!r}: {_where(endpoint)} cannot be asked about "
                      f"{source.repo} ({type(exc).__name__}); check the URL and that this machine reaches it") from None
    if not files:
        raise Refused(f"{name}: commit {info.sha} of {source.repo} has no files")
    return Lock(source.text, source.repo, source.revision, str(info.sha),
                tuple(sorted(files, key=lambda f: f.path)), gated=bool(info.gated))


def _exists(api: Any, repo: str) -> bool:
    try:
        api.list_repo_refs(repo)
    except Exception:  # noqa: BLE001 -- any answer but a model's: not known to exist
        return False
    return True


def fill_cache(lock: Lock, endpoint: str | None, token: str | bool, root: Path | None = None) -> Path:
    """Copy the commit's small files into the controller's cache (atomically: a directory
    appears whole or not at all); the cache directory."""
    from huggingface_hub import hf_hub_download

    target = model_source.cache_path(lock.repo, lock.commit, root)
    if (target / "config.json").is_file():
        return target
    wanted = [f.path for f in lock.files if f.path in model_source.SMALL_FILES]
    if "config.json" not in wanted:
        raise Refused(f"{lock.repo}@{lock.commit[:12]} has no config.json: not a model pdnode can plan")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fill-", dir=target.parent))
    try:
        for name in wanted:
            hf_hub_download(lock.repo, name, revision=lock.commit, endpoint=endpoint, token=token,
                            local_dir=staging)
        shutil.rmtree(staging / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping
        os.rename(staging, target)
    except OSError as exc:
        raise Refused(f"the cache {target} cannot be written ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 -- network errors of every kind, one line
        raise Refused(f"{_where(endpoint)}: the config files of {lock.repo}@{lock.commit[:12]} did not download "
                      f"({type(exc).__name__}); check that this machine reaches it") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def lock_inventory(inventory: str, update: bool = False) -> tuple[Lock, Path, str]:
    """Write or keep the inventory's lock; (lock, lock file, what happened)."""
    values, where = _settings(inventory)
    text = values["pdnode_model_source"]
    if not text:
        raise Refused(f"{inventory}: pdnode_model_source is not set; name the model, e.g. hf://Qwen/Qwen3-8B@main")
    try:
        source = model_source.parse(text)
        if values["pdnode_model_endpoint"]:
            model_source.check_endpoint(values["pdnode_model_endpoint"])
    except SourceError as exc:
        raise Refused(f"{inventory}: {text!r}: {exc.why}; {exc.fix}") from None
    if source.scheme != "hf":
        raise Refused(f"{inventory}: {text} is already on the hosts; only an hf:// source has a lock")
    path = model_source.lock_path(where)
    try:
        current = model_source.read_lock(path)
    except SourceError as exc:
        raise Refused(f"{exc.why}; {exc.fix}") from None
    endpoint = values["pdnode_model_endpoint"]
    token = _token(values["pdnode_model_token_file"])
    if current is not None and (current.repo, current.revision) == (source.repo, source.revision) and not update:
        fill_cache(current, endpoint, token)
        return current, path, f"current: {path} pins {current.repo}@{current.commit}"
    lock = resolve(source, endpoint, token)
    fill_cache(lock, endpoint, token)
    if current is not None and current.commit == lock.commit and current.files == lock.files:
        return current, path, f"current: {path} pins {lock.repo}@{lock.commit}"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(lock.text(), encoding="utf-8")
    os.replace(tmp, path)
    was = f" (was {current.commit})" if current is not None else ""
    return lock, path, (f"wrote {path}: {lock.repo}@{lock.revision} is commit {lock.commit}{was}, {len(lock.files)} "
                        f"files, {lock.total_bytes / 1e9:.2f} GB; commit the lock")


def cmd_lock(args: argparse.Namespace) -> int:
    try:
        _, _, said = lock_inventory(args.inventory, args.update)
    except Refused as exc:
        print(f"pdnode model lock: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_CANNOT_RUN
    print(said)
    return EXIT_OK
