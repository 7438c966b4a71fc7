"""The model's weights on this host: download, verify, switch (run by the model role).

    python -m pdnode.node.model_fetch [--check] [--deep] [--no-switch] [--alone] SPEC.json|-   # one JSON object
    python -m pdnode.node.model_fetch --current SPEC.json|-   # the commit this host serves, its lock
    python -m pdnode.node.model_fetch --serve ADDRESS PORT DIRECTORY   # the seed's share

SPEC (the plan's model view, on standard input for ``-``): ``scheme`` (hf or local), ``lock`` (the inventory's .model.lock.json: repo,
commit, every file's path, size and LFS sha256), ``path`` (pdnode_model_path), ``store``
(where commits live), ``endpoint``, ``token_file`` (a host file, present only while the
role runs this), ``deep`` (hash every file again), ``retries``, ``stall_timeout_s``,
``group`` (the service user's group), ``reserve_bytes`` (free space the download must leave; default 1 GiB), ``peer`` (a layout
spanning hosts: the URL of its first engine host's ``--serve``, copied from instead of the
endpoint, verified the same way). ``--check`` says what
a run would change and changes nothing (Ansible's check mode); ``--deep`` sets ``deep``.

A local:// model (``scheme`` local) is validated where it is and never written: the
directory, its config.json, and every shard its safetensors index names.

On the host:
    STORE/ORG--NAME/COMMIT/           one verified copy per commit (root:GROUP 0750/0640: the
                                      service user's group reads it, nothing else)
    STORE/ORG--NAME/COMMIT.stamp.json what was verified: each file's size and mtime
    STORE/ORG--NAME/.staging-COMMIT/  a download in progress (files done are kept: a rerun
                                      after an interruption fetches only the rest)
    STORE/ORG--NAME/state.json        {current, previous}: the commits a rollback needs
    PATH -> STORE/ORG--NAME/COMMIT    a symlink, replaced atomically (rename), so PATH never
                                      shows a half-written model

A rerun with nothing changed reads the stamp: stat() of each file, no hashing. ``deep``
hashes everything and repairs what differs (a flipped byte, a deleted shard). Old commits
go only when neither the current nor the previous commit is theirs.

Exit 0 (JSON: what changed), 1 refused (JSON with ``error``: one line naming the need and
the fix; nothing switched), 2 bad spec. Never prints the token.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

STAMP_FORMAT = "pdnode.model-stamp/1"
# Room kept free beyond the download, so the host's other writers (journal, logs) go on.
FREE_MARGIN_BYTES = 1 << 30
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class Refused(Exception):
    """One line: what this host lacks, and the fix."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _listing(root: Path) -> set[str]:
    """Every file below ROOT, relative, except huggingface_hub's bookkeeping (.cache/)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == "." and ".cache" in dirnames:
            dirnames.remove(".cache")
        for name in filenames:
            out.add(os.path.normpath(os.path.join(rel, name)))
    return out


def problems(root: Path, files: list[dict[str, Any]], deep: bool) -> dict[str, str]:
    """Manifest path (or extra file) -> what is wrong with it under ROOT; {} when all is
    as the lock says. Sizes always; the sha256 of LFS files only when ``deep``."""
    found: dict[str, str] = {}
    for f in files:
        p = root / f["path"]
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            found[f["path"]] = "missing"
            continue
        if size != f["size"]:
            found[f["path"]] = f"{size} bytes, the lock says {f['size']}"
        elif deep and f.get("sha256") and _sha256(p) != f["sha256"]:
            found[f["path"]] = "sha256 differs from the lock's"
    for extra in sorted(_listing(root) - {f["path"] for f in files}):
        found[extra] = "not in the lock"
    return found


def _stat_stamp(root: Path, files: list[dict[str, Any]]) -> dict[str, list[int]]:
    out = {}
    for f in files:
        st = (root / f["path"]).stat()
        out[f["path"]] = [st.st_size, st.st_mtime_ns]
    return out


def stamp_holds(root: Path, stamp: Path, commit: str, files: list[dict[str, Any]]) -> bool:
    """Does the stamp written when ROOT was verified still describe it (same files, same
    sizes and mtimes)? stat() only: the no-change path never reads a weight byte."""
    try:
        doc = json.loads(stamp.read_text())
        return (doc.get("format") == STAMP_FORMAT and doc.get("commit") == commit
                and doc.get("files") == _stat_stamp(root, files) and _listing(root) == {f["path"] for f in files})
    except (OSError, ValueError):
        return False


def _write_stamp(root: Path, stamp: Path, commit: str, files: list[dict[str, Any]], lock: dict[str, Any]) -> None:
    """What was verified (each file's size and mtime) and the lock it was verified against:
    an upgrade's way back reads which commit serves, and its lock, from here (``--current``)."""
    tmp = stamp.with_name(f".{stamp.name}.tmp")
    tmp.write_text(json.dumps({"format": STAMP_FORMAT, "commit": commit, "files": _stat_stamp(root, files),
                               "lock": lock}))
    os.replace(tmp, stamp)


def _modes(root: Path, gid: int) -> None:
    """Owned by root, readable by the service user's group, by no one else: 0750/0640.
    The engines only read them; nothing running as the service user can change them."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chown(dirpath, 0, gid)
        os.chmod(dirpath, 0o750)  # noqa: S103 -- group read and search: the engines must enter it
        for name in filenames:
            os.chown(os.path.join(dirpath, name), 0, gid)
            os.chmod(os.path.join(dirpath, name), 0o640)


class Fetcher:
    def __init__(self, spec: dict[str, Any]):
        lock = spec["lock"]
        self.lock: dict[str, Any] = lock
        self.repo: str = lock["repo"]
        self.commit: str = lock["commit"]
        if not _COMMIT_RE.match(self.commit):
            raise ValueError(f"lock commit {self.commit!r} is not 40 hex digits")
        self.files: list[dict[str, Any]] = list(lock["files"])
        self.path = Path(spec["path"])
        store = Path(spec.get("store") or self.path.parent / ".pdnode-models")
        self.home = store / self.repo.replace("/", "--")
        self.commit_dir = self.home / self.commit
        self.stamp = self.home / f"{self.commit}.stamp.json"
        self.staging = self.home / f".staging-{self.commit}"
        self.endpoint: str | None = spec.get("endpoint")
        self.token_file: str | None = spec.get("token_file")
        self.deep = bool(spec.get("deep"))
        self.retries = int(spec.get("retries", 3))
        self.reserve = int(spec.get("reserve_bytes", FREE_MARGIN_BYTES))
        self.peer: str | None = spec.get("peer")  # the layout's seed host, where a peer copies from
        self.stall_timeout_s = float(spec.get("stall_timeout_s", 60))
        self.group: str = spec.get("group") or "root"
        self.report: dict[str, Any] = {"commit": self.commit, "path": str(self.path), "changed": False,
                                       "downloaded": [], "downloaded_bytes": 0, "repaired": {}, "removed": [],
                                       "switched": False, "verified": "stamp"}

    # --- the client ---------------------------------------------------------------------
    def _token(self) -> str | bool:
        if not self.token_file:
            return False
        try:
            return Path(self.token_file).read_text().strip() or False
        except OSError as exc:
            raise Refused(f"the token file {self.token_file} cannot be read ({exc.strerror}); rerun the model "
                          "role (it copies the token for the download only)") from None

    def _download(self, names: list[str], into: Path) -> None:
        """Each file into INTO, from the endpoint (huggingface_hub, which keeps its own
        bookkeeping there) or, on a peer, from the layout's first engine host; each retried
        a bounded number of times, then Refused naming the file."""
        fetch, source = self._peer_fetch() if self.peer else self._hub_fetch()
        for name in names:
            for attempt in range(1, self.retries + 1):
                try:
                    fetch(name, into)
                    break
                except Refused:
                    raise
                except Exception as exc:  # noqa: BLE001 -- a stall, a reset, a 5xx: retried, then one line
                    if attempt == self.retries:
                        raise Refused(f"{name} of {self.repo}@{self.commit[:12]} did not arrive from {source} in "
                                      f"{self.retries} tries ({type(exc).__name__}); check that this host reaches "
                                      "it, then rerun (files already downloaded are kept)") from None
                    time.sleep(min(2 ** attempt, 10))
            self.report["downloaded"].append(name)
            self.report["downloaded_bytes"] += (into / name).stat().st_size
        if self.peer:
            self.report["from"] = self.peer

    def _hub_fetch(self) -> tuple[Any, str]:
        """One file from the endpoint; an access refusal is final (not retried)."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        token = self._token()
        where = self.endpoint or "the endpoint"

        def fetch(name: str, into: Path) -> None:
            try:
                hf_hub_download(self.repo, name, revision=self.commit, endpoint=self.endpoint, token=token,
                                local_dir=into)
            except (GatedRepoError, RepositoryNotFoundError):
                raise Refused(f"{where} refused {self.repo}@{self.commit[:12]} ({'with' if token else 'without'} "
                              "a token); give pdnode_model_token_file a token with access, or check "
                              "pdnode_model_endpoint") from None
        return fetch, where

    def _peer_fetch(self) -> tuple[Any, str]:
        """One file from the layout's first engine host (``--serve`` there), written whole
        under a temporary name and renamed: a cut transfer leaves no file that looks complete."""
        import urllib.parse
        import urllib.request

        assert self.peer is not None
        peer = self.peer

        def fetch(name: str, into: Path) -> None:
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(f".{target.name}.part")
            try:
                with urllib.request.urlopen(f"{peer}/{urllib.parse.quote(name)}",  # noqa: S310 -- the plan's seed
                                            timeout=self.stall_timeout_s) as resp, open(part, "wb") as out:
                    shutil.copyfileobj(resp, out, 8 << 20)
                os.replace(part, target)
            finally:
                _remove(part)
        return fetch, f"the layout's first engine host ({peer})"

    # --- the steps ----------------------------------------------------------------------
    def _preflight_disk(self, have: Path) -> None:
        need = sum(f["size"] for f in self.files if not _complete(have / f["path"], f["size"]))
        probe = self.home
        while not probe.exists():
            probe = probe.parent
        st = os.statvfs(probe)
        free = st.f_bavail * st.f_frsize
        if need + self.reserve > free:
            raise Refused(f"the download of {self.repo}@{self.commit[:12]} needs {need / 1e9:.2f} GB (+"
                          f"{self.reserve / 1e9:.1f} GB kept free) at {probe}, which has {free / 1e9:.2f} GB "
                          "free; free space there, or set pdnode_model_path on a larger disk")

    def _fetch_new(self) -> None:
        self._preflight_disk(self.staging)  # before anything is written
        self.home.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(exist_ok=True)
        wanted = [f["path"] for f in self.files if not _complete(self.staging / f["path"], f["size"])]
        self._download(wanted, self.staging)
        bad = problems(self.staging, self.files, deep=True)
        if bad:  # once more for what is wrong, then refuse
            for name in bad:
                _remove(self.staging / name)
            self._download([n for n in bad if n in {f["path"] for f in self.files}], self.staging)
            bad = problems(self.staging, self.files, deep=True)
            if bad:
                name, why = next(iter(bad.items()))
                raise Refused(f"{name} of {self.repo}@{self.commit[:12]} does not verify after a second download "
                              f"({why}); the endpoint serves other bytes than the lock names: check the mirror, "
                              "or run `pdnode model lock --update` if the commit was rewritten")
        shutil.rmtree(self.staging / ".cache", ignore_errors=True)
        _modes(self.staging, self.gid)
        os.rename(self.staging, self.commit_dir)
        _write_stamp(self.commit_dir, self.stamp, self.commit, self.files, self.lock)
        self.report.update(changed=True, verified="sha256")

    def _repair(self) -> None:
        """Hash every file; download again what differs, remove what the lock lacks."""
        bad = problems(self.commit_dir, self.files, deep=True)
        self.report["verified"] = "sha256"
        if not bad:
            _write_stamp(self.commit_dir, self.stamp, self.commit, self.files, self.lock)
            return
        names = {f["path"] for f in self.files}
        fix = self.home / f".repair-{self.commit}"
        fix.mkdir(exist_ok=True)
        self._download([n for n in bad if n in names], fix)
        for name, why in bad.items():
            _remove(self.commit_dir / name)
            if name in names:
                os.makedirs((self.commit_dir / name).parent, exist_ok=True)
                os.replace(fix / name, self.commit_dir / name)
            self.report["repaired"][name] = why
        shutil.rmtree(fix, ignore_errors=True)
        bad = problems(self.commit_dir, self.files, deep=True)
        if bad:
            name, why = next(iter(bad.items()))
            raise Refused(f"{name} of {self.repo}@{self.commit[:12]} does not verify after repair ({why}); check "
                          "the mirror")
        _modes(self.commit_dir, self.gid)
        _write_stamp(self.commit_dir, self.stamp, self.commit, self.files, self.lock)
        self.report["changed"] = True

    def _switch(self) -> None:
        target = str(self.commit_dir)
        if self.path.is_symlink():
            if os.readlink(self.path) == target:
                return
        elif self.path.exists():
            raise Refused(f"pdnode_model_path {self.path} is a directory or file pdnode did not make; move it "
                          "away (or point local:// at it to serve it as it is), then rerun")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.pdnode-new")
        _remove(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, self.path)
        self.report.update(changed=True, switched=True)

    def _record(self) -> None:
        state_file = self.home / "state.json"
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            state = {}
        if state.get("current") != self.commit:
            state = {"current": self.commit, "previous": state.get("current")}
            tmp = state_file.with_name(".state.json.tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, state_file)
        keep = {state.get("current"), state.get("previous")}
        for entry in sorted(self.home.iterdir()):
            commit = entry.name.removesuffix(".stamp.json").removeprefix(".staging-").removeprefix(".repair-")
            if _COMMIT_RE.match(commit) and commit not in keep:
                _remove(entry)
                if entry.is_dir() or not entry.name.endswith(".stamp.json"):
                    self.report["removed"].append(entry.name)
        self.report["previous"] = state.get("previous")

    def check(self) -> dict[str, Any]:
        """What run() would change, changing nothing (no download, no hashing)."""
        have = self.commit_dir.is_dir()
        holds = have and stamp_holds(self.commit_dir, self.stamp, self.commit, self.files)
        linked = self.path.is_symlink() and os.readlink(self.path) == str(self.commit_dir)
        if self.path.exists() and not self.path.is_symlink():
            raise Refused(f"pdnode_model_path {self.path} is a directory or file pdnode did not make; move it "
                          "away (or point local:// at it to serve it as it is), then rerun")
        try:
            grp.getgrnam(self.group)
            group_missing = False
        except KeyError:
            group_missing = True
        self.report.update(changed=not (holds and linked) or self.deep or group_missing, switched=not linked,
                           verified="not run (check mode)",
                           downloaded=[] if have else [f["path"] for f in self.files],
                           downloaded_bytes=0 if have else sum(f["size"] for f in self.files))
        return self.report

    def _ensure_group(self) -> None:
        """The service user's group reads the files; on a new host it comes before the
        pd_services role makes the user in it (groupadd --system, as that role would)."""
        try:
            self.gid = grp.getgrnam(self.group).gr_gid
            return
        except KeyError:
            pass
        import subprocess

        r = subprocess.run(["groupadd", "--system", self.group], capture_output=True, text=True, check=False)
        if r.returncode not in (0, 9):  # 9: it exists (made meanwhile)
            raise Refused(f"the group {self.group} (the service user's) could not be made: "
                          f"{(r.stderr or r.stdout).strip()[:200]}; make it, then rerun")
        self.gid = grp.getgrnam(self.group).gr_gid
        self.report["changed"] = True

    def run(self, switch: bool = True) -> dict[str, Any]:
        """Download and verify (or repair); then, unless ``switch`` is false (an upgrade's
        build: the commit beside the serving one), switch the path to it."""
        self._ensure_group()
        if self.commit_dir.is_dir():
            if self.deep:
                self._repair()
            elif not stamp_holds(self.commit_dir, self.stamp, self.commit, self.files):
                self._repair()  # a changed stat: hash to find what, fetch only that
        else:
            self._fetch_new()
        if switch:
            self._switch()
            self._record()
        return self.report


def current(spec: dict[str, Any]) -> dict[str, Any]:
    """The commit this host serves for the spec's repository, with the lock it was verified
    against: {commit, lock}, or {commit: None} when none (state.json and the stamp)."""
    store = Path(spec.get("store") or Path(spec["path"]).parent / ".pdnode-models")
    home = store / spec["lock"]["repo"].replace("/", "--")
    try:
        commit = json.loads((home / "state.json").read_text())["current"]
        stamp = json.loads((home / f"{commit}.stamp.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return {"commit": None, "lock": None}
    lock = stamp.get("lock") if isinstance(stamp, dict) else None
    return {"commit": commit if isinstance(lock, dict) else None, "lock": lock if isinstance(lock, dict) else None}


def _complete(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def serve(address: str, port: int, root: Path) -> None:
    """Serve the verified commit directory ROOT to the layout's other engine hosts (GET
    and HEAD of the files directly in it or below; nothing else), until stopped. Run by
    the model role on the seed host as a transient unit; the firewall admits the peers only."""
    import http.server
    import socketserver
    import urllib.parse

    base = root.resolve()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _file(self) -> Path | None:
            rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
            target = (base / rel).resolve()
            if not rel or base not in target.parents or not target.is_file() or (base / rel).is_symlink():
                self.send_error(404)
                return None
            return target

        def do_HEAD(self) -> None:  # noqa: N802 -- http.server's name
            target = self._file()
            if target is not None:
                self.send_response(200)
                self.send_header("Content-Length", str(target.stat().st_size))
                self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            target = self._file()
            if target is None:
                return
            with open(target, "rb") as fh:
                self.send_response(200)
                self.send_header("Content-Length", str(os.fstat(fh.fileno()).st_size))
                self.end_headers()
                shutil.copyfileobj(fh, self.wfile, 8 << 20)

        def log_message(self, fmt: str, *args: Any) -> None:  # one journal line per request
            sys.stderr.write(f"{self.address_string()} {fmt % args}\n")

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    with Server((address, port), Handler) as httpd:
        httpd.serve_forever()


def check_local(path: Path) -> dict[str, Any]:
    """A local:// model where it is: a directory with a config.json object and every
    shard its safetensors index names; Refused naming what is missing."""
    report: dict[str, Any] = {"path": str(path), "changed": False, "verified": "in place"}
    if not path.is_dir():
        raise Refused(f"pdnode_model_path {path} is not a directory on this host; copy the model there, or use an "
                      "hf:// source to have it downloaded")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise Refused(f"{path}/config.json cannot be read as JSON ({type(exc).__name__}); copy the whole model, "
                      "config.json included") from None
    if not isinstance(config, dict):
        raise Refused(f"{path}/config.json is not a JSON object; copy the model's own config.json")
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise Refused(f"{index} has no weight_map; copy the model's own index") from None
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise Refused(f"{path} lacks {len(missing)} of the {len(shards)} shards its index names (first: "
                          f"{missing[0]}); copy them, or use an hf:// source")
        report["shards"] = len(shards)
    elif not any(path.glob("*.safetensors")):
        raise Refused(f"{path} has no *.safetensors; copy the model's weights there")
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        if len(argv) != 4 or not argv[2].isdigit():
            print("usage: python -m pdnode.node.model_fetch --serve ADDRESS PORT DIRECTORY", file=sys.stderr)
            return 2
        serve(argv[1], int(argv[2]), Path(argv[3]))
        return 0
    flags = {a for a in argv if a in ("--check", "--deep", "--no-switch", "--current", "--alone")}
    rest = [a for a in argv if a not in flags]
    if len(rest) != 1:
        print("usage: python -m pdnode.node.model_fetch [--check] [--deep] [--no-switch] [--alone] [--current] "
              "SPEC.json|-", file=sys.stderr)
        return 2
    try:
        spec = json.loads(sys.stdin.read() if rest[0] == "-" else Path(rest[0]).read_text())
        if "--deep" in flags:
            spec["deep"] = True
        if "--alone" in flags:  # from the endpoint, not from the layout's first engine host
            spec.pop("peer", None)
        if "--current" in flags:
            print(json.dumps(current(spec)))
            return 0
        if spec.get("scheme") == "local":
            try:
                print(json.dumps(check_local(Path(spec["path"]))))
                return 0
            except Refused as exc:
                print(json.dumps({"error": str(exc), "path": spec["path"], "changed": False}))
                return 1
        fetcher = Fetcher(spec)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(json.dumps({"error": f"the spec {rest[0]} is not usable ({type(exc).__name__}: {exc})",
                          "changed": False}))
        return 2
    if "--check" in flags:
        try:
            print(json.dumps(fetcher.check()))
            return 0
        except Refused as exc:
            print(json.dumps({"error": str(exc), **fetcher.report}))
            return 1
    # Stall timeout of each read (huggingface_hub reads it at import).
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(spec.get("stall_timeout_s", 60))))
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        report = fetcher.run(switch="--no-switch" not in flags)
    except Refused as exc:
        print(json.dumps({"error": str(exc), **fetcher.report}))
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
