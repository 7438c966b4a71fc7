#!/usr/bin/python
"""Read, in one round trip, everything a role's no-change run needs to know about the host,
and name every way it differs from what the role would make it (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: node_state
short_description: Read the host state a role converges, in one call, and name where it differs
description:
  - A role's no-change run asks the host one question instead of one per file, package,
    unit and user. This module reads them all and returns RV(drift), one line per way the
    host differs from what was asked. The role runs its converge tasks (the real judges,
    the apt, user, copy and systemd modules) only when RV(drift) is not empty.
  - It changes nothing, in any mode. Files are compared by the SHA-256 of their content,
    mode, owner and group, as the copy module compares them; packages by dpkg's status,
    as the apt module does; units by C(systemctl is-enabled) and C(systemctl is-active).
  - O(read), O(find) and O(commands) only report (markers, directory listings, read-only
    probes); the caller decides what their answers mean.
  - tests/test_node_state.py compares each verdict with the module it stands in for
    (copy, file, group, user, apt, systemd_service in check mode) over generated cases.
options:
  files:
    description: Files as the role writes them.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      sha256:
        description:
          - SHA-256 (hex) of the full content. Left out for a file whose content is made on the
            host (a key); then only its presence, kind, mode, owner and group are judged, and
            its content is never read.
        type: str
      mode: {description: Octal mode as a string., type: str, required: true}
      owner: {description: Owner name., type: str, default: root}
      group: {description: Group name., type: str, default: root}
  directories:
    description: Directories as the role makes them.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      mode: {description: Octal mode as a string., type: str, required: true}
      owner: {description: Owner name., type: str, default: root}
      group: {description: Group name., type: str, default: root}
  packages:
    description: Debian packages that must be installed (dpkg status C(install ok installed)).
    type: list
    elements: str
    default: []
  units:
    description: systemd units and whether each must be enabled and active.
    type: list
    elements: dict
    default: []
    suboptions:
      name: {description: Unit name., type: str, required: true}
      enabled: {description: Must be enabled (C(systemctl is-enabled) says enabled)., type: bool, default: true}
      active: {description: Must be active., type: bool, default: true}
  groups:
    description: System groups that must exist.
    type: list
    elements: str
    default: []
  users:
    description: Users that must exist with these properties.
    type: list
    elements: dict
    default: []
    suboptions:
      name: {description: User name., type: str, required: true}
      group: {description: Primary group name., type: str}
      home: {description: Home directory., type: str}
      shell: {description: Login shell., type: str}
  http:
    description: URLs that must answer (on the host, without a proxy).
    type: list
    elements: dict
    default: []
    suboptions:
      url: {description: The URL., type: str, required: true}
      status: {description: The status code it must answer., type: int, default: 200}
      line: {description: A line the body must hold (whole line, exact)., type: str}
  read:
    description: Small files whose content is returned (RV(read); null when missing).
    type: list
    elements: path
    default: []
  exists:
    description:
      - Paths whose presence is returned (RV(present)); a link counts as present, dangling or
        not, as a directory listing would show it.
    type: list
    elements: path
    default: []
  find:
    description: Directories whose entries matching a regular expression are returned (RV(found)).
    type: dict
    default: {}
  commands:
    description:
      - Read-only commands (argument lists, no shell), each returned as rc, stdout and stderr
        in RV(commands) under its key. Optional C(stdin) per command; with C(json) true, also
        C(json), the JSON object its last line of output holds (null when none).
      - A command with a C(differs) label is a check. Its key is in RV(differs.commands), and a
        line naming the label and its output in RV(drift), when it exits non-zero or its last
        line's JSON object says C(needed) true.
    type: dict
    default: {}
"""

RETURN = r"""
drift: {description: One line per way the host differs (for people); empty when it is as asked., type: list, returned: always}
differs:
  description:
    - What differs, by kind (files, directories, groups, users, packages, not_enabled, not_active, http,
      commands), each the names (paths, units, ...) in the order asked; every kind is present, empty when nothing
      of it differs. What a role branches on; RV(drift) says how each differs.
  type: dict
  returned: always
read: {description: Path -> content (null when missing)., type: dict, returned: always}
present: {description: The paths of O(exists) that are present, in the order given., type: list, returned: always}
found: {description: Key -> sorted entry names matching its pattern., type: dict, returned: always}
commands: {description: Key -> rc, stdout, stderr., type: dict, returned: always}
units: {description: Unit -> its is-enabled and is-active answers., type: dict, returned: always}
"""

import grp
import hashlib
import json
import os
import pwd
import re
import stat
import subprocess
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

# RV(differs)'s keys: what differs, by kind, each a list of names (paths, units, users, ...)
DIFFER_KINDS = ("files", "directories", "groups", "users", "packages", "not_enabled", "not_active", "http",
                "commands")


def owner_drift(kind: str, path: str, st: os.stat_result, want: dict) -> list[str]:
    """Mode, owner and group of an existing path, as the file module judges them."""
    lines = []
    mode = stat.S_IMODE(st.st_mode)
    if mode != int(want["mode"], 8):
        lines.append(f"{kind} {path}: mode {mode:04o}, wants {want['mode']}")
    for field, lookup, ident in (("owner", pwd.getpwuid, st.st_uid), ("group", grp.getgrgid, st.st_gid)):
        try:
            name = lookup(ident)[0]
        except KeyError:
            name = str(ident)
        if name != want[field]:
            lines.append(f"{kind} {path}: {field} {name}, wants {want[field]}")
    return lines


def file_drift(want: dict) -> list[str]:
    path = want["path"]
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return [f"file {path}: missing"]
    if not stat.S_ISREG(st.st_mode):
        return [f"file {path}: not a regular file"]
    lines = []
    if want.get("sha256") is not None:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        lines = [] if digest.hexdigest() == want["sha256"] else [f"file {path}: content differs"]
    return lines + owner_drift("file", path, st, want)


def directory_drift(want: dict) -> list[str]:
    path = want["path"]
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return [f"directory {path}: missing"]
    if not stat.S_ISDIR(st.st_mode):
        return [f"directory {path}: not a directory"]
    return owner_drift("directory", path, st, want)


def package_drift(module: AnsibleModule, names: list[str]) -> list[tuple[str, str, str]]:
    if not names:
        return []
    # One dpkg-query for all; an unknown package is absent from stdout (and named on stderr).
    _, out, _ = module.run_command(["dpkg-query", "-W", "-f", "${Package}\t${Status}\n", *names])
    status = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    return [("packages", name, f"package {name}: {status.get(name) or 'not installed'}") for name in names
            if status.get(name) != "install ok installed"]


def unit_states(module: AnsibleModule, units: list[dict]) -> dict:
    if not units:
        return {}
    names = [u["name"] for u in units]
    answers = {}
    for query in ("is-enabled", "is-active"):
        # One answer line per unit, in order, whatever the exit code.
        _, out, _ = module.run_command(["systemctl", query, *names])
        lines = out.splitlines()
        answers[query] = lines + ["unknown"] * (len(names) - len(lines))
    return {name: {"enabled": answers["is-enabled"][i], "active": answers["is-active"][i]}
            for i, name in enumerate(names)}


def unit_drift(units: list[dict], states: dict) -> list[tuple[str, str, str]]:
    lines = []
    for unit in units:
        got = states[unit["name"]]
        if unit["enabled"] and got["enabled"] != "enabled":
            lines.append(("not_enabled", unit["name"], f"unit {unit['name']}: {got['enabled']}, wants enabled"))
        if unit["active"] and got["active"] != "active":
            lines.append(("not_active", unit["name"], f"unit {unit['name']}: {got['active']}, wants active"))
    return lines


def account_drift(groups: list[str], users: list[dict]) -> list[tuple[str, str, str]]:
    lines = []
    for name in groups:
        try:
            grp.getgrnam(name)
        except KeyError:
            lines.append(("groups", name, f"group {name}: missing"))
    for want in users:
        try:
            entry = pwd.getpwnam(want["name"])
        except KeyError:
            lines.append(("users", want["name"], f"user {want['name']}: missing"))
            continue
        try:
            group = grp.getgrgid(entry.pw_gid).gr_name
        except KeyError:
            group = str(entry.pw_gid)
        for field, got in (("group", group), ("home", entry.pw_dir), ("shell", entry.pw_shell)):
            if want.get(field) is not None and got != want[field]:
                lines.append(("users", want["name"], f"user {want['name']}: {field} {got}, wants {want[field]}"))
    return lines


def http_drift(checks: list[dict]) -> list[tuple[str, str, str]]:
    # Straight to the address (loopback): a proxy from the environment is not the service.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    lines = []
    for check in checks:
        url = check["url"]
        try:
            with opener.open(url, timeout=5) as answer:
                status, body = answer.status, answer.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            status, body = exc.code, ""
        except (OSError, ValueError) as exc:
            lines.append(("http", url, f"http {url}: {getattr(exc, 'reason', exc)}"))
            continue
        if status != check["status"]:
            lines.append(("http", url, f"http {url}: status {status}, wants {check['status']}"))
        elif check.get("line") is not None and check["line"] not in body.splitlines():
            lines.append(("http", url, f"http {url}: no line {check['line']!r}"))
    return lines


def read_files(paths: list[str]) -> dict:
    contents = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                contents[path] = handle.read()
        except (FileNotFoundError, NotADirectoryError):
            contents[path] = None
    return contents


def present_paths(paths: list[str]) -> list[str]:
    return [path for path in paths if os.path.lexists(path)]


def find_entries(module: AnsibleModule, queries: dict) -> dict:
    found = {}
    for key, query in queries.items():
        if not isinstance(query, dict) or set(query) != {"path", "pattern"}:
            module.fail_json(msg=f"find.{key} is {query!r}; fix: give it as {{path: DIR, pattern: REGEX}}")
        try:
            pattern = re.compile(query["pattern"])
        except re.error as exc:
            module.fail_json(msg=f"find.{key}.pattern is {query['pattern']!r}, not a regular expression ({exc})")
        try:
            names = os.listdir(query["path"])
        except (FileNotFoundError, NotADirectoryError):
            names = []
        found[key] = sorted(name for name in names if pattern.fullmatch(name))
    return found


def run_commands(module: AnsibleModule, commands: dict) -> dict:
    results = {}
    for key, command in commands.items():
        if not isinstance(command, dict) or not isinstance(command.get("argv"), list) or not command["argv"]:
            module.fail_json(msg=f"commands.{key} is {command!r}; fix: give it as {{argv: [PROGRAM, ARG, ...]}}")
        results[key] = run_command(command["argv"], command.get("stdin"))
        if command.get("json"):
            results[key]["json"] = last_json_line(results[key]["stdout"])
    return results


def command_drift(commands: dict, results: dict) -> list[tuple[str, str, str]]:
    """A command given a C(differs) label is a difference when it fails, or when the JSON
    object of its last line says C(needed): true; the line names the label and what it printed."""
    lines = []
    for key, command in commands.items():
        label, got = command.get("differs"), results[key]
        if not label:
            continue
        needed = bool((got.get("json") or {}).get("needed"))
        if got["rc"] != 0 or needed:
            said = [line for line in got["stdout"].splitlines() if line.strip()]
            if got.get("json") is not None:
                said = said[:-1]
            detail = "; ".join(said) or got["stderr"].strip() or f"exit {got['rc']}"
            lines.append(("commands", key, f"{label}: {detail}"))
    return lines


def last_json_line(stdout: str):
    """The JSON object a command printed as its last line (pdnode.node's programs end so), or
    None when there is none."""
    lines = stdout.splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def run_command(argv: list, stdin: str | None) -> dict:
    """rc, stdout and stderr of ARGV. Not module.run_command: it fails the whole module when
    the program exits before reading all its stdin (EPIPE), as a missing release python
    does under env (rc 127) on a fresh host in check mode; communicate() takes that as the
    program's answer. A program that cannot be started answers 127, as a shell would."""
    try:
        feed = {"stdin": subprocess.DEVNULL} if stdin is None else {"input": stdin.encode()}
        done = subprocess.run([str(a) for a in argv], capture_output=True, check=False, **feed)
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": f"{argv[0]}: {exc.strerror}"}
    return {"rc": done.returncode, "stdout": done.stdout.decode(errors="replace"),
            "stderr": done.stderr.decode(errors="replace")}


def main() -> None:
    owned = {"owner": {"type": "str", "default": "root"}, "group": {"type": "str", "default": "root"},
             "mode": {"type": "str", "required": True}, "path": {"type": "path", "required": True}}
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "default": [],
                      "options": {**owned, "sha256": {"type": "str"}}},
            "directories": {"type": "list", "elements": "dict", "default": [], "options": owned},
            "packages": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "dict", "default": [],
                      "options": {"name": {"type": "str", "required": True},
                                  "enabled": {"type": "bool", "default": True},
                                  "active": {"type": "bool", "default": True}}},
            "groups": {"type": "list", "elements": "str", "default": []},
            "users": {"type": "list", "elements": "dict", "default": [],
                      "options": {"name": {"type": "str", "required": True}, "group": {"type": "str"},
                                  "home": {"type": "str"}, "shell": {"type": "str"}}},
            "http": {"type": "list", "elements": "dict", "default": [],
                     "options": {"url": {"type": "str", "required": True},
                                 "status": {"type": "int", "default": 200}, "line": {"type": "str"}}},
            "read": {"type": "list", "elements": "path", "default": []},
            "exists": {"type": "list", "elements": "path", "default": []},
            "find": {"type": "dict", "default": {}},
            "commands": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    units = unit_states(module, p["units"])
    # (kind, name, line) per difference: RV(drift) has the lines, RV(differs) the names by kind
    found = [("files", want["path"], line) for want in p["files"] for line in file_drift(want)]
    found += [("directories", want["path"], line) for want in p["directories"] for line in directory_drift(want)]
    found += account_drift(p["groups"], p["users"])
    found += package_drift(module, p["packages"])
    found += unit_drift(p["units"], units)
    found += http_drift(p["http"])
    commands = run_commands(module, p["commands"])
    found += command_drift(p["commands"], commands)
    differs = {kind: [] for kind in DIFFER_KINDS}
    for kind, name, _ in found:
        if name not in differs[kind]:
            differs[kind].append(name)
    module.exit_json(changed=False, drift=[line for _, _, line in found], differs=differs, units=units,
                     read=read_files(p["read"]), present=present_paths(p["exists"]),
                     found=find_entries(module, p["find"]), commands=commands)


if __name__ == "__main__":
    main()
