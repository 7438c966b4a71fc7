"""Start the node's router -- sglang-router 0.3.2 or its successor smg -- from the router
JSON the plan rendered (runs on the host).

    python -m pdnode.node.router_launch ROUTER.json [--router-package auto|sglang-router|smg]
        [--admin-key-file PATH] [--api-key-file PATH] [--dry-run]

--dry-run prints the router's arguments (keys redacted) after asking the package's own
parser whether it would start with them (``judge``); it starts nothing.

The JSON holds the router's argument names (underscored); both packages take the same
names for everything the plan sets (docs/smg.md). Which package starts:
--router-package names it (the plan writes it into the unit); `auto` (the default, what
units rendered before smg have) starts the one installed in this Python, and
sglang-router when both are (a release venv has one; a development venv may have both).

Secrets come from files and are added to the router's arguments in memory: the router
is started in this process through its own launcher (``<module>.launch_router``), so
they never show in /proc/<pid>/cmdline or in `ps`:

- --api-key-file: the client API key (/generate, /v1/*; the router also sends it to the
  workers).
- --admin-key-file: the control-plane admin key. Both routers then guard worker
  management (/workers, /workers/{id}) and their other admin routes with this key
  ALONE: the client key and no key get 401 there (docs/security.md, docs/smg.md: the
  tables measured on the real routers). Control-plane calls are audit-logged (who, what,
  outcome; never the key). Without it, worker management is open to whoever holds the
  client key, or to anyone when there is none.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import sys
from typing import Any

from .secrets import SecretError, read_secret_file

# Distribution -> the module that holds launch_router, parse_router_args and router_args.
PACKAGES = {"sglang-router": "sglang_router", "smg": "smg"}
# id:name:role:key (both routers split at the first three colons: the key may hold more)
ADMIN_KEY_ID, ADMIN_KEY_NAME = "pdnode-admin", "pdnode operator"
# Router arguments that carry a secret or a second way to the control plane: they come
# from the key files above, never from the JSON (which is world-readable config). The
# last four exist in smg only (a tenant's data-plane key; history-store credentials,
# which a database URL can carry).
SECRET_ARGS = ("api_key", "control_plane_api_keys", "jwt_issuer", "jwt_audience", "jwt_jwks_uri",
               "jwt_role_mapping", "tenant_api_key", "oracle_password", "postgres_db_url", "redis_url")


class LaunchError(Exception):
    pass


def router_argv(router: dict[str, Any]) -> list[str]:
    """sglang-router arguments (underscored names) -> its command line (smg reads the same;
    here, with the program that runs it; pdnode.core.plan.build shows it: `pdnode render --role router-argv`)."""
    argv: list[str] = []
    for key, value in router.items():
        flag = "--" + key.replace("_", "-")
        if key == "prefill":
            for url, bootstrap in value:
                argv += [flag, url, "none" if bootstrap is None else str(bootstrap)]
        elif key == "decode":
            for url in value:
                argv += [flag, url]
        elif value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv



def control_plane_args(admin_key: str) -> list[str]:
    return ["--control-plane-api-keys", f"{ADMIN_KEY_ID}:{ADMIN_KEY_NAME}:admin:{admin_key}",
            "--control-plane-audit-enabled"]


def secret_args(api_key: str | None, admin_key: str | None, *, redact: bool = False) -> list[str]:
    out: list[str] = []
    if admin_key:
        out += control_plane_args("<redacted>" if redact else admin_key)
    if api_key:
        out += ["--api-key", "<redacted>" if redact else api_key]
    return out


def installed_packages() -> list[str]:
    """The router packages this Python can import, in PACKAGES order."""
    return [dist for dist, module in PACKAGES.items() if importlib.util.find_spec(module) is not None]


def pick_package(requested: str, installed: list[str]) -> str:
    if requested != "auto":
        if requested not in installed:
            raise LaunchError(f"--router-package {requested}: {requested} is not installed in {sys.prefix}; "
                              "install it into the release venv (the sglang role does) or name the package "
                              f"installed there ({', '.join(installed) or 'none'})")
        return requested
    if not installed:
        raise LaunchError(f"no router package in {sys.prefix}: install sglang-router or smg into the release venv")
    # Both in one venv: the unit predates --router-package, and what it started before is sglang-router.
    return "sglang-router" if "sglang-router" in installed else installed[0]


def package_version(package: str) -> str:
    from importlib import metadata  # here, not at the top: pdnode.core.plan.build imports this module (`pdnode check` stays fast)

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def known_args(package: str) -> set[str]:
    """Argument names (dests) of the installed package's own parser."""
    module = importlib.import_module(f"{PACKAGES[package]}.router_args")
    parser = argparse.ArgumentParser(add_help=False)
    module.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return {a.dest for a in parser._actions if a.option_strings}


def check_router_json(router: Any, package: str, known: set[str]) -> list[str]:
    """One line per problem of the router JSON for PACKAGE (empty: it can start)."""
    if not isinstance(router, dict):
        return ["expected a JSON object"]
    problems = []
    leaked = sorted(str(k) for k in router if str(k).replace("-", "_") in SECRET_ARGS)
    if leaked:
        problems.append(f"{', '.join(leaked)} must not be in the router JSON: "
                        "keys come from --api-key-file / --admin-key-file")
    unknown = sorted(str(k) for k in router if str(k) not in known and str(k).replace("-", "_") not in SECRET_ARGS)
    if unknown:
        problems.append(f"{', '.join(unknown)}: not an argument of {package} {package_version(package)} "
                        f"(installed in {sys.prefix}); remove it, or start the package it belongs to "
                        "(--router-package)")
    return problems


# What judge() passes where the launcher passes the keys (placeholders, not secrets).
PLACEHOLDER_KEY = "pdnode-judge-placeholder-client-key"  # noqa: S105
PLACEHOLDER_ADMIN_KEY = "0" * 64


def judge(router: Any, package: str, *, api_key: bool = False, admin_key: bool = True) -> list[str]:
    """What starting ROUTER with PACKAGE would refuse, one line each (empty: it would start),
    without starting anything: this launcher's own check of the JSON, then the package's
    own parser (``parse_router_args``) on the argv this launcher builds, the keys it adds
    as placeholders, then the package's ``_validate_router_args`` and ``Router.from_args``
    (which builds the router from its arguments without running it), as ``launch_router``
    does before ``start()``. `pdnode check` asks this (pdnode.core.rules.router_judge)."""
    problems = check_router_json(router, package, known_args(package) if isinstance(router, dict) else set())
    if problems:
        return problems
    launcher = importlib.import_module(f"{PACKAGES[package]}.launch_router")
    rust = importlib.import_module(f"{PACKAGES[package]}.router")
    import logging  # here, as importlib.metadata above

    err = io.StringIO()
    level = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # the packages log their choices; a verdict is the answer
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli = router_argv(router) + secret_args(PLACEHOLDER_KEY if api_key else None,
                                                    PLACEHOLDER_ADMIN_KEY if admin_key else None)
            args = launcher.parse_router_args(cli)
            if not getattr(args, "mini_lb", False):  # 0.3.2 starts its Python mini LB without these
                args._validate_router_args()  # noqa: SLF001 - what launch_router calls
                rust.Router.from_args(args)
    except SystemExit:
        said = [line.split(": error: ", 1)[1] for line in err.getvalue().splitlines() if ": error: " in line]
        return [said[-1] if said else "its parser refused the arguments"]
    except Exception as exc:  # what launch_router would raise at start
        return [f"{type(exc).__name__}: {exc}".splitlines()[0]]
    finally:
        logging.disable(level)
    return []


def launch(package: str, cli: list[str]) -> None:
    """Parse and start the router in this process (blocks until it stops)."""
    module = importlib.import_module(f"{PACKAGES[package]}.launch_router")
    module.launch_router(module.parse_router_args(cli))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.router_launch", description=__doc__.splitlines()[0])
    ap.add_argument("router_json")
    ap.add_argument("--router-package", choices=["auto", *PACKAGES], default="auto",
                    help="which router to start (default auto: the one installed; sglang-router when both are)")
    ap.add_argument("--api-key-file", help="client API key (one key, mode 0600 or stricter)")
    ap.add_argument("--admin-key-file", help="control-plane admin key for worker management (one key, mode 0600 "
                                             "or stricter); must differ from the client key")
    ap.add_argument("--dry-run", action="store_true", help="print the router's arguments and exit")
    args = ap.parse_args(argv)
    try:
        with open(args.router_json, encoding="utf-8") as fh:
            router = json.load(fh)
        key = read_secret_file(args.api_key_file) if args.api_key_file else None
        admin = read_secret_file(args.admin_key_file) if args.admin_key_file else None
        package = pick_package(args.router_package, installed_packages())
    except (OSError, ValueError, SecretError, LaunchError) as exc:
        print(f"pdnode.router_launch: {args.router_json}: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:  # the package's own parser too: what it would refuse at start
        problems = judge(router, package, api_key=key is not None, admin_key=admin is not None)
    else:
        problems = check_router_json(router, package, known_args(package) if isinstance(router, dict) else set())
    if problems:
        for problem in problems:
            print(f"pdnode.router_launch: {args.router_json}: {problem}", file=sys.stderr)
        return 2
    if key is not None and admin is not None and key == admin:
        print(f"pdnode.router_launch: the admin key ({args.admin_key_file}) equals the client API key "
              f"({args.api_key_file}): every client could manage the router's workers; use another key",
              file=sys.stderr)
        return 2
    if admin is None:
        print("pdnode.router_launch: warning: no --admin-key-file: the router's worker management (/workers) is "
              + ("guarded only by the client API key" if key else "open to anyone who reaches its port"),
              file=sys.stderr)
    cli = router_argv(router)
    if args.dry_run:
        print(f"# {package} {package_version(package)}", file=sys.stderr)
        print(" ".join(cli + secret_args(key, admin, redact=True)))
        return 0
    launch(package, cli + secret_args(key, admin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
