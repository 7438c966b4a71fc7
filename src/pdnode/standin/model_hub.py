"""A real HF-compatible server on the loopback, serving model repositories made here.

The tests and the demo download models the way a site does: huggingface_hub against an
endpoint. Nothing here reaches a hub, so the endpoint is olah (a maintained HF mirror
server) in its offline mode, serving local git repositories from its mirrors path: a
repository is a git work tree at ``MIRRORS/models/ORG/NAME`` whose ``*.safetensors`` are
committed as LFS pointers with their objects in ``.git/lfs/objects`` (the layout git-lfs
writes). olah then answers model_info, list_repo_tree (sizes and LFS sha256), HEAD and GET
of /resolve/, as the hub does. What it does not do, and what that means for the tests:
it ignores Range (a resumed file starts again from byte 0), and offline it checks no token:
a repository under the organisation ``DENIED_ORG`` is refused to every caller (401, as the
hub answers a private or gated repository the caller may not see), token or not.

    python -m pdnode.standin.model_hub serve DIR [--host ADDRESS] [--port N] [--demo]
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
DENIED_ORG = "gated"
# Fixed names and dates: the same files committed on the same parent give the same commit
# everywhere, so a lock written once (the demo's) stays true for every machine that makes it.
_GIT_ENV = {"GIT_AUTHOR_NAME": "pdnode", "GIT_AUTHOR_EMAIL": "pdnode@localhost", "GIT_COMMITTER_NAME": "pdnode",
            "GIT_COMMITTER_EMAIL": "pdnode@localhost", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
            "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1"}
_ACCESS = re.compile(r'"(GET|HEAD) /(?:api/models/)?(?P<repo>[^/ ]+/[^/ ]+)/resolve/(?P<rev>[^/ ]+)/(?P<file>[^ ?"]+)'
                     r'[^"]*" (?P<status>\d{3})')


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _pointer(blob_sha: str, size: int) -> str:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{blob_sha}\nsize {size}\n"


def commit_files(mirrors: Path, repo_id: str, files: dict[str, bytes | Path], message: str = "update",
                 remove: tuple[str, ...] = ()) -> str:
    """Write FILES (name -> bytes, or a file to copy) into the repository REPO_ID under
    MIRRORS (created on first use, branch main), remove REMOVE, commit; the new commit."""
    repo = mirrors / "models" / repo_id
    if not (repo / ".git").is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
        (repo / ".gitattributes").write_text("".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n"
                                                     for s in LFS_SUFFIXES))
    for name in remove:
        _git(repo, "rm", "-q", "--", name)
    for name, content in files.items():
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(LFS_SUFFIXES):
            # The object where git-lfs keeps it, the pointer in the tree.
            digest, size = hashlib.sha256(), 0
            obj_tmp = repo / ".git" / "lfs" / "tmp-object"
            obj_tmp.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, obj_tmp)
            else:
                obj_tmp.write_bytes(content)
            with open(obj_tmp, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
            oid = digest.hexdigest()
            obj = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
            obj.parent.mkdir(parents=True, exist_ok=True)
            os.replace(obj_tmp, obj)
            target.write_text(_pointer(oid, size))
        elif isinstance(content, Path):
            shutil.copyfile(content, target)
        else:
            target.write_bytes(content)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


DEMO_REPO = "pdnode/demo-moe"


def safetensors_file(tensors: dict[str, int], seed: int) -> bytes:
    """A valid safetensors file of F32 vectors (name -> length) with seeded values."""
    rng = random.Random(seed)  # noqa: S311 -- reproducible test bytes, not a secret
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, n in tensors.items():
        blob = rng.randbytes(4 * n)
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def demo_repository(mirrors: Path, demo_files: Path) -> str:
    """The demo model as a hub repository (its config and tokenizer, one small shard):
    made once; the same commit on every machine (fixed names and dates). Its commit."""
    repo = mirrors / "models" / DEMO_REPO
    if (repo / ".git").is_dir():
        return _git(repo, "rev-parse", "HEAD")
    files: dict[str, bytes | Path] = {n: demo_files / n for n in ("config.json", "tokenizer.json",
                                                                   "tokenizer_config.json")}
    files["model.safetensors"] = safetensors_file({"model.embed_tokens.weight": 1024 * 256}, seed=1)
    return commit_files(mirrors, DEMO_REPO, files, "the demo model")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Hub:
    """olah offline, serving ``root/mirrors`` on ``host`` (loopback unless a container must
    reach it: then its network's gateway, never every address); its access log counts requests."""

    def __init__(self, root: Path, port: int | None = None, host: str = "127.0.0.1"):
        self.root = root
        self.mirrors = root / "mirrors"
        self.host = host
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        self.log = root / "olah.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> Hub:
        for d in ("mirrors", "repos", "logs"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        config = self.root / "olah.toml"
        # No upstream: hf-netloc is the discard port, never contacted while offline.
        config.write_text(f"""[basic]
host = "{self.host}"
port = {self.port}
repos-path = "{self.root / 'repos'}"
mirrors-path = ["{self.mirrors}"]
hf-scheme = "http"
hf-netloc = "127.0.0.1:9"
hf-lfs-netloc = "127.0.0.1:9"
mirror-scheme = "http"
mirror-netloc = "{self.host}:{self.port}"
mirror-lfs-netloc = "{self.host}:{self.port}"

[accessibility]
offline = true
proxy = [{{ repo = "*", allow = true }}, {{ repo = "*/*", allow = true }}, {{ repo = "{DENIED_ORG}/*", allow = false }}]
cache = [{{ repo = "*", allow = true }}, {{ repo = "*/*", allow = true }}]
""")
        # olah's own command line (its olah-cli entry point), in this interpreter
        argv = [sys.executable, "-c", "import sys; from olah.server import cli; sys.argv[0] = 'olah-cli'; cli()",
                "-c", str(config), "--log-path", str(self.root / "logs")]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv,
                                         cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # a wait ends when the awaited thing dies
                raise RuntimeError(f"olah exited with {self.proc.returncode}: {self.tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"olah did not listen on {self.url} within {timeout_s:g} s: {self.tail()}")

    def tail(self, n: int = 5) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "no log"

    def downloads(self) -> Counter[str]:
        """File name -> GETs of it the server answered 200 (HEADs are not downloads)."""
        got: Counter[str] = Counter()
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return got
        for m in _ACCESS.finditer(text):
            if m.group(1) == "GET" and m.group("status") == "200":
                got[m.group("file")] += 1
        return got

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> Hub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CutRelay:
    """A TCP relay on ``host`` to the hub at ``target`` that closes, unanswered, every GET
    whose request line names ``cut``: a link that drops in the middle of a download (the
    tests of a resumed download, on the loopback or on a container network's gateway)."""

    def __init__(self, target: int, cut: str, host: str = "127.0.0.1"):
        import threading

        self.target, self.cut, self.host = target, cut.encode(), host
        self.sock = socket.create_server((host, 0))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        import threading

        with client, socket.create_connection((self.host, self.target)) as up:
            def down() -> None:
                try:
                    while data := up.recv(65536):
                        client.sendall(data)
                except OSError:
                    pass
            threading.Thread(target=down, daemon=True).start()
            try:
                while data := client.recv(65536):
                    if data.startswith(b"GET") and self.cut in data.split(b"\r\n", 1)[0]:
                        return
                    up.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    """serve DIR [--host ADDRESS] [--port N] [--demo]: olah over DIR/mirrors (with --demo,
    the demo model's repository made there first); one JSON line {url, pid, commit}."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pdnode.standin.model_hub")
    sub = parser.add_subparsers(dest="verb", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("dir")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int)
    serve.add_argument("--demo", action="store_true")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    root = Path(args.dir).resolve()
    commit = None
    if args.demo:
        from ..core.resources import resource

        commit = demo_repository(root / "mirrors", resource("playbooks", "files", "demo-moe"))
    hub = Hub(root, port=args.port, host=args.host).start()
    print(json.dumps({"url": hub.url, "pid": hub.proc.pid if hub.proc else None, "commit": commit}), flush=True)
    try:
        assert hub.proc is not None
        return hub.proc.wait()
    except KeyboardInterrupt:
        hub.stop()
        return 0


if __name__ == "__main__":
    sys.exit(main())
