"""Strict patterns for every inventory value that reaches a unit, an environment file,
a command line or a path on the host (called by pdnode.core.plan.build.build_plan).

The node description is written by people and copied between sites; the deploy runs as
root and templates its values into systemd units (where a newline starts a new
directive and '%' is a specifier), environment files, argv lists and chowned paths.
So every value is held to a pattern here, one problem line per bad value, before any
file is written. A generic backstop refuses control characters in any string anywhere
(keys too); the specific rules below allow only what a real value needs.
"""

from __future__ import annotations

import ipaddress
import json
import math
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import argtable, disagg, environment_types

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
# The deploy chowns the install root and the config dir to the service user, and root
# writes files into them (and into the roles' host directories): a system directory
# there would hand it to that user, or put files where the system runs or trusts them
# (/etc/cron.hourly, /etc/systemd/system, ~/.ssh). Refused: a path with fewer than two
# components, a directory that holds others' directories (SYSTEM_PARENTS), and anything
# in or below a system tree (SYSTEM_TREES, the /etc and /var/lib entries of the OS and
# of common services, a user's home and its dot-directories).
SYSTEM_TREES = frozenset({
    "/usr", "/root", "/boot", "/proc", "/sys", "/dev", "/run", "/tmp", "/bin", "/sbin",  # noqa: S108 - refused
    "/lib", "/lib32", "/lib64", "/libx32", "/lost+found", "/snap", "/var/spool", "/var/run", "/var/lock",
    "/var/tmp", "/var/log", "/var/cache", "/var/mail", "/var/backups", "/var/www", "/var/local",  # noqa: S108
    "/opt/local",
})
# Entries of /etc and /var/lib that belong to the OS or to a service (Debian 12 and
# Ubuntu base systems, the packages this bundle installs, common daemons).
_ETC_SYSTEM = frozenset("""
adduser.conf alternatives anacrontab apache2 apparmor apparmor.d apt audit bash.bashrc bash_completion.d binfmt.d
ca-certificates ca-certificates.conf chrony cloud console-setup containerd cron.d cron.daily cron.hourly
cron.monthly cron.weekly cron.yearly crontab cryptsetup-initramfs crypttab dbus-1 dcgm-exporter debconf.conf
debian_version default deluser.conf dhcp dnsmasq.d docker dpkg e2scrub.conf environment environment.d exports
fail2ban firewalld fonts fstab fuse.conf gai.conf gnupg grafana groff group gshadow gss host.conf hostname hosts
hosts.allow hosts.deny init init.d initramfs-tools inputrc iproute2 iptables issue issue.net kernel
kernel-img.conf kubernetes landscape ld.so.cache ld.so.conf ld.so.conf.d ld.so.preload libaudit.conf libibverbs.d
libnl-3 libvirt locale.alias locale.gen localtime logcheck login.defs logrotate.conf logrotate.d lsb-release lvm
machine-id mdadm mime.types mke2fs.conf modprobe.d modules modules-load.d motd mtab multipath multipath.conf
netconfig netplan network networkd-dispatcher NetworkManager nftables.conf nginx nsswitch.conf ntp.conf nvidia
opt os-release pam.conf pam.d passwd perl pki polkit-1 ppp profile profile.d prometheus python3 rc.local rc0.d
rc1.d rc2.d rc3.d rc4.d rc5.d rc6.d rcS.d rdma resolv.conf rmt rsyslog.conf rsyslog.d security selinux sensors.d
shadow shells skel ssh ssl subgid subuid sudo.conf sudo_logsrvd.conf sudoers sudoers.d sysctl.conf sysctl.d
sysconfig systemd terminfo timezone tmpfiles.d udev ufw update-motd.d vim X11 xattr.conf xdg
""".split())
_VAR_LIB_SYSTEM = frozenset("""
apt AccountsService aspell cloud containerd dbus dhcp docker dpkg grafana initramfs-tools kubelet landscape
logrotate misc NetworkManager nvidia pam polkit-1 private prometheus python shells.state snapd sudo systemd
ucf udisks2 update-notifier usbutils
""".split())
SYSTEM_PARENTS = frozenset({"/", "/etc", "/opt", "/srv", "/home", "/var", "/var/lib", "/var/opt", "/mnt",
                            "/media", "/data"})
_ETC_PATTERNS = re.compile(r"^(cron|rc|init|ld\.so|pam|sudo|ssh|ssl|systemd|security|apt|dpkg|X11|python)")


def system_directory(path: str) -> bool:
    """Whether a normalized absolute path is a system directory or lies in one."""
    parts = path.strip("/").split("/")
    if len(parts) < 2 or path in SYSTEM_PARENTS:
        return True
    if any(path == tree or path.startswith(tree + "/") for tree in SYSTEM_TREES):
        return True
    if parts[0] == "etc":
        return parts[1] in _ETC_SYSTEM or bool(_ETC_PATTERNS.match(parts[1]))
    if parts[:2] == ["var", "lib"]:
        return len(parts) < 3 or parts[2] in _VAR_LIB_SYSTEM
    if parts[0] == "home":
        return len(parts) < 3 or parts[2].startswith(".")  # a home itself, ~/.ssh, ~/.config, ...
    return False


PROMPT_MAX = 4000
ANSWER_MAX = 200
# Names of arguments that hold a secret: a secret on argv shows in `ps` and in the
# rendered JSON; it belongs in a file the launcher reads.
# ("token" alone also names token counts, e.g. max_total_tokens: only its secret forms.)
_SECRET_WORDS = frozenset({"key", "keys", "secret", "secrets", "password", "passwd", "credential", "credentials"})
_SECRET_ENDINGS = ("auth_token", "access_token", "bearer_token", "api_token", "hf_token")

# (rule id from pdnode.core.rules.catalogue, field, value, rule, fix): the plan checker's error()
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
    elif chowned and system_directory(value):
        error("path-not-system-dir",
              name, value, "is a system directory or lies in one (the deploy makes it owned by the "
              "service user and root writes files there)", "use a directory of its own, e.g. /opt/sglang-pd or "
              "/etc/sglang-pd")


def zone_id(value: str) -> bool:
    """Whether an address carries an IPv6 zone id ("fe80::1%eth0"). Python's ip_address
    accepts any text after '%' (spaces, quotes, ';', '$'); such a value once reached a
    unit's command line and ran a command as root (issue 17). No field takes one: it
    cannot be written in a URL as the plan writes them, nor in an nftables rule."""
    return "%" in value


def _host(error: Error, name: str, value: str) -> None:
    if zone_id(value):
        error("host-zone-id",
              name, value, "is an address with an IPv6 zone id ('%...'); no host field takes one (it cannot be "
              "written in a URL or a firewall rule, and text after '%' is not checked)",
              "write the address without '%...': a global or unique-local address (or a DNS name)")
        return
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
    for name in ("pdnode_router_host", "pdnode_router_metrics_host", "pdnode_worker_host", "pdnode_node_address"):
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


# Refused apart, whatever their value (disagg-environment-owned): one line per variable.
_DISAGG_OWNED = frozenset(variable for variable, _ in disagg.ENVIRONMENT.values())


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
        elif key not in _DISAGG_OWNED and (parse := environment_types.problem(key, value)) is not None:
            # every KV path: a value the library does not parse fails or is ignored wherever it is read
            error("environment-value-parses", name, value, *parse)


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


# Role variables an inventory may set besides pdnode_*. Each role asserts the same rules
# first, in tasks/validate.yml (inline patterns, mirrored here and compared by
# tests/test_role_values.py, or this table itself through the pdnode_role_value_problem
# filter); `pdnode check` applies them too, before a deploy starts. Values the playbooks
# pass from the plan are in the table as well: a role must hold its own values, however
# it is called.
_PY_RE = r"^((/[A-Za-z0-9._+-]+)+/)?python3(\.[0-9]{1,2})?\Z"
_DEB_RE = r"^[a-z0-9][a-z0-9.+-]*(=[A-Za-z0-9.+~:*-]+)?\Z"
_PIP_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}((==|>=|<=|~=|!=)[A-Za-z0-9.*+!]{1,64})?\Z"
_VERSION_RE = r"^[0-9]+(\.[0-9]+){1,3}((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?\Z"
# A controller path only Ansible reads (copy src, lookup): one line, not an option.
_CONTROLLER_RE = r"^([^\x00-\x1f\x7f-][^\x00-\x1f\x7f]{0,4095})?\Z"
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_LISTEN_RE = r"^([A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):" + _PORT + r"\Z"
_PY_RULE = ("must be python3 or python3.N, or an absolute path to one (it becomes pip's virtualenv_command, "
            "split into an argv and run as root)", "use python3 or e.g. /usr/bin/python3.12")
_DEB_RULE = ("must list Debian package names, optionally =version (apt installs them as root; an option there "
             "would change what apt does)", "write e.g. libibverbs1")
_HOST_DIR_RULE = ("must be an absolute, normalized host path of letters, digits and . _ - / (at most 200), not a "
                  "system directory nor in one (root creates it and writes files there)",
                  "use a directory of its own, e.g. under /opt/sglang-pd")
_CONTROLLER_RULE = ("must be empty or a controller path on one line, not starting with '-'",
                    "give the file or directory on the controller")


@dataclass(frozen=True)
class RoleRule:
    pattern: str  # every value (kind "one"), list item ("each") or mapping value ("values") matches it
    rule: str  # "must ...": what the message says after the variable's name
    fix: str
    kind: str = "one"  # one | each | values | host_dir (a host directory: the path rule + not a system one)


ROLE_RULES: dict[str, RoleRule] = {
    # pd_services: unit lines (LimitMEMLOCK=, LimitNOFILE=, TimeoutStartSec=, WatchdogSec=) and the gate's argv
    "pd_services_limit_memlock": RoleRule(r"^([0-9]+[KMGT]?|infinity)\Z", "must be a number with an optional "
                                          "K/M/G/T suffix or infinity (it is a unit line)", "use infinity (RDMA) or e.g. 8M"),
    "pd_services_limit_nofile": RoleRule(r"^([0-9]+|infinity)\Z", "must be a whole number or infinity", "use e.g. 1048576"),
    "pd_services_ready_timeout_s": RoleRule(r"^[1-9][0-9]{0,6}\Z", "must be a positive whole number of seconds",
                                            "use e.g. 1800"),
    "pd_services_watchdog_s": RoleRule(r"^[0-9]{1,6}\Z", "must be a whole number of seconds (0: no watchdog)",
                                       "use e.g. 60"),
    "pd_services_api_key_file": RoleRule(_CONTROLLER_RE, *_CONTROLLER_RULE),
    # rdma: a limits.d file PAM applies to every login
    "rdma_memlock_limit": RoleRule(r"^([0-9]+|unlimited)\Z", "must be unlimited or a number of KiB", "use unlimited"),
    "rdma_memlock_users": RoleRule(r"^(@?[a-z_][a-z0-9_-]{0,31}|\*)\Z", "must list user names or @groups (a-z or _ "
                                   "first, then a-z 0-9 _ -)", "use the service user, e.g. sglang", "each"),
    "rdma_limits_file": RoleRule(r"^/etc/security/limits\.d/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}\.conf\Z",
                                 "must be a .conf file directly in /etc/security/limits.d (root writes it; anywhere "
                                 "else it would replace a system file)",
                                 "use /etc/security/limits.d/90-pdnode-rdma-memlock.conf"),
    "rdma_packages": RoleRule(_DEB_RE, *_DEB_RULE, "each"),
    # sglang: the release virtualenv (pip and apt as root)
    "sglang_python": RoleRule(_PY_RE, *_PY_RULE),
    "sglang_sim_packages": RoleRule(_PIP_RE, "must list package names as pip spells them, optionally pinned "
                                    "(==, >=, <=, ~=, !=), none starting with '-' (pip runs as root)",
                                    "write e.g. aiohttp or prometheus-client==0.21.1", "each"),
    "sglang_sim_system_packages": RoleRule(_DEB_RE, *_DEB_RULE, "each"),
    "sglang_venv": RoleRule("", *_HOST_DIR_RULE, "host_dir"),
    "sglang_router_venv": RoleRule("", *_HOST_DIR_RULE, "host_dir"),
    "sglang_install_root": RoleRule("", *_HOST_DIR_RULE, "host_dir"),
    "sglang_version": RoleRule(_VERSION_RE, "must be a release number such as 0.5.23", "write the release as the "
                               "package index lists it"),
    "sglang_mooncake_version": RoleRule(_VERSION_RE, "must be a release number such as 0.3.13.post1",
                                        "write the release as the package index lists it"),
    "sglang_router_requirement": RoleRule(r"^(sglang-router|smg)==[0-9]+(\.[0-9]+){1,3}((a|b|rc)[0-9]+)?"
                                          r"(\.post[0-9]+)?(\.dev[0-9]+)?\Z",
                                          "must be sglang-router==VERSION or smg==VERSION", "write e.g. "
                                          "sglang-router==0.3.2 (the plan's install.router_requirement)"),
    "sglang_wheelhouse": RoleRule(_CONTROLLER_RE, *_CONTROLLER_RULE),
    # mooncake: the same virtualenv, an offline wheelhouse copied to the host
    "mooncake_python": RoleRule(_PY_RE, *_PY_RULE),
    "mooncake_stack_cuda": RoleRule(r"^([1-9][0-9])?\Z", "must be empty or a CUDA major version such as 13",
                                    "leave it empty to follow the driver"),
    "mooncake_versions": RoleRule(_VERSION_RE, "must map each build to a release number such as 0.3.13.post1",
                                  "write the releases as the package index lists them", "values"),
    "mooncake_venv": RoleRule("", *_HOST_DIR_RULE, "host_dir"),
    "mooncake_wheelhouse_dest": RoleRule("", *_HOST_DIR_RULE, "host_dir"),
    "mooncake_system_packages": RoleRule(_DEB_RE, *_DEB_RULE, "each"),
    "mooncake_wheelhouse": RoleRule(_CONTROLLER_RE, *_CONTROLLER_RULE),
    # wheelhouse: the controller's archive unpacked by root into a host directory
    "wheelhouse_src": RoleRule(_CONTROLLER_RE, *_CONTROLLER_RULE),
    "wheelhouse_dest": RoleRule("", *_HOST_DIR_RULE, "host_dir"),
    # nvidia_driver: the deb822 repository file and apt's package list
    "nvidia_driver_version": RoleRule(r"^([0-9]{3,4}(\.[0-9]{1,3}){1,2})?\Z", "must be empty or a driver version "
                                      "such as 580.159.04", "copy it from the repository's package list"),
    "nvidia_driver_repo_base_url": RoleRule(r"^(https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|file://)(/[A-Za-z0-9._~+-]+)*/?\Z",
                                            "must be an http(s) or file URL of letters, digits and . _ ~ + - /",
                                            "give the mirror's base URL"),
    "nvidia_driver_repo_key_name": RoleRule(r"^[A-Za-z0-9._-]+\Z", "must be a file name of letters, digits and . _ -",
                                            "use e.g. the default key name"),
    "nvidia_driver_repo_key_file": RoleRule(_CONTROLLER_RE, *_CONTROLLER_RULE),
    "nvidia_driver_extra_packages": RoleRule(_DEB_RE, *_DEB_RULE, "each"),
    # monitoring: /etc/default files, a unit's command line, prometheus.yml
    **{f"monitoring_{n}_listen_address": RoleRule(_LISTEN_RE, "must be HOST:PORT (IPv4, bracketed IPv6 or a name; "
                                                  "port 1-65535)", "write e.g. 127.0.0.1:9090")
       for n in ("prometheus", "node_exporter", "dcgm_exporter")},
    "monitoring_scrape_interval": RoleRule(r"^[1-9][0-9]{0,4}(ms|s|m|h)\Z", "must be a duration such as 15s",
                                           "write e.g. 15s"),
    "monitoring_retention_time": RoleRule(r"^[1-9][0-9]{0,5}(h|d|w|y)\Z", "must be a duration such as 15d",
                                          "write e.g. 15d"),
    "monitoring_dcgm_cuda_major": RoleRule(r"^1[1-9]\Z", "must be the driver's CUDA major version, 11-19",
                                           "read \"CUDA Version\" in nvidia-smi"),
    "monitoring_grafana_url": RoleRule(r"^(https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~-]+)*/?)?\Z",
                                       "must be empty or an http(s) URL of plain characters",
                                       "give Grafana's base URL, or leave it empty"),
    "monitoring_grafana_token_file": RoleRule(_CONTROLLER_RE, *_CONTROLLER_RULE),
}
# Hardening a role variable can turn off: `pdnode check` and the verifier's services
# check warn (the deploy goes on: some test containers cannot apply it).
HARDENING_SWITCHES = {
    "pd_services_device_policy": ("turns off the engines' device restriction (DevicePolicy=closed with only the "
                                  "NVIDIA and RDMA device classes): prefill and decode may open every device node "
                                  "of the host", "leave it true (the default); false only where the cgroup device "
                                  "controller is not delegated, as in test containers"),
}
_FALSE = ("false", "no", "off", "0", "n", "f")
_TRUE = ("true", "yes", "on", "1", "y", "t")


def _role_item_problem(name: str, rule: RoleRule, value: Any) -> bool:
    """Whether one value (a scalar, a list item or a mapping value) breaks the rule."""
    if isinstance(value, (dict, list, bool)) or value is None or _has_control(value):
        return True
    text = str(value)
    if rule.kind == "host_dir":
        return (not HOST_PATH_RE.match(text) or len(text) > HOST_PATH_MAX or posixpath.normpath(text) != text
                or system_directory(text))
    return re.match(rule.pattern, text) is None


def _role_problems(name: str, value: Any) -> list[tuple[str, Any]]:
    """(field, value) of each part of role variable NAME that breaks its rule."""
    rule = ROLE_RULES[name]
    if rule.kind == "each":
        if not isinstance(value, list):
            return [(name, value)]
        return [(f"{name}[{i}]", item) for i, item in enumerate(value) if _role_item_problem(name, rule, item)]
    if rule.kind == "values":
        if not isinstance(value, dict):
            return [(name, value)]
        return [(f"{name}.{k}", item) for k, item in value.items() if _role_item_problem(name, rule, item)]
    return [(name, value)] if _role_item_problem(name, rule, value) else []


def role_value_problem(name: str, value: Any) -> str | None:
    """None when role variable NAME may hold VALUE, else one line as the roles' asserts
    print it: "NAME must ... (got VALUE); fix: ..." (the first bad part only)."""
    if name not in ROLE_RULES:
        return f"{name} is not a role variable pdnode.core.rules.values.ROLE_RULES knows; fix: add its rule there"
    bad = _role_problems(name, value)
    if not bad:
        return None
    field, got = bad[0]
    where = "" if field == name else f" in {field}"
    rule = ROLE_RULES[name]
    return f"{name} {rule.rule} (got {json.dumps(got, default=str)}{where}); fix: {rule.fix}"


def role_value_problems(named: dict[str, Any]) -> list[str]:
    """One line per role variable of NAMED (name -> value) that breaks its rule, in the
    order given (role_value_problem's line); empty when every value keeps its rule."""
    return [line for name, value in named.items() if (line := role_value_problem(name, value))]


def check_role_values(raw: dict[str, Any], error: Error, warn: Error | None = None) -> None:
    """The role variables an inventory sets: patterns (one line per bad part), and a
    warning for each hardening switch turned off."""
    for name in ROLE_RULES:
        if name in raw:
            rule = ROLE_RULES[name]
            for field, got in _role_problems(name, raw[name]):
                error("role-variable-pattern", field, got, rule.rule, rule.fix)
    for name, (what, fix) in HARDENING_SWITCHES.items():
        if name not in raw:
            continue
        value = raw[name]
        text = str(value).strip().lower()
        if value is True or (not isinstance(value, (dict, list)) and text in _TRUE):
            continue
        if value is False or (not isinstance(value, (dict, list)) and text in _FALSE):
            if warn is not None:
                warn("hardening-off", name, value, what, fix)
        else:
            error("role-variable-pattern", name, value, "must be true or false", "leave it true (the default)")
