"""plugins/modules/pd_services_files.py (the pd_services role's module): all-or-nothing writes, validators without
a shell, no secret in a diff, and the per-service digests that make up for a restart
lost to an interrupted deploy. Runs the module in this process (no host needed).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from module_runner import load_module, run_module

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "plugins" / "modules" / "pd_services_files.py"
ADMIN_KEY = ROOT / "roles" / "pd_services" / "files" / "admin_key.py"
# not a skip: ansible-core is pinned in .venv (pyproject.toml), which scripts/setup makes
try:
    import ansible.module_utils.basic  # noqa: F401 - what the module under test runs on
except ImportError as exc:
    raise ImportError(f"{exc}: ansible-core is missing; run scripts/setup (it installs .venv)") from None

USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def run(args: dict, check: bool = False, diff: bool = False, patch=None) -> dict:
    """Run the module in-process; returns its JSON result."""
    mod = load_module(MODULE)
    if patch:
        patch(mod)
    return run_module(mod, args, check=check, diff=diff)


def fspec(path: Path, content: str, **kw) -> dict:
    return {"path": str(path), "content": content, "mode": "0640", "owner": USER, "group": GROUP, **kw}


def ok_validator(log: Path) -> list[str]:
    """A validator that records its argv and accepts."""
    code = "import json,sys; open(sys.argv[1],'a').write(json.dumps(sys.argv[2:])+'\\n')"
    return [sys.executable, "-c", code, str(log), "%s"]


def failing_validator(message: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.stderr.write({message!r}); sys.exit(3)", "%s"]


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".pdnode-"))


def test_validator_is_an_argv_list_run_without_a_shell(tmp_path):
    log = tmp_path / "argv.log"
    hostile = f"$(touch {tmp_path}/pwned)"
    result = run({"files": [fspec(tmp_path / "a.json", "{}", validate=ok_validator(log) + [hostile, "$HOME", "~"])]})
    assert not result.get("failed"), result
    assert not (tmp_path / "pwned").exists()
    argv = json.loads(log.read_text())
    # The candidate (a temporary file beside the destination), then the literal values:
    # no command substitution, no $VAR or ~ expansion.
    assert Path(argv[0]).parent == tmp_path and argv[0] != str(tmp_path / "a.json")
    assert argv[1:] == [hostile, "$HOME", "~"]
    assert (tmp_path / "a.json").read_text() == "{}"


def test_only_an_exact_percent_s_element_is_the_candidate(tmp_path):
    log = tmp_path / "argv.log"
    run({"files": [fspec(tmp_path / "a.json", "{}", validate=ok_validator(log) + ["--x=%s"])]})
    assert json.loads(log.read_text())[1] == "--x=%s"


def test_one_failed_validation_changes_nothing(tmp_path):
    """The 4th file fails: the first three (new and changed) are not written either."""
    old = tmp_path / "b.env"
    old.write_text("OLD=1\n")
    files = [
        fspec(tmp_path / "a.json", '{"new": 1}'),
        fspec(old, "NEW=1\n"),
        fspec(tmp_path / "c.service", "[Service]\n", unit=True),
        fspec(tmp_path / "d.target", "[Unit]\nbad\n", unit=True,
              validate=failing_validator("d.target:2: bad line\nsecond line")),
    ]
    result = run({"files": files})
    assert result["failed"]
    msg = result["msg"]
    assert "\n" not in msg
    assert str(tmp_path / "d.target") in msg and "bad line" in msg and "second line" in msg
    assert "nothing was changed" in msg
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "c.service").exists()
    assert old.read_text() == "OLD=1\n"
    assert leftovers(tmp_path) == []


def test_every_failure_is_named_in_one_line(tmp_path):
    files = [fspec(tmp_path / "a.json", "1", validate=failing_validator("first")),
             fspec(tmp_path / "b.json", "2", validate=failing_validator("second"))]
    msg = run({"files": files})["msg"]
    assert f"{tmp_path}/a.json: first" in msg and f"{tmp_path}/b.json: second" in msg


def test_a_missing_validator_is_a_failure_not_a_crash(tmp_path):
    result = run({"files": [fspec(tmp_path / "a.json", "1", validate=[str(tmp_path / "nope"), "%s"])]})
    assert result["failed"] and "cannot run" in result["msg"]
    assert not (tmp_path / "a.json").exists() and leftovers(tmp_path) == []


def test_units_are_validated_together_under_their_real_names(tmp_path):
    """decode's unit BindsTo= prefill's: on a fresh host systemd must find the candidate
    prefill unit while it checks decode's (not an installed one that is not there yet)."""
    log = tmp_path / "seen.log"
    code = ("import os,sys; d=os.environ['SYSTEMD_UNIT_PATH']; assert d.endswith(':'); "
            "open(sys.argv[1],'a').write(repr(sorted(os.listdir(d[:-1])))+chr(10)); "
            "open(sys.argv[1]+'.dir','w').write(d[:-1])")
    check = [sys.executable, "-c", code, str(log), "%s"]
    files = [fspec(tmp_path / "p.service", "P", unit=True, validate=check),
             fspec(tmp_path / "d.service", "D", unit=True, validate=check), fspec(tmp_path / "p.json", "{}")]
    result = run({"files": files})
    assert not result.get("failed"), result
    assert log.read_text().splitlines() == ["['d.service', 'p.service']"] * 2
    assert not Path((tmp_path / "seen.log.dir").read_text()).exists()  # removed after


def test_renames_put_units_last(tmp_path):
    order = []

    def patch(mod):
        real = mod.os.replace

        class OS:
            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def replace(src, dst):
                order.append(Path(dst).name)
                real(src, dst)
        mod.os = OS()

    files = [fspec(tmp_path / "p.json", "1"), fspec(tmp_path / "p.service", "u", unit=True),
             fspec(tmp_path / "d.json", "2"), fspec(tmp_path / "x.target", "t", unit=True)]
    run({"files": files}, patch=patch)
    assert order == ["p.json", "d.json", "p.service", "x.target"]


def test_a_killed_run_leaves_no_temporary_files_behind(tmp_path):
    (tmp_path / ".pdnode-abcd1234.tmp").write_text("left by a killed run")
    (tmp_path / ".pdnode-keep").write_text("not ours")
    run({"files": [fspec(tmp_path / "a.json", "1")]})
    assert leftovers(tmp_path) == [".pdnode-keep"]


def test_a_secret_file_never_shows_in_the_diff(tmp_path):
    (tmp_path / "key").write_text("OLDSECRET\n")
    result = run({"files": [fspec(tmp_path / "key", "NEWSECRET\n", secret=True)]}, check=True, diff=True)
    text = json.dumps(result)
    assert result["changed"] and "OLDSECRET" not in text and "NEWSECRET" not in text
    assert result["diff"][0]["after"] == "(secret: content not shown)\n"


def test_check_mode_writes_nothing_and_shows_a_diff(tmp_path):
    (tmp_path / "a.json").write_text("old")
    result = run({"files": [fspec(tmp_path / "a.json", "new")]}, check=True, diff=True)
    assert result["changed"] and result["diff"][0]["before"] == "old" and result["diff"][0]["after"] == "new"
    assert (tmp_path / "a.json").read_text() == "old"


def _service_files(d: Path, json_content="{}"):
    return [fspec(d / "p.json", json_content, roles=["prefill"]), fspec(d / "r.json", "{}", roles=["router"]),
            fspec(d / "t.target", "[Unit]\n", unit=True)]


def test_a_restart_lost_to_an_interrupted_run_is_found(tmp_path):
    applied = tmp_path / "applied"
    key = tmp_path / "admin-key"
    key.write_text("k1\n")
    args = {"files": _service_files(tmp_path), "applied_dir": str(applied),
            "inputs": [{"path": str(key), "roles": ["router"]},
                       {"path": str(tmp_path / "venv/lib/python3*/site-packages/pdnode.pth"),
                        "roles": ["prefill", "router"]}]}
    # Fresh: nothing recorded, every service must (re)start.
    first = run(args)
    assert first["changed"] and first["restart_roles"] == ["prefill", "router"]
    rec = run({**args, "record": ["prefill", "router"]})
    assert rec["recorded"] == ["prefill", "router"]
    assert oct(applied.stat().st_mode & 0o777) == "0o700"
    records = {p.name: p.read_text() for p in applied.iterdir()}
    assert set(records) == {"prefill.sha256", "router.sha256"}
    assert all("k1" not in v for v in records.values())
    # Nothing changed since the record: nothing to do.
    again = run(args)
    assert not again["changed"] and again["restart_roles"] == []
    # A run wrote prefill.json and was killed before its restart: this run writes
    # nothing, yet prefill must restart (and only prefill).
    run({**args, "files": _service_files(tmp_path, '{"x": 1}')})
    rerun = run({**args, "files": _service_files(tmp_path, '{"x": 1}')})
    assert rerun["changed_paths"] == [] and rerun["changed"] and rerun["restart_roles"] == ["prefill"]
    # Check mode says so as well.
    assert run({**args, "files": _service_files(tmp_path, '{"x": 1}')}, check=True)["restart_roles"] == ["prefill"]
    run({**args, "files": _service_files(tmp_path, '{"x": 1}'), "record": ["prefill"]})
    # An input another task installs (a new admin key; a new bundle pointer).
    key.write_text("k2\n")
    assert run({**args, "files": _service_files(tmp_path, '{"x": 1}')})["restart_roles"] == ["router"]
    run({**args, "files": _service_files(tmp_path, '{"x": 1}'), "record": ["router"]})
    pth = tmp_path / "venv/lib/python3.11/site-packages/pdnode.pth"
    pth.parent.mkdir(parents=True)
    pth.write_text("/venv/src/pdnode-1\n")
    assert run({**args, "files": _service_files(tmp_path, '{"x": 1}')})["restart_roles"] == ["prefill", "router"]


def test_a_files_digest_stands_for_it_in_the_restart_decision(tmp_path):
    """The router's JSON is written whole, but its worker list (which reaches the running
    router through its admin API) is not part of its digest: a new list alone restarts
    nothing; any other change does."""
    applied = tmp_path / "applied"

    def files(workers, policy):
        content = json.dumps({"policy": policy, "prefill": workers})
        return [fspec(tmp_path / "r.json", content, roles=["router"], digest=json.dumps({"policy": policy}))]

    run({"files": files(["a"], "p2"), "applied_dir": str(applied)})
    run({"files": files(["a"], "p2"), "applied_dir": str(applied), "record": ["router"]})
    moved = run({"files": files(["a", "b"], "p2"), "applied_dir": str(applied)})
    assert moved["changed_paths"] == [str(tmp_path / "r.json")] and moved["restart_roles"] == []
    assert json.loads((tmp_path / "r.json").read_text())["prefill"] == ["a", "b"]
    assert run({"files": files(["a", "b"], "rr"), "applied_dir": str(applied)})["restart_roles"] == ["router"]


def test_check_mode_counts_the_file_it_would_write(tmp_path):
    applied = tmp_path / "applied"
    args = {"files": _service_files(tmp_path), "applied_dir": str(applied)}
    run(args)
    run({**args, "record": ["prefill", "router"]})
    # The next content is not on disk in check mode, but it is what would run.
    result = run({**args, "files": _service_files(tmp_path, "[1]")}, check=True)
    assert result["restart_roles"] == ["prefill"]
    assert (tmp_path / "p.json").read_text() == "{}"


def test_a_record_given_another_mode_or_owner_gets_its_own_back(tmp_path):
    """The records are managed paths too (pdnode.core.plan.managed): a record's content decides a
    restart, its mode and owners are given back without one."""
    applied = tmp_path / "applied"
    args = {"files": _service_files(tmp_path), "applied_dir": str(applied)}
    run(args)
    run({**args, "record": ["prefill", "router"]})
    record = applied / "prefill.sha256"
    digest = record.read_text()
    record.chmod(0o644)
    seen = run(args, check=True)
    assert seen["changed"] and seen["changed_paths"] == [str(record)] and seen["restart_roles"] == []
    assert record.stat().st_mode & 0o7777 == 0o644  # check mode changes nothing
    fixed = run(args)
    assert fixed["changed_paths"] == [str(record)] and fixed["restart_roles"] == []
    st = record.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid, record.read_text()) == (0o600, os.getuid(), os.getgid(), digest)
    assert not run(args)["changed"]


def test_record_refuses_an_unknown_role(tmp_path):
    result = run({"files": _service_files(tmp_path), "applied_dir": str(tmp_path / "a"), "record": ["decode"]})
    assert result["failed"] and "unknown roles" in result["msg"]


def test_admin_key_made_once_private_and_never_printed(tmp_path):
    key = tmp_path / "router-admin-key"
    cmd = [sys.executable, "-", str(key), USER, GROUP, "0400"]
    first = subprocess.run(cmd, input=ADMIN_KEY.read_text(), capture_output=True, text=True, check=True)
    value = key.read_text()
    assert len(value) == 65 and value.endswith("\n") and int(value, 16) >= 0
    assert oct(key.stat().st_mode & 0o777) == "0o400" and key.stat().st_uid == os.getuid()
    assert first.stdout == "changed\n" and first.stderr == ""
    # Never replaces an existing key, leaves nothing behind.
    again = subprocess.run(cmd, input=ADMIN_KEY.read_text(), capture_output=True, text=True, check=True)
    assert again.stdout == "unchanged\n"
    assert key.read_text() == value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["router-admin-key"]


def test_admin_key_given_back_its_mode_and_owners_never_replaced(tmp_path):
    """Issue 27, item 6: a key chowned by hand stopped the router, and every deploy after
    it failed without repairing it (the key was made only when missing)."""
    key = tmp_path / "router-admin-key"
    cmd = [sys.executable, "-", str(key), USER, GROUP, "0400"]
    subprocess.run(cmd, input=ADMIN_KEY.read_text(), capture_output=True, text=True, check=True)
    value = key.read_text()
    others = [g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getgid()] if os.getuid() == 0 else []
    key.chmod(0o644)
    if others:
        os.chown(key, -1, others[0])
    fixed = subprocess.run(cmd, input=ADMIN_KEY.read_text(), capture_output=True, text=True, check=True)
    assert fixed.stdout == "changed\n" and value not in fixed.stdout + fixed.stderr
    st = key.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o400, os.getuid(), os.getgid())
    assert key.read_text() == value
    # anything but a regular file there is refused, left as it is, and no key is made beside it
    key.unlink()
    key.mkdir()
    refused = subprocess.run(cmd, input=ADMIN_KEY.read_text(), capture_output=True, text=True, check=False)
    assert refused.returncode != 0 and "not a regular file" in refused.stderr and key.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["router-admin-key"]


# --- issue 17, section 6: the key in the all-or-nothing set; nothing disabled before -------
KEY_OLD, KEY_NEW = "old-key-0123456789abcdef", "new-key-fedcba9876543210"


def kspec(path: Path, **kw) -> dict:
    return {"path": str(path), "mode": "0400", "owner": USER, "group": GROUP, **kw}


def keys(*specs: tuple[Path, str, dict]) -> dict:
    """The module's secrets and secret_contents for (path, content, more) triples."""
    return {"secrets": [kspec(p, **kw) for p, _, kw in specs], "secret_contents": [c for _, c, _ in specs]}


def test_the_key_waits_for_every_validator_and_changes_with_the_files(tmp_path):
    """The key was copied before the files were validated: a failed validation left the
    new key beside the old files, and a crash-restart mixed the keys. Now it is one of the
    candidates: nothing changes unless everything passes."""
    key, conf = tmp_path / "api-key", tmp_path / "prefill-0.json"
    key.write_text(KEY_OLD + "\n")
    key.chmod(0o400)
    conf.write_text("{}")
    files = [fspec(conf, '{"new": 1}'), fspec(tmp_path / "u.service", "U", unit=True, validate=failing_validator("bad"))]
    failed = run({"files": files, **keys((key, KEY_NEW + "\n", {}))})
    assert failed["failed"] and "nothing was changed" in failed["msg"]
    assert key.read_text() == KEY_OLD + "\n" and conf.read_text() == "{}" and leftovers(tmp_path) == []
    assert KEY_NEW not in json.dumps(failed) and KEY_OLD not in json.dumps(failed)
    files[1] = fspec(tmp_path / "u.service", "U", unit=True)
    ok = run({"files": files, **keys((key, KEY_NEW + "\n", {}))})
    assert not ok.get("failed") and str(key) in ok["changed_paths"]
    assert key.read_text() == KEY_NEW + "\n" and conf.read_text() == '{"new": 1}'
    assert oct(key.stat().st_mode & 0o777) == "0o400"


def test_a_key_the_host_refuses_changes_nothing_and_is_not_shown(tmp_path):
    """The validator the role gives the key: the host's own reader (python -m pdnode.node.secrets)."""
    key = tmp_path / "api-key"
    key.write_text(KEY_OLD + "\n")
    private = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAASECRET\n-----END OPENSSH PRIVATE KEY-----\n"
    check = [sys.executable, "-m", "pdnode.node.secrets", "%s"]
    result = run({"files": [fspec(tmp_path / "a.json", "{}")], **keys((key, private, {"validate": check}))})
    assert result["failed"] and "holds a private key" in result["msg"] and "\n" not in result["msg"]
    assert "SECRET" not in json.dumps(result) and "BEGIN" not in json.dumps(result)
    assert key.read_text() == KEY_OLD + "\n" and not (tmp_path / "a.json").exists()
    good = run({"files": [], **keys((key, KEY_NEW + "\n", {"validate": check}))})
    assert not good.get("failed") and key.read_text() == KEY_NEW + "\n"


def test_the_key_is_never_in_the_result_the_diff_or_the_hosts_log(tmp_path):
    logged: list[str] = []

    def patch(mod):
        real = mod.AnsibleModule.log

        def log(self, msg, log_args=None):
            logged.append(msg)
            return real(self, msg, log_args)
        mod.AnsibleModule.log = log

    key = tmp_path / "api-key"
    key.write_text(KEY_OLD + "\n")
    for check in (True, False):
        # the invocation as the controller asks for it (-v): the module's arguments, masked
        result = run({"files": [], **keys((key, KEY_NEW + "\n", {})), "_ansible_inject_invocation": True},
                     check=check, diff=True, patch=patch)
        text = json.dumps(result) + "\n".join(logged)
        assert result["changed"] and KEY_NEW not in text and KEY_OLD not in text
        assert result["diff"][0]["after"] == "(secret: content not shown)\n"
        shown = result["invocation"]["module_args"]
        assert shown["secrets"][0]["path"] == str(key) and shown["secret_contents"] == ["VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"]
    assert logged and any("Invoked with" in m for m in logged)  # the invocation was logged, masked
    assert key.read_text() == KEY_NEW + "\n"


def test_a_key_that_is_also_an_input_counts_once(tmp_path):
    """The handler records from the key on disk (an input); the write saw it as a candidate:
    the same digest, so an unchanged key never asks for a restart."""
    applied, key = tmp_path / "applied", tmp_path / "api-key"
    args = {"files": _service_files(tmp_path), **keys((key, KEY_NEW + "\n", {"roles": ["prefill", "router"]})),
            "inputs": [{"path": str(key), "roles": ["prefill", "router"]}], "applied_dir": str(applied)}
    assert run(args)["restart_roles"] == ["prefill", "router"]
    run({"files": _service_files(tmp_path), "inputs": args["inputs"], "applied_dir": str(applied),
         "record": ["prefill", "router"]})
    again = run(args)
    assert not again["changed"] and again["restart_roles"] == []
    # a new key restarts every service that reads it, in check mode already
    changed = {**args, **keys((key, KEY_OLD + "\n", {"roles": ["prefill", "router"]}))}
    assert run(changed, check=True)["restart_roles"] == ["prefill", "router"]


@pytest.fixture
def systemctl(tmp_path, monkeypatch):
    """A systemctl on PATH that records each call and, for `disable`, what was on disk then."""
    bin_dir, log = tmp_path / "bin", tmp_path / "systemctl.log"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "seen = {p: open(p).read() if os.path.exists(p) else None for p in os.environ['WATCH'].split(':')}\n"
        f"open({str(log)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'seen': seen}}) + '\\n')\n"
        "if sys.argv[1:2] == ['disable']:\n"
        "    sys.stderr.write(''.join(f'Removed \"/etc/systemd/system/x.target.wants/{u}\".\\n' for u in sys.argv[2:]))\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_nothing_is_disabled_before_everything_is_validated(tmp_path, systemctl, monkeypatch):
    """Orphan units were disabled before the files module validated anything: a refused
    deploy left the old layout's units disabled. Now the module disables them after every
    validator passed and the new files are in place, and before it removes their files."""
    orphan = tmp_path / "sglang-pd-decode-1.service"
    orphan.write_text("[Service]\n")
    new_unit = tmp_path / "sglang-pd-decode-0.service"
    monkeypatch.setenv("WATCH", f"{orphan}:{new_unit}")
    args = {"files": [fspec(new_unit, "[Service]\nNEW\n", unit=True, validate=failing_validator("refused"))],
            "disable": ["sglang-pd-decode-1.service"], "remove": [str(orphan)]}
    failed = run(args)
    assert failed["failed"] and not [c for c in _calls(systemctl) if c["argv"][:1] == ["disable"]]
    assert orphan.exists() and not new_unit.exists()
    args["files"][0].pop("validate")
    ok = run(args)
    assert not ok.get("failed") and ok["disabled"] == ["sglang-pd-decode-1.service"] and ok["changed"]
    (disable,) = [c for c in _calls(systemctl) if c["argv"][:1] == ["disable"]]
    assert disable["argv"] == ["disable", "sglang-pd-decode-1.service"]
    # at that moment the new unit was written and the orphan's file still there
    assert disable["seen"] == {str(orphan): "[Service]\n", str(new_unit): "[Service]\nNEW\n"}
    assert not orphan.exists()  # removed after


def test_check_mode_disables_nothing(tmp_path, systemctl, monkeypatch):
    orphan = tmp_path / "sglang-pd-decode-1.service"
    orphan.write_text("[Service]\n")
    monkeypatch.setenv("WATCH", str(orphan))
    result = run({"files": [], "disable": ["sglang-pd-decode-1.service"], "remove": [str(orphan)]}, check=True)
    assert result["changed"] and result["disabled"] == [] and orphan.exists()
    assert not [c for c in _calls(systemctl) if c["argv"][:1] == ["disable"]]


def test_a_file_is_unfinished_until_the_record_call_writes_its_converged_content(tmp_path):
    """The layout record names the layout its change starts from until the change's steps
    ran: the write reports a change while it does (the handlers run again after an
    interrupted run), the record call writes the converged content, and then a rerun of
    the converged plan changes nothing."""
    applied = tmp_path / "applied"
    layout = tmp_path / "layout.json"
    changing = fspec(layout, '{"engines": 2, "from": 1}\n', mode="0600", converged='{"engines": 2}\n')
    args = {"files": [changing, *_service_files(tmp_path)], "applied_dir": str(applied)}
    first = run(args)
    assert first["changed"] and first["unfinished"] == [str(layout)]
    # interrupted before the handlers: the same plan again writes nothing, but is unfinished
    again = run(args)
    assert again["changed"] and again["changed_paths"] == [] and again["unfinished"] == [str(layout)]
    assert run(args, check=True)["unfinished"] == [str(layout)]
    # the handlers' record call: the digests, then the converged content (mode and owners kept)
    done = run({**args, "record": ["prefill", "router"]})
    assert done["changed"] and done["changed_paths"] == [str(layout)] and done["recorded"] == ["prefill", "router"]
    assert layout.read_text() == '{"engines": 2}\n' and layout.stat().st_mode & 0o7777 == 0o600
    assert leftovers(tmp_path) == []
    # a record call with no restart still finishes it (a change of stops only)
    layout.write_text('{"engines": 2, "from": 1}\n')
    assert run({**args, "record": []})["changed_paths"] == [str(layout)]
    assert layout.read_text() == '{"engines": 2}\n'
    # the next plan has no change: its content is the converged one
    converged = {**changing, "content": '{"engines": 2}\n'}
    settled = run({**args, "files": [converged, *_service_files(tmp_path)]})
    assert not settled["changed"] and settled["unfinished"] == []
    assert not run({**args, "files": [converged, *_service_files(tmp_path)], "record": []})["changed"]
