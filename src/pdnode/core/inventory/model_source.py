"""Where the model comes from: ``pdnode_model_source``, its lock file and the controller's cache.

A source is one of
- ``hf://ORG/NAME[@REVISION]``: a repository of an HF-compatible endpoint (the hub, or the
  site mirror ``pdnode_model_endpoint`` names). A branch or tag is resolved once to a commit
  and pinned in the lock file beside the inventory (``.model.lock.json``), which the operator
  commits: every host and every later run use that commit, whatever the branch does next.
- ``local://PATH``: the weights are already on every host at PATH (``pdnode_model_path``):
  validated in place, never written.

The lock holds the commit and its manifest (every file's path, size and, for the files the
hub stores in LFS, sha256): what the hosts download and verify against, and what the disk
preflight counts, without asking the endpoint again. The controller's cache keeps the
commit's small files (config.json, the safetensors index, hf_quant_config.json, ...) so the
plan reads the model's own facts offline (pdnode.core.plan.model_facts).

Pure: parsing and reading. The resolution itself (huggingface_hub) is `pdnode model lock`
(pdnode.commands.model) and the model role's first task on the controller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..resources import user_cache_dir

# A dot-file, as Terraform's .terraform.lock.hcl: Ansible reads every other file of an
# inventory directory as an inventory source (and warns about this one), but never a
# name that starts with a dot.
LOCK_NAME = ".model.lock.json"
LOCK_FORMAT = "pdnode.model-lock/1"
# The small files of a commit the plan reads (when the commit has them): what the cache holds.
SMALL_FILES = ("config.json", "hf_quant_config.json", "quant_config.json", "model.safetensors.index.json",
               "generation_config.json")
DEFAULT_REVISION = "main"

# The hub's repository names: letters, digits, '-', '_', '.'; not starting or ending with
# '-' or '.', no '--' or '..' (huggingface_hub.utils.validate_repo_id), at most 96 each.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_RE = re.compile(rf"^(?:{_NAME}/)?{_NAME}$")
# A branch, a tag or a commit: what git accepts in a ref name, minus what a URL or a
# unit would read otherwise (no spaces, no '..', no '@{{', ...).
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]{0,199}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_ENDPOINT_RE = re.compile(r"^https?://[A-Za-z0-9._-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/-]*)?$|"
                          r"^https?://\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/-]*)?$")


class SourceError(ValueError):
    """A source, endpoint or lock that cannot be used: ``why`` and ``fix`` for one line."""

    def __init__(self, why: str, fix: str):
        super().__init__(f"{why}; {fix}")
        self.why = why
        self.fix = fix


@dataclass(frozen=True)
class Source:
    scheme: str  # hf | local
    text: str  # as the inventory writes it
    repo: str | None = None  # hf: ORG/NAME
    revision: str | None = None  # hf: as written (a branch, a tag or a commit)
    path: str | None = None  # local: the directory on every host


def parse(text: str) -> Source:
    """``hf://ORG/NAME[@REVISION]`` or ``local://PATH`` -> Source; SourceError otherwise."""
    if text.startswith("hf://"):
        rest = text[len("hf://"):]
        repo, _, revision = rest.partition("@")
        if not _REPO_RE.match(repo) or "--" in repo or ".." in repo:
            raise SourceError(f"{repo!r} is not a repository name of the hub (ORG/NAME: letters, digits, - _ .)",
                              "write it as the hub's page shows it, e.g. hf://Qwen/Qwen3-8B@main")
        if "@" in text and not revision:
            raise SourceError("'@' names no revision", "write a branch, a tag or a commit after '@', e.g. @main")
        revision = revision or DEFAULT_REVISION
        if not _REVISION_RE.match(revision) or ".." in revision:
            raise SourceError(f"{revision!r} is not a branch, tag or commit name",
                              "write e.g. @main, @v1.0 or a 40-hex commit")
        return Source("hf", text, repo=repo, revision=revision)
    if text.startswith("local://"):
        path = text[len("local://"):]
        if not path.startswith("/"):
            raise SourceError(f"{path!r} is not an absolute path on the hosts",
                              "write local:// followed by the directory, e.g. local:///models/Qwen3-8B")
        return Source("local", text, path=path.rstrip("/") or "/")
    raise SourceError("names no scheme pdnode reads (hf:// or local://)",
                      "write hf://ORG/NAME@REVISION (downloaded) or local:///PATH (already on the hosts)")


def check_endpoint(text: str) -> None:
    """An HF-compatible endpoint: http(s)://HOST[:PORT][/PATH], nothing else (no user, no query)."""
    if not _ENDPOINT_RE.match(text):
        raise SourceError("is not an http(s) URL of a host, an optional port and path (no user, query or fragment)",
                          "write the mirror's base URL, e.g. https://hf-mirror.example.internal")


def cache_root() -> Path:
    """The controller's model cache, models/ in pdnode's user cache (content-addressed by
    commit, so checkouts may share it)."""
    return user_cache_dir() / "models"


def cache_path(repo: str, commit: str, root: Path | None = None) -> Path:
    """Where the cache keeps a commit's small files."""
    return (root or cache_root()) / repo.replace("/", "--") / commit


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str | None  # the LFS files' (the hub's metadata); the others are checked by size

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Lock:
    source: str  # the pdnode_model_source it resolved
    repo: str
    revision: str
    commit: str
    files: tuple[ManifestFile, ...]
    gated: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        return sum(f.size for f in self.files if f.path.endswith(".safetensors"))

    def as_dict(self) -> dict[str, Any]:
        return {"format": LOCK_FORMAT, "source": self.source, "repo": self.repo, "revision": self.revision,
                "commit": self.commit, "gated": self.gated, "files": [f.as_dict() for f in self.files]}

    def text(self) -> str:
        """The lock file's text: one file per line, so a commit's diff reads file by file."""
        head = json.dumps({k: v for k, v in self.as_dict().items() if k != "files"}, indent=2)
        body = ",\n    ".join(json.dumps(f.as_dict()) for f in self.files)
        return head[:-2] + ',\n  "files": [\n    ' + body + "\n  ]\n}\n"


_SAFE_PATH_RE = re.compile(r"^[A-Za-z0-9_.+=@-][A-Za-z0-9_.+=@/ -]{0,499}$")


def _manifest_path_ok(path: str) -> bool:
    parts = path.split("/")
    return bool(_SAFE_PATH_RE.match(path)) and all(p not in ("", ".", "..") for p in parts)


def lock_from_dict(doc: Any, where: str) -> Lock:
    """A lock file's JSON -> Lock; SourceError naming the file and what is wrong."""
    fix = "remove it and run `pdnode model lock INVENTORY` to write it again"
    if not isinstance(doc, dict) or doc.get("format") != LOCK_FORMAT:
        raise SourceError(f"{where} is not a pdnode model lock ({LOCK_FORMAT})", fix)
    for key in ("source", "repo", "revision", "commit"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise SourceError(f"{where} has no {key}", fix)
    if not COMMIT_RE.match(doc["commit"]):
        raise SourceError(f"{where}: commit {doc['commit']!r} is not 40 lowercase hex digits", fix)
    files = doc.get("files")
    if not isinstance(files, list) or not files:
        raise SourceError(f"{where} lists no files", fix)
    out: list[ManifestFile] = []
    seen: set[str] = set()
    for i, f in enumerate(files):
        ok = (isinstance(f, dict) and isinstance(f.get("path"), str) and _manifest_path_ok(f["path"])
              and isinstance(f.get("size"), int) and not isinstance(f.get("size"), bool) and f["size"] >= 0
              and (f.get("sha256") is None or (isinstance(f["sha256"], str)
                                               and re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) is not None)))
        if not ok or f["path"] in seen:
            raise SourceError(f"{where}: files[{i}] is not a unique {{path, size, sha256}} entry "
                              "(a relative path without '..', a size in bytes, 64 hex digits or null)", fix)
        seen.add(f["path"])
        out.append(ManifestFile(f["path"], f["size"], f.get("sha256")))
    return Lock(doc["source"], doc["repo"], doc["revision"], doc["commit"], tuple(out), bool(doc.get("gated")))


def read_lock(path: Path) -> Lock | None:
    """The lock file at PATH; None when there is none; SourceError when it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"{path} cannot be read ({exc.strerror or exc})",
                          "make it readable by the user who runs pdnode and ansible-playbook") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SourceError(f"{path} is not JSON ({exc})",
                          "remove it and run `pdnode model lock INVENTORY` to write it again") from None
    return lock_from_dict(doc, str(path))


def lock_path(inventory_dir: str | Path) -> Path:
    return Path(inventory_dir) / LOCK_NAME
