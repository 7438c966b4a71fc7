"""Send one PD request to every prefill-decode pair of the plan and write the outcome as
node-exporter textfile metrics, for the per-pair alert (PdPairFailing).

    python -m pdnode.node.pair_probe --spec /etc/pdnode/pair-probe.json

Why: SGLang counts failed hand-offs per instance and the router per worker; no metric
names the pair. A pair can fail alone while each of its engines serves its other partners
and answers /health: after one transient Mooncake error a decode's session to one prefill
is blacklisted and that pair answers 500 until SGLang's failed-session probe lifts it
(sglang#13054; docs/field-failures.md row 4). A systemd timer on the router's host runs
this every pdnode_pair_probe_interval_s (roles/pd_services).

Only pairs of two engines that answer /health are probed: a pair with an engine that is
down, loading or restarting (a deploy, an upgrade, a crash) is skipped and said so
(pdnode_pair_probe_skipped 1); PdServiceNotActive and the router's alerts name that
engine. What is left is the failure the alert is for: both engines healthy, the pair not.

Each pair gets what the router sends for a request (pdnode.verify.checks_disagg sends the
same once per verify): one /generate body with the prefill's bootstrap host and port and a
random room, to the prefill and to the decode at once. All pairs are probed at the same
time, so a pair that hangs costs its own timeout, not the others'. A pair succeeded when
both answered HTTP 200, neither answer carries `error`, and the decode's is a JSON
object (or a list of one) with text; anything else is a failure, and its reason goes to stderr (the
journal) as one line naming the pair. The metrics:

    pdnode_pair_probe_skipped{prefill="prefill-0",decode="decode-0"} 0
    pdnode_pair_probe_success{prefill="prefill-0",decode="decode-0"} 1      (probed pairs only)
    pdnode_pair_probe_duration_seconds{prefill="prefill-0",decode="decode-0"} 0.041
    pdnode_pair_probe_last_run_timestamp_seconds 1796000000.0

written to a temporary file beside --out's and renamed over it, so the node exporter never
reads half a file. Exit 0 when every pair succeeded, 1 when one failed, 2 on a bad spec.
Standard library only: it runs from the router's venv like pdnode.node.drain.

The spec (JSON, written by the deploy; it names the key file, never the key):
    {"engines": [{"id": "prefill-0", "role": "prefill", "url": "http://127.0.0.1:30001",
                  "bootstrap_port": 8998}, {"id": "decode-0", "role": "decode", ...}],
     "api_key_file": "/etc/pdnode/api-key" or null, "timeout_s": 30, "out": "/var/lib/pdnode-metrics/pairs.prom"}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

PROMPT = "pdnode pair probe: say one word."
DETAIL_CHARS = 200
HEALTH_TIMEOUT_S = 20.0  # SGLang's /health answers 503 by itself after 20 s without progress


class SpecError(ValueError):
    pass


@dataclass
class Pair:
    prefill: str
    decode: str
    prefill_url: str
    decode_url: str
    bootstrap_host: str
    bootstrap_port: int
    ok: bool = False
    why: str = "not sent"
    seconds: float = 0.0
    skipped: str = ""  # why the pair was not probed ('' when it was)


def pairs_of(engines: list[dict[str, Any]]) -> list[Pair]:
    """Every prefill with every decode, in the spec's order. The bootstrap host is the
    prefill URL's host, as the router sends it (smg and sglang-router alike)."""
    prefills = [e for e in engines if e.get("role") == "prefill"]
    decodes = [e for e in engines if e.get("role") == "decode"]
    out = []
    for p in prefills:
        for d in decodes:
            host = urlsplit(str(p["url"])).hostname or "127.0.0.1"
            out.append(Pair(p["id"], d["id"], str(p["url"]).rstrip("/"), str(d["url"]).rstrip("/"), host,
                            int(p["bootstrap_port"])))
    return out


def _post(url: str, body: dict[str, Any], key: str, timeout: float) -> tuple[int, bytes, str]:
    """(HTTP status, body, why it failed before an answer); status 0 when none came."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310 - http(s) only
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only
            return resp.status, resp.read(), ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() or b"", ""
    except (TimeoutError, OSError) as exc:  # URLError, a refused or reset connection, a timeout
        reason = getattr(exc, "reason", exc)
        return 0, b"", f"{type(reason).__name__}: {reason}"[:DETAIL_CHARS]


def _snippet(data: bytes) -> str:
    return " ".join(data.decode("utf-8", "replace").split())[:DETAIL_CHARS]


def judge(prefill: tuple[int, bytes, str], decode: tuple[int, bytes, str]) -> str:
    """'' when the pair served the request, else why not (one line)."""
    for who, (status, body, error) in (("prefill", prefill), ("decode", decode)):
        if status == 0:
            return f"{who}: no answer ({error})"
        if status != 200:
            return f"{who}: HTTP {status}: {_snippet(body)}"
    # SGLang answers a failure after admission with HTTP 200 and an `error` (either side)
    for who, (_, body, _) in (("prefill", prefill), ("decode", decode)):
        try:
            data = json.loads(body)
        except ValueError:
            continue
        first = data[0] if isinstance(data, list) and data else data
        if isinstance(first, dict) and first.get("error"):
            return f"{who}: HTTP 200 carrying an error: {_snippet(json.dumps(first['error']).encode())}"
    try:
        data = json.loads(decode[1])
    except ValueError:
        return f"decode: HTTP 200 but not JSON: {_snippet(decode[1])}"
    if isinstance(data, list):  # /generate answers a list for a batch
        data = data[0] if data else None
    if not isinstance(data, dict):
        return f"decode: HTTP 200 but not a JSON object: {_snippet(decode[1])}"
    if not str(data.get("text") or ""):
        return f"decode: HTTP 200 without generated text: {_snippet(decode[1])}"
    return ""


def health(url: str) -> str:
    """'' when URL/health answers 200, else why not (SGLang serves it without the API key)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=HEALTH_TIMEOUT_S) as resp:  # noqa: S310 - http(s) only
            return "" if resp.status == 200 else f"/health HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"/health HTTP {exc.code}"
    except (TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"/health: {type(reason).__name__}: {reason}"[:DETAIL_CHARS]


def probe(pair: Pair, key: str, timeout: float) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "bootstrap_host": pair.bootstrap_host, "bootstrap_port": pair.bootstrap_port,
            "bootstrap_room": int.from_bytes(os.urandom(8), "big") >> 1}
    answers: dict[str, tuple[int, bytes, str]] = {}

    def send(role: str, url: str) -> None:
        answers[role] = _post(url + "/generate", body, key, timeout)

    t0 = time.monotonic()
    threads = [threading.Thread(target=send, args=("prefill", pair.prefill_url), daemon=True),
               threading.Thread(target=send, args=("decode", pair.decode_url), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pair.seconds = time.monotonic() - t0
    pair.why = judge(answers["prefill"], answers["decode"])
    pair.ok = not pair.why


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(pairs: list[Pair], now: float) -> str:
    def labels(p: Pair) -> str:
        return f'{{prefill="{_label(p.prefill)}",decode="{_label(p.decode)}"}}'

    probed = [p for p in pairs if not p.skipped]
    lines = ["# HELP pdnode_pair_probe_skipped 1 when this pair was not probed: one of its engines did not answer "
             "/health.",
             "# TYPE pdnode_pair_probe_skipped gauge"]
    lines += [f"pdnode_pair_probe_skipped{labels(p)} {int(bool(p.skipped))}" for p in pairs]
    lines += ["# HELP pdnode_pair_probe_success 1 when the last probe of this prefill-decode pair was served, else 0.",
              "# TYPE pdnode_pair_probe_success gauge"]
    lines += [f"pdnode_pair_probe_success{labels(p)} {int(p.ok)}" for p in probed]
    lines += ["# HELP pdnode_pair_probe_duration_seconds How long the last probe of this pair took.",
              "# TYPE pdnode_pair_probe_duration_seconds gauge"]
    lines += [f"pdnode_pair_probe_duration_seconds{labels(p)} {p.seconds:.3f}" for p in probed]
    lines += ["# HELP pdnode_pair_probe_last_run_timestamp_seconds When the last probe of every pair ended.",
              "# TYPE pdnode_pair_probe_last_run_timestamp_seconds gauge",
              f"pdnode_pair_probe_last_run_timestamp_seconds {now:.3f}"]
    return "\n".join(lines) + "\n"


def write_atomically(path: str, text: str) -> None:
    """Beside the target, then renamed over it: a reader sees the old file or the new one."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".pair-probe-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # the node exporter runs as another user
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_spec(path: str) -> tuple[list[Pair], str, float, str]:
    """(pairs, API key or '', timeout, output path); SpecError names what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read the spec {path}: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("engines"), list):
        raise SpecError(f"{path}: the spec needs a list 'engines'")
    for e in spec["engines"]:
        need = ("id", "role", "url") + (("bootstrap_port",) if isinstance(e, dict) and e.get("role") == "prefill" else ())
        missing = [k for k in need if not isinstance(e, dict) or k not in e]
        if missing:
            raise SpecError(f"{path}: an engine lacks {', '.join(repr(k) for k in missing)} (each needs id, role, "
                            "url; a prefill its bootstrap_port)")
        if not str(e["url"]).startswith(("http://", "https://")):
            raise SpecError(f"{path}: {e['id']}'s url {e['url']!r} must start with http:// or https://")
    pairs = pairs_of(spec["engines"])
    if not pairs:
        raise SpecError(f"{path}: the engines make no prefill-decode pair")
    timeout = spec.get("timeout_s", 30)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise SpecError(f"{path}: timeout_s {timeout!r} must be a number of seconds above 0")
    out = spec.get("out")
    if not isinstance(out, str) or not out.startswith("/"):
        raise SpecError(f"{path}: out {out!r} must be an absolute path")
    key = ""
    key_file = spec.get("api_key_file")
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as exc:
            raise SpecError(f"cannot read the API key file {key_file}: {exc.strerror}") from None
    return pairs, key, float(timeout), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdnode.node.pair_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="the probe's JSON spec (written by the deploy)")
    args = ap.parse_args(argv)
    try:
        pairs, key, timeout, out = load_spec(args.spec)
    except SpecError as exc:
        print(f"pair probe: {exc}", file=sys.stderr)
        return 2
    urls = sorted({p.prefill_url for p in pairs} | {p.decode_url for p in pairs})
    healthy = dict(zip(urls, _each(health, [(u,) for u in urls])))
    for p in pairs:
        p.skipped = "; ".join(f"{who} {why}" for who, url in ((p.prefill, p.prefill_url), (p.decode, p.decode_url))
                              if (why := healthy[url]))
    _each(probe, [(p, key, timeout) for p in pairs if not p.skipped])
    try:
        write_atomically(out, metrics_text(pairs, time.time()))
    except OSError as exc:
        print(f"pair probe: cannot write {out}: {exc.strerror}", file=sys.stderr)
        return 2
    for p in pairs:
        if p.skipped:
            print(f"pair {p.prefill} + {p.decode} not probed: {p.skipped}", file=sys.stderr)
        elif not p.ok:
            print(f"pair {p.prefill} + {p.decode} failed in {p.seconds:.2f} s: {p.why}", file=sys.stderr)
    served = sum(p.ok for p in pairs)
    skipped = sum(bool(p.skipped) for p in pairs)
    print(f"{served} of {len(pairs)} pairs served" + (f", {skipped} not probed" if skipped else ""))
    return 0 if served + skipped == len(pairs) else 1


def _each(fn, calls: list[tuple]) -> list:
    """FN(*args) for every ARGS at once, one thread each; their answers in order."""
    answers: list = [None] * len(calls)

    def run(i: int) -> None:
        answers[i] = fn(*calls[i])
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


if __name__ == "__main__":
    sys.exit(main())
