"""Start sglang-router from the router JSON the plan rendered (runs on the host).

    python -m pdnode.router_launch ROUTER.json [--admin-key-file PATH] [--api-key-file PATH] [--dry-run]

The JSON holds sglang-router argument names (underscored). Secrets come from files and
are added to the router's arguments in memory, so they never show in
/proc/<pid>/cmdline or in `ps`:

- --api-key-file: the client API key (/generate, /v1/*; the router also sends it to the
  workers).
- --admin-key-file: the control-plane admin key. sglang-router 0.3.2 then guards worker
  management (/workers, /workers/{id}) and its other admin routes (/flush_cache,
  /get_loads, /parse/*, /wasm, /v1/tokenizers) with this key ALONE: the client key and
  no key get 401 there, with or without a client key (docs/security.md has the table,
  measured on the real router). Control-plane calls are audit-logged (who, what, outcome;
  never the key). Without it, worker management is open to whoever holds the client key,
  or to anyone when there is none.
"""

from __future__ import annotations

import argparse
import json
import sys

from .plan import router_argv
from .secrets import SecretError, read_secret_file

# id:name:role:key (sglang-router splits at the first three colons: the key may hold more)
ADMIN_KEY_ID, ADMIN_KEY_NAME = "pdnode-admin", "pdnode operator"
# Router arguments that carry a secret or a second way to the control plane: they come
# from the key files above, never from the JSON (which is world-readable config).
SECRET_ARGS = ("api_key", "control_plane_api_keys", "jwt_issuer", "jwt_audience", "jwt_jwks_uri",
               "jwt_role_mapping")


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pdnode.router_launch", description=__doc__.splitlines()[0])
    ap.add_argument("router_json")
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
    except (OSError, ValueError, SecretError) as exc:
        print(f"pdnode.router_launch: {args.router_json}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(router, dict):
        print(f"pdnode.router_launch: {args.router_json}: expected a JSON object", file=sys.stderr)
        return 2
    leaked = sorted(k for k in router if str(k).replace("-", "_") in SECRET_ARGS)
    if leaked:
        print(f"pdnode.router_launch: {args.router_json}: {', '.join(leaked)} must not be in the router JSON: "
              "keys come from --api-key-file / --admin-key-file", file=sys.stderr)
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
        print(" ".join(cli + secret_args(key, admin, redact=True)))
        return 0
    from sglang_router.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args(cli + secret_args(key, admin)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
