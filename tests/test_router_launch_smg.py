"""pdnode.node.router_launch with smg, the router's successor (docs/smg.md), without smg
installed: a stand-in `smg` package whose parser is built from the committed smg
argument table records what the launcher hands to smg's launch_router.
tests/verify/test_router_smg.py runs the real smg."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pdnode.core.rules import argtable
from pdnode.node import router_launch
from pdnode.core.plan.build import OWNED_ROUTER_ARGS

CLIENT = "sk-client-77aa"
ADMIN = "adm-91:colon:key"
SMG = argtable.load(argtable.SMG_TABLE)
ROUTER_032 = argtable.load(argtable.ROUTER_TABLE)


def _key(d: Path, name: str, value: str) -> str:
    f = d / name
    f.write_text(value + "\n")
    f.chmod(0o600)
    return str(f)


def _add_table_args(parser: argparse.ArgumentParser, table: dict[str, dict[str, Any]]) -> None:
    """The flags of a committed table, shaped as the real parser shapes them."""
    for dest, e in table.items():
        if e["kind"] == "flag":
            parser.add_argument(e["flag"], dest=dest, action="store_true")
        elif dest == "prefill":
            parser.add_argument(e["flag"], dest=dest, nargs="+", action="append")
        elif e["list"]:
            parser.add_argument(e["flag"], dest=dest, nargs="*", action="extend")
        else:
            parser.add_argument(e["flag"], dest=dest)


@pytest.fixture
def fake_smg(monkeypatch):
    """`smg` as the launcher sees it; .calls gets each launch_router's parsed namespace."""
    calls: list[argparse.Namespace] = []

    class RouterArgs:
        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser, use_router_prefix: bool = False) -> None:
            assert not use_router_prefix
            _add_table_args(parser, SMG)

    class Parsed(argparse.Namespace):
        def _validate_router_args(self) -> None:  # the real one logs its policy choices
            pass

    def parse_router_args(argv: list[str]) -> argparse.Namespace:
        p = argparse.ArgumentParser()
        RouterArgs.add_cli_args(p)
        return p.parse_args(argv, namespace=Parsed())

    pkg = types.ModuleType("smg")
    ra = types.ModuleType("smg.router_args")
    ra.RouterArgs = RouterArgs
    lr = types.ModuleType("smg.launch_router")
    lr.parse_router_args = parse_router_args
    lr.launch_router = calls.append
    rt = types.ModuleType("smg.router")  # Router.from_args builds the router; start() would run it
    rt.Router = types.SimpleNamespace(from_args=lambda args: None)
    for name, mod in (("smg", pkg), ("smg.router_args", ra), ("smg.launch_router", lr), ("smg.router", rt)):
        monkeypatch.setitem(sys.modules, name, mod)
    # sglang-router must not be what starts: make importing it fail loudly
    for name in ("sglang_router", "sglang_router.launch_router", "sglang_router.router_args"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(router_launch, "installed_packages", lambda: ["smg"])
    monkeypatch.setattr(router_launch, "package_version", lambda p: "1.13.0")
    return calls


def _router_json(d: Path, **extra: Any) -> str:
    body = {"pd_disaggregation": True, "prefill": [["http://127.0.0.1:30000", 8998]],
            "decode": ["http://127.0.0.1:30001"], "host": "0.0.0.0", "port": 8000,
            "prometheus_host": "127.0.0.1", "prometheus_port": 29000, "policy": "cache_aware",
            "worker_startup_timeout_secs": 1800, "cb_timeout_duration_secs": 5, **extra}
    f = d / "router.json"
    f.write_text(json.dumps(body))
    return str(f)


# --- which package starts ------------------------------------------------------------------
@pytest.mark.parametrize(("requested", "installed", "picked"), [
    ("auto", ["sglang-router"], "sglang-router"),        # every release venv before smg: unchanged
    ("auto", ["smg"], "smg"),
    ("auto", ["sglang-router", "smg"], "sglang-router"),  # a unit without the flag started sglang-router
    ("smg", ["sglang-router", "smg"], "smg"),
    ("sglang-router", ["sglang-router", "smg"], "sglang-router"),
])
def test_pick_package(requested, installed, picked):
    assert router_launch.pick_package(requested, installed) == picked


def test_pick_package_refuses_what_is_not_installed():
    with pytest.raises(router_launch.LaunchError, match=r"--router-package smg: smg is not installed in .*"
                                                         r"\(sglang-router\)"):
        router_launch.pick_package("smg", ["sglang-router"])
    with pytest.raises(router_launch.LaunchError, match="no router package"):
        router_launch.pick_package("auto", [])


def test_missing_package_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(router_launch, "installed_packages", lambda: ["sglang-router"])
    assert router_launch.main([_router_json(tmp_path), "--router-package", "smg"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smg is not installed" in err[0], err


# --- smg started in this process, keys in memory ---------------------------------------------
def test_smg_gets_the_plan_arguments_and_the_keys_in_memory(tmp_path, fake_smg, capsys):
    rj = _router_json(tmp_path)
    rc = router_launch.main([rj, "--router-package", "smg", "--admin-key-file", _key(tmp_path, "a", ADMIN),
                             "--api-key-file", _key(tmp_path, "c", CLIENT)])
    assert rc == 0 and len(fake_smg) == 1
    ns = fake_smg[0]
    assert ns.pd_disaggregation and ns.prefill == [["http://127.0.0.1:30000", "8998"]]
    assert ns.decode == ["http://127.0.0.1:30001"] and ns.port == "8000" and ns.cb_timeout_duration_secs == "5"
    assert ns.api_key == CLIENT
    assert ns.control_plane_api_keys == [f"pdnode-admin:pdnode operator:admin:{ADMIN}"]
    assert ns.control_plane_audit_enabled
    out = capsys.readouterr()
    assert CLIENT not in out.out + out.err and ADMIN not in out.out + out.err


def test_smg_dry_run_names_the_package_and_redacts(tmp_path, fake_smg, capsys):
    rj = _router_json(tmp_path, log_json=True)
    assert router_launch.main([rj, "--router-package", "smg", "--admin-key-file", _key(tmp_path, "a", ADMIN),
                               "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "# smg 1.13.0" in out.err and not fake_smg
    assert out.out.startswith("--pd-disaggregation --prefill http://127.0.0.1:30000 8998 --decode ")
    assert "--log-json" in out.out and "admin:<redacted> --control-plane-audit-enabled" in out.out
    assert ADMIN not in out.out + out.err


@pytest.mark.parametrize("name", ["tenant_api_key", "redis_url", "postgres_db_url", "oracle_password", "api_key"])
def test_smg_secrets_never_come_from_the_json(tmp_path, fake_smg, capsys, name):
    rj = _router_json(tmp_path, **{name: "s3cr3t-value"})
    assert router_launch.main([rj, "--router-package", "smg"]) == 2
    err = capsys.readouterr().err
    assert f"{name} must not be in the router JSON" in err and "s3cr3t-value" not in err and not fake_smg


def test_an_argument_of_the_other_router_is_one_line(tmp_path, fake_smg, capsys):
    # mini_lb exists in sglang-router 0.3.2 only
    assert "mini_lb" in ROUTER_032 and "mini_lb" not in SMG
    rj = _router_json(tmp_path, mini_lb=True)
    assert router_launch.main([rj, "--router-package", "smg"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"pdnode.router_launch: {rj}: mini_lb: not an argument of smg 1.13.0 (installed in {sys.prefix}); "
                   "remove it, or start the package it belongs to (--router-package)"]
    assert not fake_smg


# --- the real packages judge (both are pinned in .venv): what `pdnode check` asks ------------
def _real(package: str) -> None:
    # not a skip: both are pinned in .venv (pyproject.toml), which scripts/setup makes
    try:
        importlib.import_module(router_launch.PACKAGES[package])
    except ImportError as exc:
        raise AssertionError(f"{package} is not importable ({exc}): run scripts/setup (it installs both "
                             "router packages into .venv)") from None


@pytest.mark.parametrize("package", ["sglang-router", "smg"])
@pytest.mark.parametrize(("extra", "reason"), [
    ({}, None),
    ({"retry_max_retries": -5}, "OverflowError: out of range integral type conversion attempted"),
    ({"policy": "bucket"}, "argument --policy: invalid choice: 'bucket'"),
    ({"history_backend": "redis"}, "TypeError: "),  # no --redis-url: the router's own config refuses it
    ({"jwt_issuer": "https://idp.example"}, "jwt_issuer must not be in the router JSON: keys come from"),
    ({"postgres_db_url": "postgres://pd:pw@db.example/pd"}, "postgres_db_url must not be in the router JSON"),
])
def test_judge_asks_the_installed_package(tmp_path, package, extra, reason):
    _real(package)
    router = json.loads(Path(_router_json(tmp_path, **extra)).read_text())
    said = router_launch.judge(router, package, api_key=True)
    if reason is None:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith(reason), said


def test_the_doors_are_pdnodes_rule_not_the_packages(tmp_path):
    """smg itself starts with its mesh and WASM on: refusing them is the plan's policy."""
    _real("smg")
    router = json.loads(Path(_router_json(tmp_path, enable_mesh=True, mesh_host="0.0.0.0", enable_wasm=True)).read_text())
    assert router_launch.judge(router, "smg") == []
    _real("sglang-router")
    assert router_launch.judge(json.loads(Path(_router_json(tmp_path, mini_lb=True)).read_text()), "sglang-router") == []


@pytest.mark.parametrize("package", ["sglang-router", "smg"])
def test_dry_run_asks_the_package_and_says_why_in_one_line(tmp_path, capsys, package):
    _real(package)
    rj = _router_json(tmp_path, retry_max_retries=-5)
    admin = _key(tmp_path, "a", ADMIN)
    assert router_launch.main([rj, "--router-package", package, "--admin-key-file", admin, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"pdnode.router_launch: {rj}: OverflowError: out of range integral type conversion attempted"]
    rj = _router_json(tmp_path)
    assert router_launch.main([rj, "--router-package", package, "--admin-key-file", admin, "--dry-run"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("--pd-disaggregation ") and ADMIN not in out.out + out.err


# --- the tables ------------------------------------------------------------------------------
def test_every_router_argument_the_plan_owns_means_the_same_in_smg():
    # the plan writes one router JSON; both packages must read every name it owns alike
    owned = [k for k in OWNED_ROUTER_ARGS if k not in router_launch.SECRET_ARGS]
    for key in owned:
        assert key in SMG, key
        same = {f: SMG[key][f] for f in ("flag", "kind", "list")} == {f: ROUTER_032[key][f]
                                                                          for f in ("flag", "kind", "list")}
        assert same, (key, SMG[key], ROUTER_032[key])
    # the policies the plan offers are smg's too
    from pdnode.core.plan.build import ROUTER_POLICIES
    assert set(ROUTER_POLICIES) <= set(SMG["policy"]["choices"])


def test_smg_table_names_its_source_and_shapes():
    doc = json.loads((Path(argtable.__file__).parents[2] / argtable.SMG_TABLE).read_text())
    assert doc["source"] == "smg 1.13.0"
    assert SMG["prefill"]["list"] and SMG["decode"]["list"] and SMG["pd_disaggregation"]["kind"] == "flag"
    assert SMG["sse_keepalive_secs"]["kind"] == "int"  # smg's unsigned parser counts as an integer
    assert argtable.ROUTER_TABLES == {"sglang-router": argtable.ROUTER_TABLE, "smg": argtable.SMG_TABLE}
    assert argtable.load_source(argtable.SMG_TABLE) == "smg 1.13.0"
    assert argtable.load_source(argtable.ROUTER_TABLE) == "sglang-router 0.3.2"


def test_describe_parser_reads_unsigned_ints_as_int():
    def _non_negative_int(v: str) -> int:
        return int(v)

    p = argparse.ArgumentParser()
    p.add_argument("--n", type=_non_negative_int)
    p.add_argument("--other", type=lambda v: v)
    t = argtable.describe_parser(p)
    assert t["n"]["kind"] == "int" and t["other"]["kind"] == "other"
    assert argtable.value_problem(t["n"], "x") == "--n takes an integer"
