"""The incident bundle: what a node says about itself, read-only, bounded, secrets removed.

Stdlib only, Python >= 3.9, no import of the rest of pdnode: playbooks/collect.yml sends
this file to each host on standard input and runs it there with the host's own python3,
so it works on a host whose release is broken or was never installed.

On the host (as root; changes nothing but its own private temporary directory):

    python3 - host --host NAME --plan-json PLAN

  writes <new dir, mode 0700>/NAME.tar.gz (the host's files and its MANIFEST.json) and
  prints {"bundle": PATH, "dir": DIR, ...} as one JSON line.

On the controller:

    python collect.py merge --parts DIR --out DIR --name NAME --verify-dir DIR [--path-file F] < OUTCOMES

  joins the hosts' tarballs (OUTCOMES: {"host": null or why it has none}) and the last
  verify reports into OUT/NAME-<UTC>.tar.gz with one MANIFEST.json, and prints its path.

Every command runs from an argument list (never a shell) with a timeout, its output
capped; a failing command is recorded in the manifest and the bundle goes on. The API
key and the router's admin key files are never copied: the bundle has their mode, owner
and size. Their values are held in memory only to strip them from everything collected,
in every form a text can hold them (raw, JSON- and repr-escaped, URL-encoded; a key that
a log line leaked is replaced and counted, so the manifest says where); credentials in
any URL (scheme://user:pass@host) are replaced too.
"""

from __future__ import annotations

import argparse
import grp
import gzip
import hashlib
import io
import json
import os
import pwd
import re
import resource
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SCHEMA, SCHEMA_VERSION = "pdnode.collect", 1
REDACTED = "<redacted>"

# Bounds. The journal and kernel tails are bounded by line count, everything by bytes.
JOURNAL_LINES = 5000
KERNEL_LINES = 2000
COMMAND_TIMEOUT_S = 20.0
PIP_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 5.0
HOST_DEADLINE_S = 150.0
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_HOST_BYTES = 96 * 1024 * 1024
MAX_CONFIG_BYTES = 1024 * 1024
MAX_KEY_BYTES = 65536

# A name is secret when one of its words is one of these (HF_TOKEN, api_key, apiKey,
# control_plane_api_keys, DB_PASSWORD) -- but not max_total_tokens or tokenizer_path,
# which are settings an incident needs. A name whose last word says it holds a location
# (api_key_file, admin_key_path) is kept: a path is not a secret, and which key file a
# service reads is often the question. So is a rate (MS_PER_TOKEN).
SECRET_WORDS = frozenset({"key", "keys", "apikey", "secret", "secrets", "token", "password", "passwd",
                          "passphrase", "credential", "credentials"})
LOCATION_WORDS = frozenset({"file", "path", "dir"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# Credentials in a URL of any scheme (postgres://user:pass@host, redis://:pass@host,
# https://token@host), also with JSON-escaped slashes: the userinfo up to the last '@'
# of the authority (which ends at '/', '?', '#', whitespace, '"', '<' or '>'). Replaced
# whole, user included; a URL without '@' is left alone.
_URL_AUTHORITY = re.compile(rb"([A-Za-z][A-Za-z0-9+.\-]*:(?:\\?/){2})([^/?#\s\"<>]*@)")

XID = re.compile(rb"NVRM: Xid|\bXid\b")
ENV_LINE = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_.-]*)(\s*=\s*)(.*)$")
FLAG = re.compile(r"^--?([A-Za-z0-9][A-Za-z0-9_-]*)(=.*)?$")

# Commands see this environment only: no pager, no colours, no locale surprises.
COMMAND_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
    "PAGER": "cat",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
SHOW_PROPERTIES = ("NRestarts,ActiveState,SubState,Result,ExecMainStatus,ActiveEnterTimestamp,"
                   "MainPID,LimitNOFILE,LimitMEMLOCK,FragmentPath,DropInPaths")


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- redaction ------------------------------------------------------------------------
def is_secret_name(name: str) -> bool:
    words = [w.lower() for w in _WORD.findall(name)]
    if not words or words[-1] in LOCATION_WORDS:
        return False
    # A word after "per" is a unit of measure (PDNODE_SIM_DECODE_MS_PER_TOKEN), not a secret.
    return any(w in SECRET_WORDS and (i == 0 or words[i - 1] != "per") for i, w in enumerate(words))


def redact_json(value: Any) -> tuple[Any, int]:
    """VALUE with every secret-named key's value replaced; and how many were."""
    if isinstance(value, dict):
        out, n = {}, 0
        for k, v in value.items():
            if isinstance(k, str) and is_secret_name(k):
                out[k], n = REDACTED, n + 1
            else:
                out[k], m = redact_json(v)
                n += m
        return out, n
    if isinstance(value, list):
        out_list, n = [], 0
        for v in value:
            r, m = redact_json(v)
            out_list.append(r)
            n += m
        return out_list, n
    return value, 0


def redact_env(text: str) -> tuple[str, int]:
    """An environment file (NAME=VALUE lines) with secret-named values replaced."""
    lines, n = [], 0
    for line in text.splitlines(keepends=True):
        m = ENV_LINE.match(line.rstrip("\r\n"))
        if m and is_secret_name(m.group(2)):
            end = line[len(line.rstrip("\r\n")):]
            line = f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}{end}"
            n += 1
        lines.append(line)
    return "".join(lines), n


def _redact_words(words: list[str], hide_next: bool = False) -> tuple[list[str], int, bool]:
    """Assignments NAME=VALUE and flags --name VALUE / --name=VALUE with secret names.

    HIDE_NEXT in and out: a secret flag at the end of one line hides the first word of
    the next (ExecStart= continues over lines ending in a backslash).
    """
    out, n = [], 0
    for word in words:
        if hide_next:
            out.append(REDACTED)
            n, hide_next = n + 1, False
            continue
        flag = FLAG.match(word)
        if flag and is_secret_name(flag.group(1)):
            if flag.group(2) is not None:
                out.append(f"{word.split('=', 1)[0]}={REDACTED}")
                n += 1
            else:
                out.append(word)
                hide_next = True
            continue
        name, eq, _ = word.partition("=")
        if eq and ENV_LINE.match(word) and is_secret_name(name):
            out.append(f"{name}={REDACTED}")
            n += 1
            continue
        out.append(word)
    return out, n, hide_next


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, posix=True)
    except ValueError:  # unbalanced quotes: words as they stand
        return text.split()


def redact_unit(text: str) -> tuple[str, int]:
    """A systemd unit: secret-named Environment= assignments and command-line flags replaced.

    Only lines that name a secret are rewritten (re-quoted); the rest stay byte for byte.
    """
    lines, n, hide_next, continued = [], 0, False, False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        end = line[len(body):]
        cont = " \\" if body.rstrip().endswith("\\") else ""
        stripped = body.strip()
        if continued:
            head, words = body[:len(body) - len(body.lstrip())], _split(stripped.rstrip("\\"))
        elif "=" in body and not stripped.startswith(("#", ";", "[")):
            key, _, value = body.partition("=")
            head, words = key + "=", _split(value.rstrip().rstrip("\\"))
        else:
            head, words = "", []
        if words or hide_next:
            new, m, hide_next = _redact_words(words, hide_next)
            if m:
                line = head + " ".join(shlex.quote(w) for w in new) + cont + end
                n += m
        continued = bool(cont)
        lines.append(line)
    return "".join(lines), n


def _escapes(text: str) -> set[str]:
    """TEXT as a JSON string body (ASCII-escaped or not, '/' escaped or not) and as a
    Python repr body (either quote)."""
    out = {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1], repr(text)[1:-1]}
    out |= {e.replace("/", "\\/") for e in list(out)}
    out.add(text.replace("\\", "\\\\").replace("'", "\\'"))  # repr's body when the text also holds '"'
    out.add(text.replace("\\", "\\\\").replace('"', '\\"'))
    return out


def secret_forms(secret: bytes) -> list[bytes]:
    """Every form a known secret takes in a text, longest first: as it is, JSON-escaped,
    repr-escaped (SGLang logs its server_args with repr: a '\\' in the key doubles),
    URL-encoded (upper- and lower-case hex, '+' or %20 for a space), and each escape of
    an escape or of an encoding once more (a repr in a JSON log line, ...)."""
    try:
        text = secret.decode("utf-8")
    except UnicodeDecodeError:
        return [secret] if secret else []
    if not text:
        return []
    encoded = {urllib.parse.quote(text, safe=""), urllib.parse.quote(text, safe="/"),
               urllib.parse.quote_plus(text, safe="")}
    encoded |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), e) for e in list(encoded)}
    forms = {text} | _escapes(text) | encoded
    forms |= {e for f in list(forms) for e in _escapes(f)}
    return sorted({f.encode("utf-8") for f in forms}, key=lambda f: (-len(f), f))


def scrub(data: bytes, secrets: list[bytes]) -> tuple[bytes, int]:
    """DATA with every occurrence of a known secret value replaced, in every form it takes
    (secret_forms), whatever its length; and how many were."""
    n = 0
    for secret in secrets:
        for form in secret_forms(secret):
            if form in data:
                n += data.count(form)
                data = data.replace(form, REDACTED.encode())
    return data, n


def redact_url_credentials(data: bytes) -> tuple[bytes, int]:
    """DATA with the userinfo of every URL replaced (scheme://<redacted>@host); and how many."""
    return _URL_AUTHORITY.subn(lambda m: m.group(1) + REDACTED.encode() + b"@", data)


def clean(data: bytes, secrets: list[bytes]) -> tuple[bytes, int, int]:
    """DATA with the known secrets (scrub) and URL credentials removed; and how many of each."""
    data, n = scrub(data, secrets)
    data, m = redact_url_credentials(data)
    return data, n, m


def read_key_value(path: str) -> bytes | None:
    """A key file's value, for scrubbing only (never written anywhere): regular file,
    no FIFO wait, bounded; None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MAX_KEY_BYTES)
    finally:
        os.close(fd)
    value = raw.rstrip(b"\r\n")
    return value or None


def stat_record(path: str) -> dict[str, Any]:
    """Mode, owner, group and size of PATH (the file itself is not opened)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return {"path": path, "exists": False, "error": exc.strerror or str(exc)}
    rec: dict[str, Any] = {
        "path": path, "exists": True, "regular_file": stat.S_ISREG(st.st_mode),
        "mode": f"{stat.S_IMODE(st.st_mode):04o}", "uid": st.st_uid, "gid": st.st_gid,
        "size": st.st_size, "mtime_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime)),
    }
    try:
        rec["owner"] = pwd.getpwuid(st.st_uid).pw_name
        rec["group"] = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        pass  # an id without a name: the number stands
    return rec


# --- what to collect, from the plan ------------------------------------------------------
def _loopback(host: str | None) -> str:
    """Where to reach a listener from the host itself: wildcard binds via loopback."""
    if not host or host in ("0.0.0.0", "*"):  # noqa: S104 -- a bind address we map to loopback, not bind to
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _url(url: Any) -> str | None:
    """An http(s) URL from the plan, or None: nothing else is ever asked."""
    return url.rstrip("/") if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def targets(plan: dict[str, Any]) -> dict[str, Any]:
    """Units, files, URLs and paths to collect, all read from the plan: every service of
    plan["services"] (each engine instance and the router), in the plan's order."""
    install = plan.get("install") or {}
    services = [s for s in (plan.get("services") or {}).values() if isinstance(s, dict)]
    units = [str(s["unit"]) for s in services if s.get("unit")]
    # the per-pair probe beside the router: its units, and the metrics it last wrote
    probe = next((s["pair_probe"] for s in services if isinstance(s.get("pair_probe"), dict)), None)
    if probe:
        units += [str(probe[k]) for k in ("timer", "service") if probe.get(k)]
    if install.get("target"):
        units.append(install["target"])
    metrics: list[tuple[str, str]] = []
    workers = None
    for svc in services:
        sid = str(svc.get("id") or svc.get("role") or "service")
        args = svc.get("args") if isinstance(svc.get("args"), dict) else {}
        if svc.get("role") == "router":
            url = _url(svc.get("metrics_url")) or (
                f"http://{_loopback(args.get('prometheus_host'))}:{args['prometheus_port']}/metrics"
                if args.get("prometheus_port") else None)
            if args.get("port"):  # the router's own port, from the node itself (it may bind a wildcard)
                workers = f"http://{_loopback(args.get('host'))}:{args['port']}/workers"
            elif _url(svc.get("url")):
                workers = f"{_url(svc.get('url'))}/workers"
        else:
            base = _url(svc.get("url")) or (f"http://{_loopback(args.get('host'))}:{args['port']}"
                                            if args.get("port") else None)
            url = f"{base}/metrics" if base else None
        if url:
            metrics.append((sid, url))
    # Each service's own files (config_dir/<id>.json and .env), whether or not they exist.
    files = [(str(svc[k]), "json" if k == "config" else "env") for svc in services
             for k in ("config", "env_file") if isinstance(svc.get(k), str) and svc[k]]
    return {
        "units": units,
        "pair_probe_out": str((probe.get("spec") or {}).get("out") or "") or None if probe else None,
        "config_dir": install.get("config_dir"),
        "service_files": files,
        "key_files": [p for p in (install.get("api_key_path"), install.get("admin_key_path")) if p],
        "admin_key_path": install.get("admin_key_path"),
        "venv": install.get("venv"),
        # the router runs from a venv of its own (only where the router runs on this host)
        "router_venv": install.get("router_venv") if "router" in (plan.get("services") or {}) else None,
        "root": install.get("root"),
        "metrics": metrics,
        "workers": workers,
        # what the node runs, as the last deploy recorded it (an unfinished change names
        # the layout it started from): no secret in it
        "layout_record": str((plan.get("change") or {}).get("record_file") or "") or None,
    }


# --- the bundle being written -----------------------------------------------------------
class Bundle:
    """Files of one host under DIR/<host>/, each recorded with its source and digest."""

    def __init__(self, root: Path, host: str, secrets: list[bytes], *,
                 deadline_s: float = HOST_DEADLINE_S, max_bytes: int = MAX_HOST_BYTES):
        self.root, self.host, self.secrets = root, host, secrets
        self.files: list[dict[str, Any]] = []
        self.missing: list[dict[str, Any]] = []
        self.total = 0
        self.max_bytes = max_bytes
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def skip(self, item: str, reason: str) -> None:
        self.missing.append({"item": item, "reason": reason})

    def add(self, rel: str, data: bytes, source: dict[str, Any], *, redactions: int = 0) -> None:
        """Write DATA (secrets stripped, capped) to <host>/REL and record it."""
        data, scrubbed, urls = clean(data, self.secrets)
        truncated = False
        room = min(MAX_FILE_BYTES, self.max_bytes - self.total)
        if room <= 0:
            self.skip(rel, f"the host's size budget ({self.max_bytes} bytes) is spent")
            return
        if len(data) > room:
            data, truncated = data[:room], True
        path = self.root / self.host / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.total += len(data)
        entry = {"path": f"{self.host}/{rel}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                 **source}
        if truncated:
            entry["truncated"] = True
        if redactions:
            entry["redacted_values"] = redactions
        if scrubbed:
            # A key's value was in this text (a log line, an answer): it is replaced here,
            # and it is on the host in clear. That is a finding in itself.
            entry["secret_values_removed"] = scrubbed
        if urls:
            entry["url_credentials_removed"] = urls
        self.files.append(entry)

    def run(self, rel: str, argv: list[str], *, timeout: float = COMMAND_TIMEOUT_S,
            ok_codes: tuple[int, ...] = (0,)) -> bytes | None:
        """Run ARGV (no shell), keep its stdout as REL; the output, or None if it did not run."""
        timeout = min(timeout, self.left())
        if timeout < 1:
            self.skip(rel, f"not run: the collection's deadline was reached ({shlex.join(argv)})")
            return None
        exe = shutil.which(argv[0], path=COMMAND_ENV["PATH"]) if "/" not in argv[0] else argv[0]
        if exe is None or not os.access(exe, os.X_OK):
            self.skip(rel, f"{argv[0]} is not installed on this host")
            return None
        t0 = time.monotonic()
        source: dict[str, Any] = {"command": argv}
        with tempfile.TemporaryFile(dir=self.root) as out:
            try:
                proc = subprocess.Popen([exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.PIPE, env=COMMAND_ENV, start_new_session=True)
            except OSError as exc:
                self.skip(rel, f"{shlex.join(argv)} could not start: {exc.strerror or exc}")
                return None
            try:
                _, err = proc.communicate(timeout=timeout)
                source["exit_status"] = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its whole session: no child left behind
                _, err = proc.communicate()
                source["exit_status"] = None
                source["error"] = f"timed out after {timeout:.0f} s (output so far kept)"
            source["duration_s"] = round(time.monotonic() - t0, 3)
            if proc.returncode not in ok_codes and "error" not in source and err:
                tail, _, _ = clean(err[-600:], self.secrets)
                source["stderr_tail"] = tail.decode("utf-8", "replace").strip()
            out.seek(0)
            data = out.read(MAX_FILE_BYTES + 1)
        self.add(rel, data, source)
        if source["exit_status"] not in ok_codes:
            # Kept (its output may still say something), and listed with what is missing.
            why = source.get("error") or f"exit status {source['exit_status']}"
            self.skip(rel, f"{shlex.join(argv)}: {why}" + (f": {source['stderr_tail']}" if "stderr_tail" in source else ""))
        return data

    def read_file(self, rel: str, path: str, kind: str, *, follow: bool = False) -> None:
        """Copy a file on disk, its secret-named values redacted (KIND: json, env, unit, text).

        Links are not followed unless FOLLOW: a config_dir/x.json linked to the key file
        must not carry the key into the bundle.
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
        except OSError as exc:
            self.skip(rel, f"{path}: {exc.strerror or exc}")
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.skip(rel, f"{path} is not a regular file (not read)")
                return
            raw = os.read(fd, MAX_CONFIG_BYTES + 1)
        finally:
            os.close(fd)
        source: dict[str, Any] = {"command": ["read", path]}
        if len(raw) > MAX_CONFIG_BYTES:
            source["error"] = f"larger than {MAX_CONFIG_BYTES} bytes: cut there"
            raw = raw[:MAX_CONFIG_BYTES]
        n = 0
        if kind == "json":
            try:
                doc, n = redact_json(json.loads(raw))
                raw = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
            except ValueError as exc:
                # Not JSON: keep it as text, with the env rules (NAME=VALUE / "name": value lines).
                source["error"] = f"not valid JSON ({exc}); kept as text, secret-named lines redacted"
                text, n = redact_env(raw.decode("utf-8", "replace"))
                raw, m = _redact_json_like_lines(text)
                n += m
        elif kind == "env":
            text, n = redact_env(raw.decode("utf-8", "replace"))
            raw = text.encode()
        elif kind == "unit":
            text, n = redact_unit(raw.decode("utf-8", "replace"))
            raw = text.encode()
        self.add(rel, raw, source, redactions=n)

    def http(self, rel: str, url: str, *, headers: dict[str, str] | None = None,
             json_body: bool = False) -> None:
        """GET URL (no proxy) and keep the answer, whatever its status."""
        timeout = min(HTTP_TIMEOUT_S, self.left())
        if timeout < 1:
            self.skip(rel, f"not asked: the collection's deadline was reached (GET {url})")
            return
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        req = urllib.request.Request(url, headers=headers or {})  # noqa: S310 -- http URLs from the plan
        t0 = time.monotonic()
        source: dict[str, Any] = {"command": ["GET", url]}
        try:
            with opener.open(req, timeout=timeout) as resp:
                status, body = resp.status, resp.read(MAX_FILE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read(MAX_FILE_BYTES + 1)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            self.skip(rel, f"GET {url}: {reason}")
            return
        source["exit_status"] = status
        source["duration_s"] = round(time.monotonic() - t0, 3)
        n = 0
        if json_body:
            try:
                doc, n = redact_json(json.loads(body))
                body = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
            except ValueError:
                pass  # an error page: kept as it came (known key values are still stripped)
        self.add(rel, body, source, redactions=n)

    def manifest(self, plan_host: str | None) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "version": SCHEMA_VERSION, "host": self.host,
            "plan_host": plan_host, "hostname": socket.gethostname(),
            "collected_utc": utc_now(), "duration_s": round(time.monotonic() - self.t0, 3),
            "files": self.files, "missing": self.missing,
        }


def _redact_json_like_lines(text: str) -> tuple[bytes, int]:
    """A broken JSON file, line by line: "secret_name": anything -> "secret_name": "<redacted>"."""
    pat = re.compile(r'^(\s*"([^"]+)"\s*:\s*)(.*?)(,?)\s*$')
    lines, n = [], 0
    for line in text.splitlines(keepends=True):
        m = pat.match(line)
        if m and is_secret_name(m.group(2)):
            line = f'{m.group(1)}"{REDACTED}"{m.group(4)}\n'
            n += 1
        lines.append(line)
    return "".join(lines).encode(), n


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name)


def _show_value(text: bytes | None, prop: str) -> str | None:
    for line in (text or b"").decode("utf-8", "replace").splitlines():
        if line.startswith(prop + "="):
            return line.split("=", 1)[1]
    return None


def collect_host(plan: dict[str, Any], host: str, root: Path, *, deadline_s: float = HOST_DEADLINE_S,
                 journal_lines: int = JOURNAL_LINES, kernel_lines: int = KERNEL_LINES) -> dict[str, Any]:
    """Everything for one host under ROOT/<host>/; returns the host's manifest."""
    t = targets(plan)
    # The keys' values, in memory only, to strip them from every text collected.
    secrets = [v for v in (read_key_value(p) for p in t["key_files"]) if v]
    b = Bundle(root, host, secrets, deadline_s=deadline_s)

    b.add("plan.json", (json.dumps(redact_json(plan)[0], indent=2, sort_keys=True) + "\n").encode(),
          {"command": ["plan", "given by the controller (pdnode_plan)"]})

    # systemd: state and restart counts, status, journal, the limits the process runs with.
    for unit in t["units"]:
        u = _safe(unit)
        shown = b.run(f"systemd/{u}.show.txt", ["systemctl", "show", unit, "--no-pager", "-p", SHOW_PROPERTIES])
        # status exits 3 for a stopped unit and 4 for an unknown one: the text says which
        b.run(f"systemd/{u}.status.txt", ["systemctl", "status", unit, "--no-pager", "--full", "--lines", "50"],
              ok_codes=(0, 3, 4))
        b.run(f"journal/{u}.txt", ["journalctl", "-u", unit, "-n", str(journal_lines), "--no-pager",
                                   "-o", "short-iso"])
        pid = _show_value(shown, "MainPID")
        if unit.endswith(".service"):
            if pid and pid.isdigit() and pid != "0":
                b.read_file(f"limits/{u}.proc-limits.txt", f"/proc/{pid}/limits", "text")
            else:
                b.skip(f"limits/{u}.proc-limits.txt", f"{unit} has no main process (MainPID={pid})")
    b.run("systemd/list-units.txt", ["systemctl", "list-units", "--all", "--no-pager", "--full"])
    b.run("systemd/failed.txt", ["systemctl", "--failed", "--no-pager", "--full"])

    # Files on disk: what the services read (keys excepted), redacted. Each service's own
    # files first (a missing one is a finding), then whatever else config_dir holds (a
    # file left from an older layout explains a service that reads the wrong one).
    cfg = t["config_dir"]
    # A link to a key file is not followed by read_file (O_NOFOLLOW): recorded, never read.
    keys = {os.path.abspath(p) for p in t["key_files"]}
    done: set[str] = set()
    for path, kind in t["service_files"]:
        if os.path.abspath(path) in keys:
            b.skip(f"config/{_safe(os.path.basename(path))}", f"{path} is a key file: never read")
            continue
        done.add(os.path.abspath(path))
        b.read_file(f"config/{_safe(os.path.basename(path))}", path, kind)
    if cfg and os.path.isdir(cfg):
        names = sorted(n for n in os.listdir(cfg) if n.endswith((".json", ".env")))
        for name in names:
            path = os.path.join(cfg, name)
            if os.path.abspath(path) in keys | done:
                continue
            b.read_file(f"config/{_safe(name)}", path, "json" if name.endswith(".json") else "env")
    elif cfg:
        b.skip("config/", f"{cfg} does not exist")
    for unit in t["units"]:
        b.read_file(f"units/{_safe(unit)}", f"/etc/systemd/system/{unit}", "unit")
        dropins = f"/etc/systemd/system/{unit}.d"
        if os.path.isdir(dropins):
            for name in sorted(os.listdir(dropins)):
                if name.endswith(".conf"):
                    b.read_file(f"units/{_safe(unit)}.d/{_safe(name)}", os.path.join(dropins, name), "unit")
    if t.get("layout_record"):
        b.read_file("state/layout.json", t["layout_record"], "json")
    keys_doc = {"note": "key files are never read into the bundle: mode, owner and size only",
                "files": [stat_record(p) for p in t["key_files"]]}
    b.add("config/key-files.json", (json.dumps(keys_doc, indent=2) + "\n").encode(),
          {"command": ["lstat", *t["key_files"]]})

    # The services' own view: metrics of every instance and the router, the router's workers,
    # and what the per-pair probe last found of every pair.
    for sid, url in t["metrics"]:
        b.http(f"http/{_safe(sid)}.metrics.txt", url)
    if t.get("pair_probe_out"):
        b.read_file("http/pair-probe.prom.txt", t["pair_probe_out"], "text")
    if t["workers"]:
        admin = read_key_value(t["admin_key_path"]) if t["admin_key_path"] else None
        if admin is None:
            b.skip("http/router.workers.json",
                   f"no router admin key on the host ({t['admin_key_path']}): /workers needs it, not asked")
        else:
            b.http("http/router.workers.json", t["workers"],
                   headers={"Authorization": "Bearer " + admin.decode("utf-8", "replace")}, json_body=True)

    # The GPUs, the kernel (Xid), listeners, limits, the release.
    if shutil.which("nvidia-smi", path=COMMAND_ENV["PATH"]):
        b.run("gpu/nvidia-smi-q.txt", ["nvidia-smi", "-q"], timeout=60)
        b.run("gpu/nvidia-smi-topo.txt", ["nvidia-smi", "topo", "-m"], timeout=30)
    else:
        b.skip("gpu/", "nvidia-smi is not installed on this host (no NVIDIA driver)")
    kernel = b.run("kernel/journal-k.txt", ["journalctl", "-k", "-n", str(kernel_lines), "--no-pager",
                                            "-o", "short-iso"])
    if kernel is not None:
        xid = b"".join(line for line in kernel.splitlines(keepends=True) if XID.search(line))
        b.add("kernel/xid.txt", xid, {"command": ["filter", "lines of kernel/journal-k.txt matching Xid"]})
    b.run("host/ss-ltnp.txt", ["ss", "-ltnp"])
    b.run("host/uname.txt", ["uname", "-a"])
    b.run("host/df.txt", ["df", "-h"])
    b.read_file("host/os-release.txt", "/etc/os-release", "text", follow=True)  # a link to /usr/lib
    b.read_file("host/meminfo.txt", "/proc/meminfo", "text")
    b.add("host/ulimit.txt", _rlimits(), {"command": ["getrlimit", "the collector's own (a root session's) limits"]})
    venv = t["venv"]
    if venv and os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        b.run("release/pip-freeze.txt", [os.path.join(venv, "bin", "python"), "-m", "pip", "freeze"],
              timeout=PIP_TIMEOUT_S)
    elif venv:
        b.skip("release/pip-freeze.txt", f"the release's virtualenv {venv} has no bin/python")
    if t["root"]:
        b.add("release/releases.json",
              (json.dumps(_releases(t["root"], venv, t.get("router_venv")), indent=2) + "\n").encode(),
              {"command": ["listdir", os.path.join(t["root"], "venvs")]})
    return b.manifest(plan.get("host"))


def _rlimit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def _rlimits() -> bytes:
    lines = []
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        soft, hard = resource.getrlimit(getattr(resource, name))
        lines.append(f"{name:<20} soft={_rlimit(soft)} hard={_rlimit(hard)}")
    return ("\n".join(lines) + "\n").encode()


def _releases(root: str, venv: str | None, router_venv: str | None = None) -> dict[str, Any]:
    base = os.path.join(root, "venvs")
    try:
        names = sorted(os.listdir(base))
    except OSError as exc:
        return {"venvs_dir": base, "error": exc.strerror or str(exc)}
    out = []
    for name in names:
        path = os.path.join(base, name)
        rec = stat_record(path)
        rec["in_plan"] = path in (venv, router_venv)
        if os.path.islink(path):
            rec["link_to"] = os.readlink(path)
        out.append(rec)
    return {"venvs_dir": base, "plan_venv": venv, "plan_router_venv": router_venv, "entries": out}


def _tar_dir(src: Path, prefix: str, dest: Path) -> None:
    """SRC/<files> as PREFIX/<files> in DEST (tar.gz), plain members, stable order."""
    with tarfile.open(dest, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{prefix}/{path.relative_to(src).as_posix()}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))


def main_host(args: argparse.Namespace) -> int:
    plan = json.loads(args.plan_json)
    host = _safe(args.host)
    work = Path(tempfile.mkdtemp(prefix="pdnode-collect-"))  # mode 0700: only root reads it
    try:
        stage = work / "stage"
        stage.mkdir(mode=0o700)
        manifest = collect_host(plan, host, stage, deadline_s=args.deadline_s)
        (stage / host / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
        bundle = work / f"{host}.tar.gz"
        _tar_dir(stage / host, host, bundle)
        shutil.rmtree(stage)
        os.chmod(bundle, 0o600)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(json.dumps({"bundle": str(bundle), "dir": str(work), "files": len(manifest["files"]),
                      "missing": [f"{m['item']}: {m['reason']}" for m in manifest["missing"]],
                      "bytes": bundle.stat().st_size, "duration_s": manifest["duration_s"]}))
    return 0


# --- on the controller: one bundle from the hosts' parts ------------------------------------
def _member_ok(name: str, host: str) -> bool:
    parts = name.split("/")
    return parts[0] == host and len(parts) > 1 and all(p not in ("", ".", "..") for p in parts)


def merge(parts: Path, out_dir: Path, name: str, outcomes: dict[str, str | None],
          verify_dir: Path | None) -> tuple[Path, dict[str, Any]]:
    """OUT_DIR/NAME-<UTC>.tar.gz from PARTS/<host>.tar.gz; returns (path, manifest)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    root = f"{_safe(name)}-{stamp}"
    files: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    hosts: list[dict[str, Any]] = []
    members: list[tuple[str, bytes]] = []
    for host in sorted(outcomes):
        safe = _safe(host)
        part = parts / f"{safe}.tar.gz"
        entry: dict[str, Any] = {"host": host}
        if outcomes[host] is not None or not part.is_file():
            entry["status"] = "not collected"
            entry["reason"] = outcomes[host] or f"no bundle came back from {host}"
            missing.append({"host": host, "item": "everything on the host", "reason": entry["reason"]})
        else:
            got = _read_part(part, safe)
            host_manifest = json.loads(got.pop(f"{safe}/MANIFEST.json", b"{}") or b"{}")
            entry.update(status="collected", collected_utc=host_manifest.get("collected_utc"),
                         hostname=host_manifest.get("hostname"), duration_s=host_manifest.get("duration_s"))
            for rec in host_manifest.get("files", []):
                data = got.pop(rec.get("path", ""), None)
                if data is None or hashlib.sha256(data).hexdigest() != rec.get("sha256"):
                    missing.append({"host": host, "item": rec.get("path"),
                                    "reason": "listed by the host but absent or altered in its tarball"})
                    continue
                members.append((rec["path"], data))
                files.append({"host": host, **rec})
            for extra in sorted(got):
                missing.append({"host": host, "item": extra, "reason": "in the host's tarball but not in its manifest: left out"})
            missing += [{"host": host, **m} for m in host_manifest.get("missing", [])]
        _add_verify_report(host, safe, verify_dir, members, files, missing)
        hosts.append(entry)
    manifest = {"schema": SCHEMA, "version": SCHEMA_VERSION, "bundle": root, "created_utc": utc_now(),
                "hosts": hosts, "files": files, "missing": missing,
                "paths": "relative to the bundle's top directory; MANIFEST.json is not listed in itself"}
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / f"{root}.tar.gz"
    n = 1
    while dest.exists():  # two runs in the same second keep both
        n += 1
        dest = out_dir / f"{root}-{n}.tar.gz"
    tmp = dest.with_name(f".{dest.name}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # logs and configs: the owner's only
    with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        now = int(time.time())
        for path, data in [("MANIFEST.json", (json.dumps(manifest, indent=2) + "\n").encode()), *members]:
            info = tarfile.TarInfo(f"{root}/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, dest)
    return dest, manifest


def _read_part(part: Path, host: str) -> dict[str, bytes]:
    """The regular members of a host's tarball under <host>/ (anything else is ignored)."""
    got: dict[str, bytes] = {}
    with tarfile.open(part, "r:gz") as tar:
        for member in tar:
            if member.isfile() and _member_ok(member.name, host):
                fh = tar.extractfile(member)
                if fh is not None:
                    got[member.name] = fh.read()
    return got


def _add_verify_report(host: str, safe: str, verify_dir: Path | None, members: list[tuple[str, bytes]],
                       files: list[dict[str, Any]], missing: list[dict[str, Any]]) -> None:
    rel = f"{safe}/verify-report.json"
    src = verify_dir / f"{host}.json" if verify_dir else None
    if src is None or not src.is_file():
        missing.append({"host": host, "item": rel, "reason": f"no verify report on the controller ({src}); "
                        "playbooks/verify.yml writes one"})
        return
    raw = src.read_bytes()
    n = 0
    try:
        doc, n = redact_json(json.loads(raw))
        raw = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    except ValueError:
        pass
    raw, urls = redact_url_credentials(raw)
    age = int(time.time() - src.stat().st_mtime)
    members.append((rel, raw))
    files.append({"host": host, "path": rel, "size": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                  "command": ["read", str(src), "(on the controller)"], "age_s": age,
                  **({"redacted_values": n} if n else {}), **({"url_credentials_removed": urls} if urls else {})})


def main_merge(args: argparse.Namespace) -> int:
    outcomes = json.load(sys.stdin)
    if not isinstance(outcomes, dict):
        print("pdnode.node.collect merge: standard input must be a JSON object {host: null or reason}", file=sys.stderr)
        return 2
    dest, manifest = merge(Path(args.parts), Path(args.out), args.name, outcomes,
                           Path(args.verify_dir).resolve() if args.verify_dir else None)
    summary = {"bundle": str(dest.resolve()), "files": len(manifest["files"]), "missing": len(manifest["missing"]),
               "not_collected": [h["host"] for h in manifest["hosts"] if h["status"] != "collected"]}
    if args.path_file:
        Path(args.path_file).write_text(json.dumps(summary) + "\n")
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.collect", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("host", help="collect this host into a private temporary tarball")
    h.add_argument("--host", required=True, help="the inventory's name for this host")
    h.add_argument("--plan-json", required=True, help="the plan (pdnode_plan), as JSON")
    h.add_argument("--deadline-s", type=float, default=HOST_DEADLINE_S)
    h.set_defaults(func=main_host)
    m = sub.add_parser("merge", help="join the hosts' tarballs into one bundle (on the controller)")
    m.add_argument("--parts", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--name", required=True)
    m.add_argument("--verify-dir")
    m.add_argument("--path-file", help="also write the summary (bundle path) here")
    m.set_defaults(func=main_merge)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
