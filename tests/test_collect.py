"""The incident bundle's collector (src/pdnode/node/collect.py) on the controller, no Docker:
redaction, key values stripped, key files never read, bounded commands, the manifest's
digests, the merge of the hosts' parts, and `pdnode collect`'s exit codes.

The same collector against real systemd and the deployed node: molecule/node/tests/test_collect.py.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import urllib.parse
from pathlib import Path

import pytest
from pdnode.node import collect
from pdnode.commands.cli import main as cli_main

SCRIPT = Path(collect.__file__)
PYTHON = sys.executable  # before a test replaces it
API_KEY = "api-" + "a1b2c3d4" * 6
ADMIN_KEY = "adm-" + "e5f6a7b8" * 6


def leaks(data: bytes) -> list[str]:
    """Which of the two keys DATA holds (names only: a failing assert must not print a key)."""
    return [name for name, key in (("API key", API_KEY), ("admin key", ADMIN_KEY)) if key.encode() in data]


@pytest.mark.parametrize(("name", "secret"), [
    ("HF_TOKEN", True), ("api_key", True), ("apiKey", True), ("control_plane_api_keys", True),
    ("DB_PASSWORD", True), ("AWS_SECRET_ACCESS_KEY", True), ("client_secret", True), ("token", True),
    ("max_total_tokens", False), ("tokenizer_path", False), ("skip_tokenizer_init", False),
    ("api_key_file", False), ("admin_key_path", False), ("PDNODE_SIM_DECODE_MS_PER_TOKEN", False),
    ("served_model_name", False), ("keyboard", False), ("monkey", False),
])
def test_secret_names(name, secret):
    assert collect.is_secret_name(name) is secret


def test_redact_json_replaces_secret_named_values_at_any_depth():
    doc = {"tp_size": 4, "api_key": "k1", "nested": [{"HF_TOKEN": {"deep": 1}}, {"ok": "v"}],
           "api_key_file": "/etc/x/api-key", "max_total_tokens": 8}
    out, n = collect.redact_json(doc)
    assert n == 2
    assert out == {"tp_size": 4, "api_key": "<redacted>", "nested": [{"HF_TOKEN": "<redacted>"}, {"ok": "v"}],
                   "api_key_file": "/etc/x/api-key", "max_total_tokens": 8}


def test_redact_env_rewrites_only_secret_lines():
    text = "# managed\nHF_HUB_OFFLINE=1\nexport HF_TOKEN=hf_abc\nDB_PASSWORD = p w\nPDNODE_SIM_MS_PER_TOKEN=4.0\n"
    out, n = collect.redact_env(text)
    assert n == 2
    assert out == ("# managed\nHF_HUB_OFFLINE=1\nexport HF_TOKEN=<redacted>\nDB_PASSWORD = <redacted>\n"
                   "PDNODE_SIM_MS_PER_TOKEN=4.0\n")


def test_redact_unit_environment_and_flags_across_continuation_lines():
    unit = ("[Service]\n"
            "Description=Token bucket of x\n"
            'Environment="HF_TOKEN=hf abc" PLAIN=1\n'
            "ExecStart=/opt/v/bin/python -m x --api-key \\\n"
            "    s3cr3tvalue \\\n"
            "    --router-token=tok123 \\\n"
            "    --admin-key-file /etc/sglang-pd/router-admin-key\n"
            "# --api-key commented\n")
    out, n = collect.redact_unit(unit)
    assert n == 3
    assert "hf abc" not in out and "s3cr3tvalue" not in out and "tok123" not in out
    assert "HF_TOKEN=<redacted>" in out and "PLAIN=1" in out
    assert "--router-token=<redacted>" in out
    assert "/etc/sglang-pd/router-admin-key" in out  # a key file's path is kept
    unchanged = [line for line in unit.splitlines() if "Token bucket" in line or line.startswith(("[", "#"))]
    assert all(line in out.splitlines() for line in unchanged)


def test_the_deployed_unit_template_has_nothing_to_redact():
    """The real units name key files, never keys: redaction leaves them byte for byte."""
    text = (Path(__file__).resolve().parents[1] / "roles/pd_services/templates/service.j2").read_text()
    assert collect.redact_unit(text) == (text, 0)


def test_scrub_counts_and_replaces_every_known_value_whatever_its_length():
    """Issue 17: keys under 8 characters were left in the bundle. A key pdnode_api_key_file
    accepts has 16 or more; an older, shorter one is still stripped (its bytes elsewhere too:
    over-redaction, never a leak)."""
    data, n = collect.scrub(b"a KEY123456 b KEY123456 c short", [b"KEY123456", b"short"])
    assert (data, n) == (b"a <redacted> b <redacted> c <redacted>", 3)


# Issue 17: every form a known key takes in a text. A key with a backslash, quotes, '%',
# '/', '+', '&' and '=' escapes differently in each.
ODD_KEY = "pd-K3y\\x41\\'q\"dq%2F+/&=~"


@pytest.mark.parametrize(("form", "text"), [
    ("raw", ODD_KEY),
    ("json", json.dumps({"api_key": ODD_KEY})),
    ("json_escaped_slash", json.dumps({"api_key": ODD_KEY}).replace("/", "\\/")),
    ("repr", repr({"api_key": ODD_KEY})),
    ("repr_single_quote_only", repr("pd-only'single-quote-key")),
    ("url_encoded", "GET /v1/models?api_key=" + urllib.parse.quote(ODD_KEY, safe="")),
    ("url_encoded_lower", "key=" + re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(),
                                          urllib.parse.quote(ODD_KEY, safe=""))),
    ("form_encoded", "key=" + urllib.parse.quote_plus(ODD_KEY)),
    ("json_of_repr", json.dumps({"line": f"server_args={ {'api_key': ODD_KEY} }"})),
])
def test_scrub_finds_the_key_in_every_form(form, text):
    keys = [ODD_KEY.encode(), b"pd-only'single-quote-key"]
    data, n = collect.scrub(f"before {text} after".encode(), keys)
    assert n == 1, form
    assert data.startswith(b"before ") and data.endswith(b" after") and b"<redacted>" in data
    for secret in keys:
        assert all(f not in data for f in collect.secret_forms(secret)), form
    assert b"K3y" not in data and b"single-quote" not in data, form


@pytest.mark.parametrize(("text", "want"), [
    (b"db_url: postgres://pd:pw@db.example:5432/pd, x", b"db_url: postgres://<redacted>@db.example:5432/pd, x"),
    (b"redis://:pw@cache:6379/0", b"redis://<redacted>@cache:6379/0"),
    (b"https://ghp_token@github.example/org/repo.git", b"https://<redacted>@github.example/org/repo.git"),
    (b"mongodb+srv://u:p@ss@h.example/db", b"mongodb+srv://<redacted>@h.example/db"),  # the last '@' ends it
    (b'{"url": "postgres:\\/\\/u:pw@h\\/db"}', b'{"url": "postgres:\\/\\/<redacted>@h\\/db"}'),
    (b"{'otlp': 'http://otel:pw@c.example:4317', 'who': 'a@b.example'}",
     b"{'otlp': 'http://<redacted>@c.example:4317', 'who': 'a@b.example'}"),
    (b"GET http://127.0.0.1:30000/health ok", b"GET http://127.0.0.1:30000/health ok"),
    (b"mail ops@example.com about http://host.example/a@b", b"mail ops@example.com about http://host.example/a@b"),
])
def test_credentials_in_urls_are_removed(text, want):
    out, n = collect.redact_url_credentials(text)
    assert out == want and n == (out != text)


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "logs"
SGLANG_KEY = "pd-K3y\\x41\\'q\"dq%2F+/&=~"  # tests/fixtures/logs/README.md
ROUTER_KEY, ROUTER_ADMIN_KEY = "rk-Cl13nt\\key/+%20xyz", "adm-0123456789abcdef\\qq"


def test_sglangs_real_start_up_lines_keep_no_key_and_no_url_credentials(tmp_path):
    """SGLang 0.5.23 logs `server_args={...}` (and its ServerArgs repr) with the key
    repr-escaped: a backslash doubled, a quote escaped. Both lines lose it, and the
    otlp endpoint's credentials."""
    log = (FIXTURES / "sglang-0.5.23-startup.log").read_bytes()
    assert log.count(repr(SGLANG_KEY)[1:-1].encode()) == 2 and SGLANG_KEY.encode() not in log  # only escaped
    b = collect.Bundle(tmp_path, "h", [SGLANG_KEY.encode()])
    b.add("journal/sglang-pd-prefill-0.service.txt", log, {"command": ["journalctl"]})
    out = (tmp_path / "h/journal/sglang-pd-prefill-0.service.txt").read_bytes()
    assert all(f not in out for f in collect.secret_forms(SGLANG_KEY.encode()))
    assert b"K3y" not in out and b"Otel%2FPw0rd" not in out and b"otel:" not in out
    assert out.count(b"'api_key': '<redacted>'") == 1 and out.count(b"api_key='<redacted>'") == 1
    assert out.count(b"http://<redacted>@collector.example:4317") == 2
    entry = b.files[0]
    assert entry["secret_values_removed"] == 2 and entry["url_credentials_removed"] == 2
    assert out.count(b"\n") == log.count(b"\n")  # line for line: only the secrets changed


def test_the_routers_real_start_up_lines_keep_no_url_credentials(tmp_path):
    """sglang-router 0.3.2 and smg 1.13.0 log neither key and star the database password;
    the user name in the URL goes too."""
    log = (FIXTURES / "router-startup.log").read_bytes()
    assert b"### sglang_router" in log and b"### smg" in log
    out, n, m = collect.clean(log, [ROUTER_KEY.encode(), ROUTER_ADMIN_KEY.encode()])
    assert n == 0 and m == log.count(b"postgres://pduser:") >= 3
    assert b"pduser" not in out and b"postgres://<redacted>@127.0.0.1:1/pd" in out


# --- one host, collected on the controller ---------------------------------------------------
class _Node(http.server.BaseHTTPRequestHandler):
    """/metrics leaks the API key (a buggy service); /workers wants the admin key."""

    def do_GET(self):  # noqa: N802 -- http.server's name
        if self.path.endswith("/metrics"):
            body = f"# leaked {API_KEY}\nsglang:num_running_reqs 0\n# asked {self.path}\n".encode()
        elif self.path == "/workers":
            if self.headers.get("Authorization") != f"Bearer {ADMIN_KEY}":
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"workers": [{"url": "http://127.0.0.1:1", "api_key": "worker-secret-xyz"}]}).encode()
        else:
            body = b"no"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def node(tmp_path):
    """A fake host: config dir with keys, a symlink to a key, a listener; its plan."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Node)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    cfg = tmp_path / "etc"
    cfg.mkdir()
    for name, key in (("api-key", API_KEY), ("router-admin-key", ADMIN_KEY)):
        (cfg / name).write_text(key + "\n")
        (cfg / name).chmod(0o400)
    (cfg / "prefill-0.json").write_text(json.dumps({"tp_size": 4, "port": port, "admin_api_key": "in-json-secret"}))
    (cfg / "prefill-0.env").write_text(f"HF_TOKEN=hf_secretvalue\nNOTE={API_KEY}\n")
    (cfg / "prefill-1.json").write_text(json.dumps({"tp_size": 2, "port": port}))
    (cfg / "prefill-1.env").write_text("HF_HUB_OFFLINE=1\n")
    (cfg / "decode-0.json").write_text(json.dumps({"tp_size": 4, "port": port}))
    # decode-0.env is missing: a finding, named in the manifest
    (cfg / "prefill.json").write_text('{"tp_size": 8}\n')  # left from the one-instance layout: kept too
    (cfg / "broken.json").write_text('{\n  "api_key": "brokensecret",\n  "tp_size": 4\n')
    (cfg / "evil.json").symlink_to(cfg / "api-key")

    def engine(sid: str, role: str, path: str) -> dict:
        return {"id": sid, "role": role, "unit": f"pdtest-none-{sid}.service", "url": f"http://127.0.0.1:{port}{path}",
                "config": str(cfg / f"{sid}.json"), "env_file": str(cfg / f"{sid}.env"), "args": {"port": port}}

    plan = {
        "host": "h1",
        "install": {"config_dir": str(cfg), "api_key_path": str(cfg / "api-key"),
                    "admin_key_path": str(cfg / "router-admin-key"), "venv": str(tmp_path / "no-venv"),
                    "root": str(tmp_path / "root"), "target": "pdtest-none.target"},
        # each instance's URL has its own path on the one fake server: which /metrics was asked is visible
        "services": {"prefill-0": engine("prefill-0", "prefill", "/p0"),
                     "prefill-1": engine("prefill-1", "prefill", "/p1"),
                     "decode-0": engine("decode-0", "decode", "/d0"),
                     "router": {"id": "router", "role": "router", "unit": "pdtest-none-router.service",
                                "url": f"http://127.0.0.1:{port}", "metrics_url": f"http://127.0.0.1:{port}/metrics",
                                "config": str(cfg / "router.json"), "env_file": str(cfg / "router.env"),
                                "args": {"host": "0.0.0.0", "port": port,  # noqa: S104 -- the plan's value
                                         "prometheus_host": "127.0.0.1", "prometheus_port": port},
                                "pair_probe": {"service": "pdtest-none-pair-probe.service",
                                               "timer": "pdtest-none-pair-probe.timer",
                                               "spec": {"out": str(tmp_path / "pairs.prom")}}}},
    }
    (tmp_path / "pairs.prom").write_text('pdnode_pair_probe_success{prefill="prefill-0",decode="decode-0"} 0\n')
    # the node's record of its layout, here of a change whose steps had not all run
    (tmp_path / "layout.json").write_text(json.dumps({"schema": "pdnode.layout/1", "engines": {"prefill-0": {}},
                                                      "from": {"prefill-9": {}}}))
    plan["change"] = {"record_file": str(tmp_path / "layout.json")}
    yield plan, tmp_path
    server.shutdown()


def test_collect_host_strips_keys_redacts_and_records_every_file(node):
    plan, tmp = node
    stage = tmp / "stage"
    stage.mkdir()
    manifest = collect.collect_host(plan, "h1", stage, deadline_s=60)

    files = {f["path"]: f for f in manifest["files"]}
    on_disk = {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()}
    assert on_disk == set(files)  # every file listed, nothing unlisted
    for rel, entry in files.items():
        data = (stage / rel).read_bytes()
        assert leaks(data) == [], rel
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest(), rel
        assert entry["command"], rel

    # secret-named values redacted in each kind of file
    port = plan["services"]["router"]["args"]["port"]
    prefill_json = json.loads((stage / "h1/config/prefill-0.json").read_text())
    assert prefill_json == {"tp_size": 4, "port": port, "admin_api_key": "<redacted>"}
    assert files["h1/config/prefill-0.json"]["redacted_values"] == 1
    assert "hf_secretvalue" not in (stage / "h1/config/prefill-0.env").read_text()
    assert "brokensecret" not in (stage / "h1/config/broken.json").read_text()
    # every instance's own files, and the file an older layout left
    for name in ("prefill-0.json", "prefill-0.env", "prefill-1.json", "prefill-1.env", "decode-0.json", "prefill.json"):
        assert f"h1/config/{name}" in files, name
    # a key's value anywhere (an env value, a leaky /metrics) is replaced, and counted
    assert files["h1/config/prefill-0.env"]["secret_values_removed"] == 1
    # /metrics of every instance, each from its own URL, and the router's
    for sid, path in (("prefill-0", "/p0"), ("prefill-1", "/p1"), ("decode-0", "/d0"), ("router", "")):
        entry = files[f"h1/http/{sid}.metrics.txt"]
        assert entry["exit_status"] == 200 and entry["secret_values_removed"] == 1, sid
        assert f"# asked {path}/metrics" in (stage / f"h1/http/{sid}.metrics.txt").read_text(), sid
    # the journal and the state of every unit (systemctl may be absent here: then recorded as missing)
    listed = set(files) | {m["item"] for m in manifest["missing"]}
    for unit in ("prefill-0.service", "prefill-1.service", "decode-0.service", "router.service",
                 "pair-probe.timer", "pair-probe.service"):
        assert f"journal/pdtest-none-{unit}.txt" in {x.removeprefix("h1/") for x in listed}, unit
    # what the per-pair probe last found
    assert (stage / "h1/http/pair-probe.prom.txt").read_text().startswith("pdnode_pair_probe_success{")
    # what the node runs, as the last deploy recorded it (with where its change started)
    assert json.loads((stage / "h1/state/layout.json").read_text())["from"] == {"prefill-9": {}}
    # /workers was asked with the admin key (the fake answers 401 without it), its secrets redacted
    workers = json.loads((stage / "h1/http/router.workers.json").read_text())
    assert files["h1/http/router.workers.json"]["exit_status"] == 200
    assert workers["workers"][0]["api_key"] == "<redacted>"
    # the key files: stat only, never copied; a link to one is not followed
    keys = json.loads((stage / "h1/config/key-files.json").read_text())
    assert [(k["mode"], k["size"]) for k in keys["files"]] == [("0400", len(API_KEY) + 1), ("0400", len(ADMIN_KEY) + 1)]
    assert not any(name.endswith(("api-key", "router-admin-key")) for name in files)
    assert "h1/config/evil.json" not in files
    missing = {m["item"]: m["reason"] for m in manifest["missing"]}
    assert "evil.json" in missing["config/evil.json"] or "symbolic" in missing["config/evil.json"].lower()
    assert "no bin/python" in missing["release/pip-freeze.txt"]
    assert "decode-0.env" in missing["config/decode-0.env"] and "router.json" in missing["config/router.json"]
    assert manifest["schema"] == "pdnode.collect" and manifest["version"] == 1 and manifest["host"] == "h1"


def test_a_failing_a_hanging_and_a_missing_command_are_recorded_and_the_bundle_goes_on(tmp_path):
    b = collect.Bundle(tmp_path, "h", [])
    b.run("false.txt", ["false"])
    # sh writes its line at once (no interpreter start-up to race the 3 s timeout), then
    # sleeps far longer than the test waits: a timeout that did not work is a slow failure
    b.run("sleep.txt", ["sh", "-c", "echo started; exec sleep 300"], timeout=3)
    b.run("nope.txt", ["pdnode-no-such-command"])
    b.run("ok.txt", ["echo", "fine"])
    files = {f["path"]: f for f in b.files}
    assert files["h/false.txt"]["exit_status"] == 1
    assert files["h/sleep.txt"]["exit_status"] is None and "timed out" in files["h/sleep.txt"]["error"]
    assert (tmp_path / "h/sleep.txt").read_text() == "started\n"  # output so far is kept
    assert files["h/sleep.txt"]["duration_s"] < 300  # stopped, not waited for (load only adds seconds)
    assert files["h/ok.txt"]["exit_status"] == 0 and (tmp_path / "h/ok.txt").read_text() == "fine\n"
    reasons = {m["item"]: m["reason"] for m in b.missing}
    assert "exit status 1" in reasons["false.txt"]
    assert "timed out" in reasons["sleep.txt"]
    assert "not installed" in reasons["nope.txt"]


def test_the_size_budget_cuts_and_then_skips(tmp_path):
    b = collect.Bundle(tmp_path, "h", [], max_bytes=10)
    b.add("a.txt", b"0123456", {"command": ["x"]})
    b.add("b.txt", b"0123456", {"command": ["x"]})
    b.add("c.txt", b"0", {"command": ["x"]})
    files = {f["path"]: f for f in b.files}
    assert files["h/a.txt"]["size"] == 7 and "truncated" not in files["h/a.txt"]
    assert files["h/b.txt"]["size"] == 3 and files["h/b.txt"]["truncated"] is True
    assert "h/c.txt" not in files and "budget" in b.missing[0]["reason"]


def test_the_collector_runs_alone_from_standard_input(node):
    """As the playbook runs it: the file on stdin, no pdnode package importable."""
    plan, tmp = node
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp)}
    r = subprocess.run([sys.executable, "-I", "-", "host", "--host", "h1", "--plan-json", json.dumps(plan),
                        "--deadline-s", "60"], input=SCRIPT.read_bytes(), capture_output=True, env=env,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert leaks(r.stdout + r.stderr) == []
    summary = json.loads(r.stdout)
    work = Path(summary["dir"])
    assert (work.stat().st_mode & 0o777) == 0o700
    assert [p.name for p in work.iterdir()] == ["h1.tar.gz"]  # the staging files are gone
    with tarfile.open(summary["bundle"]) as tar:
        names = tar.getnames()
        assert "h1/MANIFEST.json" in names and all(n.startswith("h1/") for n in names)
        for member in tar:
            assert leaks(tar.extractfile(member).read()) == [], member.name


# --- the merge on the controller ---------------------------------------------------------------
def _part(path: Path, host: str, files: dict[str, bytes], listed: dict[str, bytes] | None = None,
          extra: dict[str, bytes] | None = None) -> None:
    """A host's tarball: FILES with a manifest that lists LISTED (default: FILES)."""
    listed = files if listed is None else listed
    manifest = {"schema": "pdnode.collect", "version": 1, "host": host, "collected_utc": "2026-01-01T00:00:00Z",
                "files": [{"path": f"{host}/{k}", "size": len(v), "sha256": hashlib.sha256(v).hexdigest(),
                           "command": ["x"]} for k, v in listed.items()],
                "missing": [{"item": "gpu/", "reason": "nvidia-smi is not installed"}]}
    members = {f"{host}/{k}": v for k, v in files.items()} | (extra or {})
    members[f"{host}/MANIFEST.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_merge_one_bundle_with_a_manifest_that_lists_every_member(tmp_path):
    parts, out, verify = tmp_path / "parts", tmp_path / "out", tmp_path / "verify"
    parts.mkdir()
    verify.mkdir()
    _part(parts / "h1.tar.gz", "h1", {"journal/a.txt": b"log\n", "config/x.json": b"{}\n"},
          extra={"../evil": b"x", "h1/../h2/planted": b"x", "h1/unlisted.txt": b"x"})
    _part(parts / "h3.tar.gz", "h3", {"a.txt": b"real\n"}, listed={"a.txt": b"tampered\n"})
    (verify / "h1.json").write_text(json.dumps({"exit_code": 0, "run": {"api_key": "verifysecret"}}))

    dest, manifest = collect.merge(parts, out, "site", {"h1": None, "h2": "unreachable", "h3": None}, verify)
    assert dest.parent == out and dest.name.startswith("site-") and dest.name.endswith("Z.tar.gz")
    assert (dest.stat().st_mode & 0o777) == 0o600
    with tarfile.open(dest) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    root = dest.name.removesuffix(".tar.gz")
    assert all(name.startswith(root + "/") for name in members)
    got = json.loads(members.pop(f"{root}/MANIFEST.json"))
    assert got == manifest
    listed = {f"{root}/{f['path']}": f for f in got["files"]}
    assert set(listed) == set(members)  # every member listed, every listed file present
    for name, data in members.items():
        assert listed[name]["sha256"] == hashlib.sha256(data).hexdigest() and listed[name]["size"] == len(data)
    assert set(listed) == {f"{root}/h1/journal/a.txt", f"{root}/h1/config/x.json", f"{root}/h1/verify-report.json"}
    assert b"verifysecret" not in members[f"{root}/h1/verify-report.json"]
    status = {h["host"]: h["status"] for h in got["hosts"]}
    assert status == {"h1": "collected", "h2": "not collected", "h3": "collected"}
    reasons = [(m["host"], m["item"], m["reason"]) for m in got["missing"]]
    assert ("h2", "everything on the host", "unreachable") in reasons
    assert ("h3", "h3/a.txt", "listed by the host but absent or altered in its tarball") in reasons
    assert any(h == "h1" and item == "h1/unlisted.txt" for h, item, _ in reasons)
    assert any(h == "h1" and item == "gpu/" for h, item, _ in reasons)
    assert any(h == "h3" and item == "h3/verify-report.json" for h, item, _ in reasons)


# --- pdnode collect ----------------------------------------------------------------------------
FAKE_ANSIBLE = """#!{python}
import json, os, sys
extra = json.loads(sys.argv[sys.argv.index("-e") + 1])
mode = os.environ["FAKE_MODE"]
print("TASK [fake] ***")
if mode in ("ok", "partial"):
    with open(extra["collect_path_file"], "w") as fh:
        json.dump({{"bundle": "/b.tar.gz", "files": 3, "missing": 1,
                   "not_collected": ["h2"] if mode == "partial" else []}}, fh)
sys.exit({{"ok": 0, "partial": 2, "none": 4}}[mode])
"""


@pytest.fixture
def fake_venv(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    return bin_dir


def test_cli_without_ansible_playbook_says_so_in_one_line(fake_venv, capsys):
    assert cli_main(["collect", "inventories/demo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ansible-playbook is not installed next to" in err[0]


@pytest.mark.parametrize(("mode", "code", "line"), [
    ("ok", 0, "bundle: /b.tar.gz"), ("partial", 1, "bundle: /b.tar.gz"), ("none", 2, None)])
def test_cli_exit_codes_follow_the_bundle(fake_venv, capfd, monkeypatch, mode, code, line):
    fake = fake_venv / "ansible-playbook"
    fake.write_text(FAKE_ANSIBLE.format(python=PYTHON))
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_MODE", mode)
    inventory = Path(__file__).resolve().parents[1] / "inventories" / "demo"
    assert cli_main(["collect", str(inventory)]) == code
    out, err = capfd.readouterr()
    if line:
        assert out.strip().splitlines()[-1].startswith(line)
    else:
        assert "no bundle was written" in err
    if mode == "partial":
        assert "not collected from h2" in err
