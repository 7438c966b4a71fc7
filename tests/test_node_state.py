"""plugins/modules/node_state.py (the roles' one-call read of the host): its verdicts agree
with the modules they stand in for, over generated cases, and it changes nothing.

The fast copy is only allowed beside the original: each file case is judged by the copy
module and each directory case by the file module (both in check mode, in this process,
as on a host), and each account case by the group and user modules (check mode, the
accounts this machine has); a case where node_state sees no drift must be one where the
real module would change nothing, and the other way round. Packages and units are judged
on the node scenario's systemd container (molecule/node/tests/test_no_change_budget.py:
a forced full converge after the fast no-change run changes nothing, and each drift
planted there is seen and repaired).
"""

from __future__ import annotations

import grp
import hashlib
import importlib
import importlib.util
import os
import pwd
import random
import sys
from pathlib import Path

from module_runner import load_module, run_module

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "plugins" / "modules" / "node_state.py"
try:
    import ansible.module_utils.basic  # noqa: F401 - what the modules under test run on
except ImportError as exc:
    raise ImportError(f"{exc}: ansible-core is missing; run scripts/setup (it installs .venv)") from None

USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name
def exists(lookup, name: str) -> bool:
    try:
        lookup(name)
        return True
    except KeyError:
        return False


# Accounts any Debian host has (base-passwd), to generate owner and group differences
# (giving a file another owner needs root, as CI runs).
USERS = [USER] + [n for n in ("daemon", "bin", "nobody") if n != USER and exists(pwd.getpwnam, n)]
GROUPS = [GROUP] + [n for n in ("daemon", "bin", "nogroup") if n != GROUP and exists(grp.getgrnam, n)]


def run(load, args: dict) -> dict:
    """LOAD() gives the module; run it in check mode, in this process."""
    return run_module(load(), args, check=True)


def node_state():
    return load_module(MODULE)


def builtin(name: str):
    return lambda: importlib.reload(importlib.import_module(f"ansible.modules.{name}"))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def plant(rng: random.Random, path: Path, want: dict, content: str | None) -> None:
    """One generated state of a path: as wanted, or differing in one thing (missing, of
    another kind, content, mode, owner or group). content None: a directory is wanted."""
    kinds = ["as wanted"] * 4 + ["missing", "other kind", "mode", "owner", "group"] + ["content"] * (content is not None)
    change = rng.choice(kinds)
    if change == "missing":
        return
    is_dir = (content is None) != (change == "other kind")
    if is_dir:
        path.mkdir()
    else:
        path.write_text((content or "") + ("x" if change == "content" else ""))
    mode = int(want["mode"], 8)
    os.chmod(path, mode ^ 0o040 if change == "mode" else mode)
    owner = rng.choice([u for u in USERS if u != want["owner"]]) if change == "owner" else want["owner"]
    group = rng.choice([g for g in GROUPS if g != want["group"]]) if change == "group" else want["group"]
    os.chown(path, pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid)


def test_file_verdicts_agree_with_the_copy_module(tmp_path):
    rng = random.Random(20)  # noqa: S311 - reproducible cases, not secrets
    verdicts = []
    for i in range(60):
        case = tmp_path / f"case{i}"
        case.mkdir()
        dest, src = case / "dest", case / "src"
        content = rng.choice(["A=1\n", "A=2\n", ""])
        want = {"path": str(dest), "sha256": sha(content), "mode": rng.choice(["0644", "0640", "0600"]),
                "owner": rng.choice(USERS), "group": rng.choice(GROUPS)}
        plant(rng, dest, want, content)
        src.write_text(content)
        ours = run(node_state, {"files": [want]})
        if dest.is_dir():
            # copy would put src inside the directory; the roles never ask for that
            assert ours["drift"] == [f"file {dest}: not a regular file"]
            continue
        copy = run(builtin("copy"), {"src": str(src), "dest": str(dest), "mode": want["mode"],
                                     "owner": want["owner"], "group": want["group"], "remote_src": True})
        assert not copy.get("failed"), copy
        assert bool(ours["drift"]) == copy["changed"], (i, ours["drift"], copy)
        verdicts.append(copy["changed"])
    # both verdicts, often: the generator reaches the agreeing and the differing states
    assert verdicts.count(True) >= 10 and verdicts.count(False) >= 10, verdicts


def test_directory_verdicts_agree_with_the_file_module(tmp_path):
    rng = random.Random(21)  # noqa: S311 - reproducible cases, not secrets
    verdicts = []
    for i in range(40):
        path = tmp_path / f"d{i}"
        want = {"path": str(path), "mode": rng.choice(["0755", "0750"]),
                "owner": rng.choice(USERS), "group": rng.choice(GROUPS)}
        plant(rng, path, want, None)
        ours = run(node_state, {"directories": [want]})
        if path.is_file():
            # the file module refuses to turn a file into a directory; so does the role's converge
            assert ours["drift"] == [f"directory {path}: not a directory"]
            continue
        real = run(builtin("file"), {**want, "state": "directory"})
        assert bool(ours["drift"]) == real["changed"], (i, ours["drift"], real)
        verdicts.append(real["changed"])
    assert verdicts.count(True) >= 8 and verdicts.count(False) >= 5, verdicts


def test_a_file_read_without_its_content_agrees_with_the_file_module(tmp_path):
    """A file made on the host (the router's admin key: pd_services' read gives no sha256)
    is judged by its presence, kind, mode, owner and group, as the file module judges an
    existing file, and its content is never read (a key of mode 0000 is judged too)."""
    rng = random.Random(23)  # noqa: S311 - reproducible cases, not secrets
    verdicts = []
    for i in range(50):
        path = tmp_path / f"key{i}"
        want = {"path": str(path), "mode": rng.choice(["0400", "0440", "0600"]),
                "owner": rng.choice(USERS), "group": rng.choice(GROUPS)}
        plant(rng, path, want, rng.choice(["secret\n", ""]))
        ours = run(node_state, {"files": [want]})
        if not path.exists():
            assert ours["drift"] == [f"file {path}: missing"]
            continue
        if path.is_dir():
            assert ours["drift"] == [f"file {path}: not a regular file"]
            continue
        assert not any("content" in line for line in ours["drift"]), ours["drift"]
        real = run(builtin("file"), {**want, "state": "file"})
        assert bool(ours["drift"]) == real["changed"], (i, ours["drift"], real)
        verdicts.append(real["changed"])
    assert verdicts.count(True) >= 8 and verdicts.count(False) >= 8, verdicts
    unreadable = tmp_path / "unreadable"
    unreadable.write_text("secret\n")
    unreadable.chmod(0)
    assert run(node_state, {"files": [{"path": str(unreadable), "mode": "0000", "owner": USER,
                                       "group": GROUP}]})["drift"] == []


def test_account_verdicts_agree_with_the_group_and_user_modules():
    rng = random.Random(22)  # noqa: S311 - reproducible cases, not secrets
    verdicts = []
    names = [e.pw_name for e in pwd.getpwall()][:8] + ["pdnode-no-such-user"]
    for i in range(40):
        name = rng.choice(names)
        entry = pwd.getpwnam(name) if exists(pwd.getpwnam, name) else None
        want = {"name": name}
        for field, real_value, other in (("home", entry and entry.pw_dir, "/nonexistent-home"),
                                         ("shell", entry and entry.pw_shell, "/bin/false")):
            if rng.random() < 0.5:
                want[field] = real_value if (real_value and rng.random() < 0.6) else other
        real = run(builtin("user"), {**want, "create_home": False})
        ours = run(node_state, {"users": [want]})
        assert bool(ours["drift"]) == real["changed"], (i, want, ours["drift"], real)
        verdicts.append(real["changed"])
    assert verdicts.count(True) >= 8 and verdicts.count(False) >= 8, verdicts
    for name in [g.gr_name for g in grp.getgrall()][:5] + ["pdnode-no-such-group"]:
        real = run(builtin("group"), {"name": name})
        ours = run(node_state, {"groups": [name]})
        assert bool(ours["drift"]) == real["changed"], (name, ours["drift"], real)


def test_reads_finds_and_commands_report_without_judging(tmp_path):
    (tmp_path / "marker").write_text("release-1")
    for name in ("sglang-pd-prefill-0.service", "sglang-pd-decode-1.service", "other.service"):
        (tmp_path / name).write_text("")
    result = run(node_state, {
        "read": [str(tmp_path / "marker"), str(tmp_path / "absent")],
        "find": {"engines": {"path": str(tmp_path), "pattern": r"sglang-pd-(prefill|decode)-\d+\.service"},
                 "none": {"path": str(tmp_path / "absent"), "pattern": ".*"}},
        "commands": {"echo": {"argv": [sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"],
                              "stdin": "abc"},
                     "fails": {"argv": [sys.executable, "-c", "raise SystemExit(3)"]}},
    })
    assert result["drift"] == [] and result["changed"] is False
    assert result["read"] == {str(tmp_path / "marker"): "release-1", str(tmp_path / "absent"): None}
    assert result["found"] == {"engines": ["sglang-pd-decode-1.service", "sglang-pd-prefill-0.service"],
                               "none": []}
    assert result["commands"]["echo"]["stdout"].strip() == "cba"
    assert result["commands"]["fails"]["rc"] == 3


def test_exists_names_the_present_paths_in_the_order_given(tmp_path):
    # what the firewall role removes: the unit and the rules file an earlier layout left;
    # a dangling link is present (the file module removes it), a missing path is not
    (tmp_path / "rules.nft").write_text("")
    (tmp_path / "unit.service").symlink_to(tmp_path / "gone")
    asked = [str(tmp_path / "unit.service"), str(tmp_path / "absent"), str(tmp_path / "rules.nft")]
    result = run(node_state, {"exists": asked})
    assert result["present"] == [asked[0], asked[2]]
    assert result["drift"] == [] and result["changed"] is False
    assert run(node_state, {})["present"] == []


def test_a_command_that_exits_without_reading_its_stdin_is_an_answer_not_a_failure(tmp_path):
    """A fresh host in check mode has no release python yet: env answers 127 at once and never
    reads the spec on its stdin. That is the command's answer (rc 127), not a failed read.
    1 MiB of stdin is more than a pipe holds, so the writer always finds the pipe closed."""
    spec = "x" * (1 << 20)
    result = run(node_state, {"commands": {
        "missing": {"argv": ["env", str(tmp_path / "no-python"), "-m", "x"], "stdin": spec},
        "quits": {"argv": [sys.executable, "-c", "raise SystemExit(4)"], "stdin": spec},
        "not_a_program": {"argv": [str(tmp_path / "absent")], "stdin": spec}}})
    assert not result.get("failed"), result.get("msg")
    assert result["commands"]["missing"]["rc"] == 127
    assert result["commands"]["quits"]["rc"] == 4
    assert result["commands"]["not_a_program"]["rc"] == 127


def test_a_malformed_query_is_one_message_naming_it(tmp_path):
    bad_find = run(node_state, {"find": {"units": {"path": str(tmp_path)}}})
    assert bad_find["failed"] and "find.units" in bad_find["msg"] and "fix:" in bad_find["msg"]
    bad_cmd = run(node_state, {"commands": {"ports": {"argv": []}}})
    assert bad_cmd["failed"] and "commands.ports" in bad_cmd["msg"] and "fix:" in bad_cmd["msg"]
    bad_re = run(node_state, {"find": {"units": {"path": str(tmp_path), "pattern": "("}}})
    assert bad_re["failed"] and "find.units.pattern" in bad_re["msg"]


def test_an_http_check_names_what_it_got(tmp_path):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server name
            body = b"up 1\nreloaded 1\n" if self.path == "/metrics" else b""
            self.send_response(200 if self.path != "/missing" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        result = run(node_state, {"http": [
            {"url": f"{base}/metrics", "line": "reloaded 1"},
            {"url": f"{base}/metrics", "line": "reloaded 0"},
            {"url": f"{base}/missing"},
            {"url": "http://127.0.0.1:1/"},
        ]})
    finally:
        server.shutdown()
    drift = result["drift"]
    assert len(drift) == 3, drift
    assert "no line 'reloaded 0'" in drift[0] and "status 404" in drift[1] and "127.0.0.1:1" in drift[2]
