"""Strict patterns for every inventory value that reaches a unit, an environment file,
a command line or a path on the host (called by pdnode.plan.build_plan).

The node description is written by people and copied between sites; the deploy runs as
root and templates its values into systemd units (where a newline starts a new
directive and '%' is a specifier), environment files, argv lists and chowned paths.
So every value is held to a pattern here, one problem line per bad value, before any
file is written. A generic backstop refuses control characters in any string anywhere
(keys too); the specific rules below allow only what a real value needs.
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
from collections.abc import Callable
from typing import Any

from . import argtable

# C0/C1 controls and DEL, Unicode line/paragraph separators, zero-width and bidi
# controls: none belongs in a configuration value, several end a line somewhere.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
PREFIX_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?$")
HOST_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]*$")
HOST_PATH_MAX = 200
CONTROLLER_PATH_RE = re.compile(r"^[A-Za-z0-9._/+][A-Za-z0-9._/+-]{0,199}$")
# no ":" -- SGLang 0.5.23 reserves it for model:adapter (validation_hook.py refuses it)
SERVED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/@+-]{0,127}$")
GPU_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,63}$")
VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+){1,3}((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
DNS_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# Environment files: systemd reads quotes, backslashes and (since v239) $VAR in them,
# so values keep to characters that mean nothing there.
ENV_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:/@+=-]{0,1024}$")
# The deploy chowns the install root and the config dir to the service user: a system
# directory there would hand it to that user. Two components at least, and none of these
# (or anything below the first-level ones that are virtual, volatile or the OS itself).
SYSTEM_DIRS = frozenset({
    "/usr/local", "/usr/lib", "/usr/lib64", "/usr/bin", "/usr/sbin", "/usr/share", "/usr/include",
    "/usr/src", "/usr/libexec", "/var/lib", "/var/log", "/var/tmp",  # noqa: S108 - refused, not used
    "/var/cache", "/var/run", "/var/lock",
    "/var/spool", "/var/mail", "/var/opt", "/var/www", "/var/backups", "/etc/systemd", "/etc/ssh",
    "/etc/security", "/etc/default", "/etc/apt", "/etc/sudoers.d", "/etc/ssl", "/etc/pam.d",
    "/etc/cron.d", "/etc/profile.d", "/etc/ld.so.conf.d", "/etc/modprobe.d", "/etc/sysctl.d",
    "/etc/alternatives", "/opt/local", "/home/root",
})
SYSTEM_TOPS = frozenset({"proc", "sys", "dev", "run", "tmp", "boot", "bin", "sbin", "lib", "lib32", "lib64",
                         "libx32", "lost+found", "snap"})
PROMPT_MAX = 4000
ANSWER_MAX = 200
# Names of arguments that hold a secret: a secret on argv shows in `ps` and in the
# rendered JSON; it belongs in a file the launcher reads.
# ("token" alone also names token counts, e.g. max_total_tokens: only its secret forms.)
_SECRET_WORDS = frozenset({"key", "keys", "secret", "secrets", "password", "passwd", "credential", "credentials"})
_SECRET_ENDINGS = ("auth_token", "access_token", "bearer_token", "api_token", "hf_token")

# (rule id from pdnode.rules, field, value, rule, fix): the plan checker's error()
Error = Callable[[str, str, Any, str, str], None]


def safe_name(name: str) -> str:
    """A variable path as printed in a message: repr() when it holds odd characters."""
    return name if re.fullmatch(r"[A-Za-z0-9_.+\-\[\]]*", name) else repr(name)


def _walk(value: Any, path: str):
    """(path, key-or-string) of every string, dict key and float below a value."""
    if isinstance(value, dict):
        for k, item in value.items():
            yield path, k
            yield from _walk(item, f"{path}.{k}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")
    else:
        yield path, value


def backstop(raw: dict[str, Any], names: list[str], error: Error) -> set[str]:
    """Control characters anywhere, non-finite numbers; returns the variables hit."""
    hit: set[str] = set()
    for name in names:
        if name not in raw:
            continue
        for path, leaf in _walk(raw[name], name):
            if isinstance(leaf, str) and _CONTROL.search(leaf):
                error("value-control-character",
                      path, leaf, "contains a control character (newline, tab, escape, ...); in a unit or "
                      "an environment file it would start a new line or directive",
                      "write the value on one line with printable characters only")
                hit.add(name)
                break
            if isinstance(leaf, float) and not math.isfinite(leaf):
                error("value-finite", path, leaf, "is not a finite number", "write a finite number")
                hit.add(name)
                break
    return hit


def _host_path(error: Error, name: str, value: str, chowned: bool) -> None:
    if not value.startswith("/"):
        return  # plan.py reports relative paths with their own fix
    if len(value) > HOST_PATH_MAX:
        error("path-length", name, value, f"is longer than {HOST_PATH_MAX} characters", "use a shorter path")
    elif not HOST_PATH_RE.match(value):
        error("path-characters", name, value, "may contain only letters, digits and . _ - / (it is written into units, "
              "command lines and chown calls; spaces, '%', '$' and quotes mean something there)",
              "rename the directory or choose one with a plain name")
    elif posixpath.normpath(value) != value:
        error("path-normalized", name, value, "is not a normalized path ('..', '.', '//' or a trailing '/')",
              f"write it as {posixpath.normpath(value)}")
    elif chowned:
        parts = value.strip("/").split("/")
        if len(parts) < 2 or value in SYSTEM_DIRS or parts[0] in SYSTEM_TOPS:
            error("path-not-system-dir",
                  name, value, "is a system directory or lies in one (the deploy makes it owned by the "
                  "service user)", "use a directory of its own, e.g. /opt/sglang-pd or /etc/sglang-pd")


def _host(error: Error, name: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
        return
    except ValueError:
        pass
    if not DNS_RE.match(value):
        error("host-address",
              name, value, "must be an IP address or a DNS name", "write e.g. 0.0.0.0, 127.0.0.1 or node1.example")


def check_settings(v: dict[str, Any], skip: set[str], error: Error) -> None:
    """Patterns of the single pdnode_* values (``v``: typed values, None when missing or
    of the wrong type; ``skip``: variables the backstop already reported)."""
    def s(name: str) -> str | None:
        value = v.get(name)
        return value if isinstance(value, str) and name not in skip else None

    user = s("pdnode_service_user")
    if user is not None and user != "root" and not USER_RE.match(user):
        error("service-user-name",
              "pdnode_service_user", user, "must be a POSIX system user name: a-z or _ first, then a-z 0-9 _ -, "
              "at most 32 characters (systemd expands '%' specifiers in User= and reads a number as a uid)",
              "use a dedicated system user such as sglang")
    prefix = s("pdnode_service_prefix")
    if prefix is not None and not PREFIX_RE.match(prefix):
        error("service-prefix-name",
              "pdnode_service_prefix", prefix, "must be a-z first, then a-z 0-9 -, at most 40 characters, "
              "not ending in '-' (it names the systemd units)", "use e.g. sglang-pd")
    for name, chowned in (("pdnode_install_root", True), ("pdnode_config_dir", True), ("pdnode_model_path", False)):
        value = s(name)
        if value is not None:
            _host_path(error, name, value, chowned)
    served = s("pdnode_model_served_name")
    if served is not None and not SERVED_NAME_RE.match(served):
        error("served-name-pattern",
              "pdnode_model_served_name", served, "must be a letter or digit first, then letters, digits and "
              ". _ / @ + -, at most 128 characters (it lands in unit descriptions, where '%' is a "
              "specifier, and in JSON; SGLang reserves ':' for model:adapter)", "use e.g. org/Model-Name_v1.5-fp8")
    gpu = s("pdnode_gpu_model")
    if gpu is not None and not GPU_MODEL_RE.match(gpu):
        error("gpu-model-name",
              "pdnode_gpu_model", gpu, "must be a GPU name as nvidia-smi prints it: letters, digits, spaces and "
              ". _ ( ) / + -, at most 64 characters", "copy the name from `nvidia-smi --query-gpu=name --format=csv`")
    for name in ("pdnode_sglang_version", "pdnode_sglang_router_version", "pdnode_smg_version",
                 "pdnode_mooncake_version", "pdnode_mooncake_cuda13_version"):
        value = s(name)
        if value is not None and not VERSION_RE.match(value):
            error("version-pattern",
                  name, value, "must be a release number such as 0.5.23 or 0.3.13.post1 (it names the "
                  "virtualenv and is passed to pip)", "write the release as the package index lists it")
    for name in ("pdnode_wheelhouse", "pdnode_api_key_file"):
        value = s(name)
        if value is not None and not CONTROLLER_PATH_RE.match(value):
            error("controller-path-pattern",
                  name, value, "must be a controller path of letters, digits and . _ / + -, not starting with "
                  "'-', at most 200 characters", "move or rename the file or directory")
    for name in ("pdnode_router_host", "pdnode_router_metrics_host"):
        value = s(name)
        if value is not None:
            _host(error, name, value)
    for name, limit in (("pdnode_verify_reference_prompt", PROMPT_MAX), ("pdnode_verify_reference_answer", ANSWER_MAX)):
        value = s(name)
        if value is not None and len(value) > limit:
            error("verify-reference-length",
                  name, value, f"is longer than {limit} characters", "use a short question and answer")
    env = v.get("pdnode_engine_environment")
    if isinstance(env, dict) and "pdnode_engine_environment" not in skip:
        _environment(error, env)


def _environment(error: Error, env: dict[Any, Any]) -> None:
    for key, value in env.items():
        name = f"pdnode_engine_environment.{key}"
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            error("environment-name",
                  name, value, "the variable name must be A-Z or _ first, then A-Z 0-9 _ (at most 128)",
                  "write the name in upper case, e.g. SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT")
        elif isinstance(value, (dict, list)) or value is None:
            error("environment-value-type", name, value, "must be a string, a number or true/false", "write one value")
        elif isinstance(value, str) and not ENV_VALUE_RE.match(value):
            error("environment-value-pattern",
                  name, value, "may contain only letters, digits and _ . , : / @ + = - (at most 1024; systemd "
                  "reads quotes, backslashes, spaces at the ends and $VAR in environment files)",
                  "write a plain value")


def is_secret_name(name: str) -> bool:
    words = name.lower().replace("-", "_").split("_")
    if words[-1] in ("path", "file", "dir"):
        return False  # where a secret is, not the secret
    return name.lower().replace("-", "_").endswith(_SECRET_ENDINGS) or any(
        w in _SECRET_WORDS or w.endswith("password") for w in words)


def _has_control(value: Any) -> bool:
    return any(isinstance(leaf, str) and _CONTROL.search(leaf) for _, leaf in _walk(value, ""))


def check_server_arg(error: Error, name: str, key: str, value: Any) -> None:
    """One pdnode_<role>_extra_args entry that names a ServerArgs field (``name.key``)."""
    table = argtable.load(argtable.SGLANG_TABLE)
    where = f"{name}.{key}"
    if _has_control(value):
        return  # the backstop reported it
    if is_secret_name(key):
        error("extra-arg-secret",
              where, "<hidden>", "holds a secret: it would be on the command line and in the rendered JSON",
              "remove it (the API key comes from pdnode_api_key_file)")
    elif key not in table:
        error("extra-arg-no-flag",
              where, value, "is a ServerArgs field without a command-line flag in SGLang 0.5.23 (the launcher "
              "cannot pass it)", f"remove it from {name}")
    else:
        problem = argtable.value_problem(table[key], value)
        if problem:
            error("extra-arg-value", where, value, problem, f"write a value {table[key]['flag']} accepts")


def check_load_format(error: Error, value: Any) -> None:
    entry = argtable.load(argtable.SGLANG_TABLE).get("load_format")
    if entry and isinstance(value, str):
        problem = argtable.value_problem(entry, value)
        if problem:
            error("load-format-value",
                  "pdnode_model_load_format", value, problem, "use e.g. auto, safetensors or dummy")


def check_router_arg(error: Error, key: Any, value: Any, package: str = "sglang-router") -> None:
    """One pdnode_router_extra_args entry the plan does not own, against PACKAGE's parser."""
    table = argtable.load(argtable.ROUTER_TABLES[package])
    where = f"pdnode_router_extra_args.{key}"
    if not isinstance(key, str):
        error("router-arg-name",
              where, value, "is not an argument name", "write the underscored name, e.g. retry_max_retries")
        return
    under = key.replace("-", "_")
    if _has_control(key) or _has_control(value):
        return  # the backstop reported it
    if is_secret_name(under):
        error("router-arg-secret",
              where, "<hidden>", "holds a secret: it would be in router.json and on the router's command line",
              "remove it (the API key comes from pdnode_api_key_file)")
    elif "-" in key:
        hint = f"write {under}" if under in table else "write the underscored name"
        error("router-arg-dashes",
              where, value, "is spelled with dashes; the plan takes sglang-router's underscored names", hint)
    elif key not in table:
        error("router-arg-unknown", where, value,
              f"is not an argument of {argtable.load_source(argtable.ROUTER_TABLES[package])}",
              "use a name from `" + ("smg launch" if package == "smg" else "python -m sglang_router.launch_router")
              + " --help` with underscores")
    else:
        problem = argtable.value_problem(table[key], value)
        if problem:
            error("router-arg-value", where, value, problem, f"write a value {table[key]['flag']} accepts")


# Role variables an inventory may set besides pdnode_* (the roles assert the same
# patterns in tasks/validate.yml at deploy time; checking them here too lets
# `pdnode check` refuse them before a deploy starts).
ROLE_PATTERNS = {
    "pd_services_limit_memlock": (re.compile(r"^([0-9]+[KMGT]?|infinity)\Z"),
                                  "must be a number with an optional K/M/G/T suffix or infinity (it is a unit line)",
                                  "use infinity (RDMA) or e.g. 8M"),
    "pd_services_limit_nofile": (re.compile(r"^([0-9]+|infinity)\Z"), "must be a whole number or infinity",
                                 "use e.g. 1048576"),
    "pd_services_ready_timeout_s": (re.compile(r"^[1-9][0-9]{0,6}\Z"), "must be a positive whole number of seconds",
                                    "use e.g. 1800"),
    "pd_services_watchdog_s": (re.compile(r"^[0-9]{1,6}\Z"), "must be a whole number of seconds (0: no watchdog)",
                               "use e.g. 60"),
    "rdma_memlock_limit": (re.compile(r"^([0-9]+|unlimited)\Z"), "must be unlimited or a number of KiB",
                           "use unlimited"),
}


def check_role_values(raw: dict[str, Any], error: Error) -> None:
    for name, (pattern, rule, fix) in ROLE_PATTERNS.items():
        if name in raw and (isinstance(raw[name], bool) or not pattern.match(str(raw[name]))):
            error("role-variable-pattern", name, raw[name], rule, fix)
