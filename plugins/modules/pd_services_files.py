#!/usr/bin/python
"""Write a set of small files all-or-nothing in one round trip, and say which services
do not run what is on disk (check and diff mode aware)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_services_files
short_description: Replace several small files all-or-nothing and find services that run stale files
description:
  - Writes every file whose content, mode, owner or group differs to a temporary file beside
    it, runs every validator, and only when all of them passed renames the candidates into
    place. A failed validation removes every candidate and changes nothing.
  - Validators are argument lists run without a shell; no value can reach a shell. They
    run with every candidate unit, under its real name, first in E(SYSTEMD_UNIT_PATH), so
    units that refer to each other are checked as they will be installed.
  - Renames go data files first, units last (in the order given), and systemd reads units
    only on a daemon-reload, which the caller runs after this module. A run killed between
    two renames leaves valid files whose services' digests differ from what they were
    started with, so the next run finishes the writes and restarts them.
  - O(secrets) (keys) belong to the same all-or-nothing set, validated with the rest and
    renamed in with the data files. Their content (O(secret_contents)) is a no_log option,
    never in the diff, the result or the host's log.
  - O(disable) units are disabled only after every validator passed and the files are in
    place, before O(remove) takes their files away.
  - Per service (role), the digest of every file it reads (the files here plus O(inputs))
    is compared with the digest recorded when that service was last (re)started
    (O(applied_dir)); a mismatch lists the role in RV(restart_roles) even when nothing was
    written in this run (for example after a deploy was interrupted before its restart).
  - A record with another mode or owner than the module gives it (0600, owned by the
    module's user, root on a host) is given them back, and listed in RV(changed_paths).
  - With O(record), writes nothing but the records (the digests of the given roles as they
    are on disk now); call it after those services restarted.
  - One module call instead of one per file keeps a no-change run of the deploy fast.
options:
  files:
    description: The files.
    type: list
    elements: dict
    required: true
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      content: {description: Full content., type: str, required: true}
      mode: {description: Octal mode as a string., type: str, required: true}
      owner: {description: Owner name., type: str, default: root}
      group: {description: Group name., type: str, default: root}
      validate:
        description:
          - Command run on the candidate before anything is installed, as an argument list
            (no shell); an element C(%s) is replaced by the candidate's path.
        type: list
        elements: str
      secret:
        description:
          - The diff shows that the file changed, never its content. (The module still logs
            its arguments on the host, so pass secrets through a task with no_log as well.)
        type: bool
        default: false
      roles:
        description: Services that read this file (a change means they must restart).
        type: list
        elements: str
        default: []
      unit:
        description: A systemd unit file (a change, or systemd's NeedDaemonReload, asks for a daemon-reload).
        type: bool
        default: false
      digest:
        description:
          - What counts in its readers' digests instead of O(files[].content), when part of the
            content reaches the running service another way (the router's worker list, through
            its admin API). The file is written with its full content all the same.
        type: str
      converged:
        description:
          - Its content once the handlers have run (the layout record, whose O(files[].content)
            names the layout its change starts from until the change's steps are done). While
            the file's content is not this one the call reports a change (RV(unfinished)), so
            that the handlers run again after an interrupted run; the call with O(record)
            writes it.
        type: str
  secrets:
    description:
      - Files that hold a secret (the API key), written like O(files) with O(files[].secret);
        entry i holds O(secret_contents)[i].
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      mode: {description: Octal mode as a string., type: str, required: true}
      owner: {description: Owner name., type: str, default: root}
      group: {description: Group name., type: str, default: root}
      validate: {description: "As O(files[].validate).", type: list, elements: str}
      roles: {description: Services that read this file., type: list, elements: str, default: []}
  secret_contents:
    description:
      - The contents of O(secrets), in their order. A top-level no_log option, so that
        Ansible masks each in the invocation, the host's log and the result (a nested
        option is logged by its repr, where an escaped key no longer matches).
    type: list
    elements: str
    default: []
    no_log: true
  disable:
    description:
      - Units to C(systemctl disable) after every validator passed and the writes are done,
        before O(remove) (a unit's file must still be there to be disabled). Not in check mode.
    type: list
    elements: str
    default: []
  inputs:
    description:
      - Files the services read that other tasks install (keys, the release's markers);
        they count in the services' digests, and are never read into the result.
      - An input that this call also writes (O(files), O(secrets)) counts once, as written.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path or glob pattern., type: str, required: true}
      roles: {description: Services that read it., type: list, elements: str, required: true}
  applied_dir:
    description: Root-only directory of the records C(<role>.sha256); without it no role is found stale.
    type: path
  record:
    description:
      - Record these roles' current digests (after they restarted), write each file's
        O(files[].converged) content where it differs, and write nothing else.
    type: list
    elements: str
  remove:
    description:
      - Files of services the plan no longer has (their units already stopped), removed
        after the writes; a unit file or drop-in among them asks for a daemon-reload.
      - Each must be absolute and may not be one of O(files).
    type: list
    elements: path
    default: []
  orphans:
    description:
      - The rule that names what the plan no longer has, the C(orphans) of
        pdnode.core.plan.roles.pd_services. Unit files in C(unit_dir) matching C(own_pattern)
        that are not in C(keep) are disabled and removed with their drop-ins,
        C(<config_dir>/<id>.json), C(<id>.env) and record C(<applied_dir>/<id>.sha256), the
        id being the unit's name without C(<prefix>-) and C(.service). A coupling drop-in of
        a unit found there that O(files) no longer lists is removed.
      - Engine units systemd still runs (C(engine_pattern), not in C(keep)) whose files are
        gone are named in RV(orphans) too, for the caller to stop.
      - Added to O(disable) and O(remove). C(deferred) names the units a layout change stops
        in its order (RV(restart)'s C(steps)), so they are not in RV(orphans)'s C(stop).
    type: dict
  restart:
    description:
      - The restart rule, the C(restart) of pdnode.core.plan.roles.pd_services. C(engines) in start
        order, C(prefills), C(bound) (decodes bound to the node's one prefill) and C(router)
        (the router runs here), and C(change), this host's steps of a layout change in their
        order (C(kind) start, stop or restart, C(id)). RV(restart) answers it, with
        O(release_changed) and O(router_venv_changed).
    type: dict
  release_changed:
    description: A new release is installed (the sglang role says so), so every engine restarts.
    type: bool
    default: false
  router_venv_changed:
    description: The router's venv changed (another router package or bundle), so the router restarts.
    type: bool
    default: false
author: pdnode
"""

EXAMPLES = r"""
- name: Write the service files
  pdnode.sglang_pd.pd_services_files:
    files:
      - {path: /etc/app/app.json, content: "{}", mode: "0640", group: app, roles: [app]}
      - path: /etc/systemd/system/app.service
        content: "{{ lookup('ansible.builtin.template', 'app.service.j2') }}"
        mode: "0644"
        unit: true
        roles: [app]
        validate: [/usr/bin/python3, -m, pdnode.node.unitcheck, "%s", app.service]
    applied_dir: /var/lib/pdnode/applied/app
  register: written

- name: Record what the restarted services run
  pdnode.sglang_pd.pd_services_files:
    files: []
    inputs: [{path: /etc/app/app.json, roles: [app]}]
    applied_dir: /var/lib/pdnode/applied/app
    record: [app]
"""

RETURN = r"""
changed_paths:
  description: Paths written (or that would be written in check mode).
  type: list
  elements: str
  returned: always
restart_roles:
  description:
    - Roles whose files (as written, or as they would be written in check mode) differ
      from the ones recorded when the service last started; restart them, then O(record).
  type: list
  elements: str
  returned: always
daemon_reload:
  description: A unit file changed, or systemd still has an older version of one loaded.
  type: bool
  returned: always
recorded:
  description: Roles whose records were written (O(record)).
  type: list
  elements: str
  returned: always
disabled:
  description: Units of O(disable) that systemctl disabled in this run.
  type: list
  elements: str
  returned: always
orphans:
  description:
    - With O(orphans), what the plan no longer has. C(units), whose files were found, disabled
      and removed; C(running), engine units systemd runs that the plan does not; C(stop), both,
      to stop; C(any), whether there is one.
  type: dict
  returned: always
unfinished:
  description:
    - Files whose content is not yet their O(files[].converged) one (a layout change whose
      steps have not all run); the call then reports a change.
  type: list
  elements: str
  returned: always
restart:
  description:
    - With O(restart), what to restart, in order. C(engines), each to drain and restart in turn
      (a decode bound to a restarting prefill restarts with it); C(steps), the same in the
      layout change's order with its stops (C(kind) stop or restart, C(id)); C(router), whether
      the router restarts; C(record), every service that restarts, to O(record) afterwards.
  type: dict
  returned: always
"""

import glob
import grp
import hashlib
import os
import pwd
import re
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

TMP_PREFIX = ".pdnode-"
TMP_SUFFIX = ".tmp"
# mkstemp's names only: a leftover of a killed run, never anything else in /etc.
TMP_RE = re.compile(r"^\.pdnode-[A-Za-z0-9_]{8}\.tmp$")
# The records: the module's user's alone (root:root on a host: pdnode.core.plan.managed lists
# them with this mode and owners), as _write_records makes them.
RECORD_MODE = 0o600
SECRET_DIFF = "(secret: content not shown)\n"  # noqa: S105 - a placeholder, not a password
NO_RESTART = {"engines": [], "steps": [], "router": False, "record": []}


def _current(path):
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            return fh.read(), st
    except FileNotFoundError:
        return None, None


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _one_line(text, limit=2000):
    line = " | ".join(part.strip() for part in (text or "").strip().splitlines() if part.strip())
    return line if len(line) <= limit else line[:limit] + "..."


def _digests(sources, roles):
    """role -> sha256 over (path, sha256 of content or 'absent') of every file it reads.

    sources: (path, roles, content-or-None) in any order. Only digests leave this function,
    never content (some inputs are keys).
    """
    per_role = {role: [] for role in roles}
    for path, readers, content in sources:
        token = hashlib.sha256(content).hexdigest() if content is not None else "absent"
        for role in readers:
            per_role.setdefault(role, []).append(f"{path}\0{token}\n")
    return {role: hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()
            for role, lines in per_role.items()}


def _counted(spec, content):
    """What a file counts for in its readers' digests: its content, or its spec's digest
    (then the content's other part reaches the service without a restart)."""
    if content is not None and spec.get("digest") is not None:
        return spec["digest"].encode()
    return content


def _input_sources(inputs, written=frozenset()):
    """(path, roles, content) of the inputs; a path in WRITTEN counts as written, not here."""
    out = []
    for spec in inputs:
        if spec["path"] in written:
            continue
        paths = sorted(glob.glob(spec["path"])) if glob.has_magic(spec["path"]) else [spec["path"]]
        if not paths:
            out.append((spec["path"], spec["roles"], None))
        for path in paths:
            out.append((path, spec["roles"], _read(path)))
    return out


def _record_path(applied_dir, role):
    return os.path.join(applied_dir, f"{role}.sha256")


def _applied(applied_dir, role):
    raw = _read(_record_path(applied_dir, role))
    return raw.decode(errors="replace").strip() if raw is not None else None


def _records_to_fix(applied_dir, roles):
    """The records whose mode or owners are not the ones _write_records gives them (a
    record's content is judged by the restart decision: one that differs restarts its
    service, which records it again)."""
    out = []
    for role in roles:
        path = _record_path(applied_dir, role)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        want = (RECORD_MODE, os.geteuid(), os.getegid())
        if stat.S_ISREG(st.st_mode) and (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) != want:
            out.append(path)
    return out


def _fix_record(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, RECORD_MODE)
    finally:
        os.close(fd)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_records(applied_dir, digests):
    os.makedirs(applied_dir, mode=0o700, exist_ok=True)
    for role, digest in digests.items():
        fd, tmp = tempfile.mkstemp(dir=applied_dir, prefix=TMP_PREFIX, suffix=TMP_SUFFIX)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(digest + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, RECORD_MODE)
            os.replace(tmp, _record_path(applied_dir, role))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    _fsync_dir(applied_dir)


def _is_drop_in(path):
    return os.path.dirname(path).endswith(".d")


def _needs_daemon_reload(module, units):
    """systemd's own view: a unit file on disk newer than the loaded one (a run killed
    between the write and the daemon-reload leaves exactly that)."""
    if not units:
        return False
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return False
    rc, out, _ = module.run_command([systemctl, "show", "--property=NeedDaemonReload", "--value", *units],
                                    expand_user_and_vars=False)
    return rc == 0 and "yes" in out.split()


def _remove_leftovers(dirs):
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if TMP_RE.match(name):
                try:
                    os.unlink(os.path.join(d, name))
                except OSError:
                    pass


def _disable(module, units):
    """systemctl disable UNITS (argv, no shell); the units it removed links of."""
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, _, err = module.run_command([systemctl, "disable", *units], expand_user_and_vars=False)
    if rc != 0:
        module.fail_json(msg=f"systemctl disable {' '.join(units)} failed (the files were written, none removed): "
                             f"{_one_line(err) or f'exit {rc}'}")
    return [u for u in units if u in err] if "Removed" in err else []


def _list_units(module, prefix):
    """The engine units systemd has loaded, active or not (a unit whose file is gone still
    runs until stopped): name -> its ACTIVE column."""
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return {}
    rc, out, _ = module.run_command([systemctl, "list-units", "--all", "--plain", "--no-legend", "--type=service",
                                     f"{prefix}-prefill*", f"{prefix}-decode*"], expand_user_and_vars=False)
    return {fields[0]: fields[2] for fields in (line.split() for line in out.splitlines()) if len(fields) >= 3}


def orphans(rule, planned_paths, unit_files, loaded):
    """What the plan no longer has (RULE: the orphans option; UNIT_FILES: the names in its
    unit_dir; LOADED: unit -> ACTIVE, as systemctl lists them): the units to disable and the
    files to remove."""
    own = re.compile(rule["own_pattern"])
    engine = re.compile(rule["engine_pattern"])
    keep = set(rule["keep"])
    found = sorted(name for name in unit_files if own.fullmatch(name))
    units = [name for name in found if name not in keep]
    # Units a layout change stops in its order (the restart rule's change) stop there, not here.
    deferred = set(rule.get("deferred") or [])
    running = [name for name, active in loaded.items()
               if active == "active" and engine.fullmatch(name) and name not in keep and name not in deferred]
    unit_dir, prefix = rule["unit_dir"], rule["prefix"] + "-"
    remove = [os.path.join(unit_dir, name) for name in units]
    for kind, base in (("json", rule["config_dir"]), ("env", rule["config_dir"]), ("sha256", rule["applied_dir"])):
        remove += [os.path.join(base, f"{_orphan_id(name, prefix)}.{kind}") for name in units]
    dropins = [os.path.join(unit_dir, name + ".d", "10-coupling.conf") for name in found]
    remove += [path for path in dropins if path not in planned_paths and os.path.lexists(path)]
    stop = [name for name in dict.fromkeys(units + running) if name not in deferred]
    return {"units": units, "running": running, "stop": stop, "any": bool(stop)}, remove


def _orphan_id(unit, prefix):
    name = unit[len(prefix):] if unit.startswith(prefix) else unit
    return name[:-len(".service")] if name.endswith(".service") else name


def restart_plan(rule, stale, release_changed=False, router_venv_changed=False):
    """Which services restart (RULE: the restart option; STALE: services whose files differ
    from what they started with), in order: every engine after a new release, else the
    stale ones; a decode bound to the node's one prefill restarts with it (BindsTo=), not
    twice; the router after a new venv of its own or when stale."""
    engines = list(rule["engines"]) if release_changed else [e for e in rule["engines"] if e in stale]
    with_prefill = any(e in rule["prefills"] for e in engines)
    router = bool(rule["router"]) and (router_venv_changed or "router" in stale)
    drained = [e for e in engines if not (with_prefill and e in rule["bound"])]
    record = list(dict.fromkeys(engines + (list(rule["bound"]) if with_prefill else []) + (["router"] if router else [])))
    # In the layout change's order (pdnode.core.change.layout_change, this host's steps): its
    # stops, and its starts and restarts of the instances that restart; then the others.
    steps, done = [], set()
    for step in rule.get("change") or []:
        if step["kind"] == "stop":
            steps.append({"kind": "stop", "id": step["id"]})
        elif step["id"] in drained and step["id"] not in done:
            steps.append({"kind": "restart", "id": step["id"]})
            done.add(step["id"])
    steps += [{"kind": "restart", "id": e} for e in drained if e not in done]
    return {"engines": [s["id"] for s in steps if s["kind"] == "restart"], "steps": steps, "router": router,
            "record": record}


def _write_converged(module, spec):
    """Replace SPEC's file by its converged content, atomically, with its mode and owners."""
    path = spec["path"]
    try:
        uid, gid = pwd.getpwnam(spec["owner"]).pw_uid, grp.getgrnam(spec["group"]).gr_gid
    except KeyError as exc:
        module.fail_json(msg=f"{path}: unknown owner or group ({exc})")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=TMP_PREFIX, suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(spec["converged"].encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.chown(tmp, uid, gid)
        os.chmod(tmp, int(spec["mode"], 8))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(os.path.dirname(path))


def _validate(module, staged, unit_dir):
    """Run every validator (argv, no shell); one line per failure, naming the file."""
    failures = []
    # Units that refer to each other (BindsTo=, Wants=) are checked as they will be
    # installed: every candidate unit, under its real name, comes first in systemd's
    # search path (the trailing ":" keeps the default paths after it).
    env = {"SYSTEMD_UNIT_PATH": unit_dir + ":"} if unit_dir else None
    for item in staged:
        argv = item["spec"].get("validate")
        if not argv:
            continue
        # Only an element that is exactly %s: a path that happens to contain %s stays as is.
        cmd = [item["tmp"] if arg == "%s" else arg for arg in argv]
        try:
            # No shell and no $VAR/~ expansion: a value in a path stays a literal argument.
            rc, out, err = module.run_command(cmd, expand_user_and_vars=False, handle_exceptions=False,
                                              environ_update=env)
        except OSError as exc:
            rc, out, err = 127, "", f"cannot run {argv[0]}: {exc.strerror or exc}"
        if rc != 0:
            detail = _one_line(err) or _one_line(out) or f"exit {rc}"
            failures.append(f"{item['path']}: {detail}")
    return failures


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True, "options": {
                "path": {"type": "path", "required": True},
                "content": {"type": "str", "required": True},
                "mode": {"type": "str", "required": True},
                "owner": {"type": "str", "default": "root"},
                "group": {"type": "str", "default": "root"},
                "validate": {"type": "list", "elements": "str"},
                "secret": {"type": "bool", "default": False},
                "roles": {"type": "list", "elements": "str", "default": []},
                "unit": {"type": "bool", "default": False},
                "digest": {"type": "str"},
                "converged": {"type": "str"},
            }},
            "secrets": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "mode": {"type": "str", "required": True},
                "owner": {"type": "str", "default": "root"},
                "group": {"type": "str", "default": "root"},
                "validate": {"type": "list", "elements": "str"},
                "roles": {"type": "list", "elements": "str", "default": []},
            }},
            # A top-level no_log option: Ansible logs a nested option's value by its repr, where
            # a key's newline, backslash or quote no longer matches the value it masks.
            "secret_contents": {"type": "list", "elements": "str", "default": [], "no_log": True},
            "disable": {"type": "list", "elements": "str", "default": []},
            "inputs": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "str", "required": True},
                "roles": {"type": "list", "elements": "str", "required": True},
            }},
            "applied_dir": {"type": "path"},
            "record": {"type": "list", "elements": "str"},
            "remove": {"type": "list", "elements": "path", "default": []},
            "orphans": {"type": "dict", "options": {
                "unit_dir": {"type": "path", "required": True},
                "prefix": {"type": "str", "required": True},
                "config_dir": {"type": "path", "required": True},
                "applied_dir": {"type": "path", "required": True},
                "own_pattern": {"type": "str", "required": True},
                "engine_pattern": {"type": "str", "required": True},
                "keep": {"type": "list", "elements": "str", "required": True},
                "deferred": {"type": "list", "elements": "str", "default": []},
            }},
            "restart": {"type": "dict", "options": {
                "engines": {"type": "list", "elements": "str", "required": True},
                "prefills": {"type": "list", "elements": "str", "required": True},
                "bound": {"type": "list", "elements": "str", "required": True},
                "router": {"type": "bool", "required": True},
                "change": {"type": "list", "elements": "dict", "default": [], "options": {
                    "kind": {"type": "str", "required": True, "choices": ["start", "stop", "restart"]},
                    "id": {"type": "str", "required": True},
                }},
            }},
            "release_changed": {"type": "bool", "default": False},
            "router_venv_changed": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if len(p["secret_contents"]) != len(p["secrets"]):
        module.fail_json(msg=f"secrets: {len(p['secrets'])} files but {len(p['secret_contents'])} secret_contents")
    # The keys go with the other files: validated together, renamed in together.
    specs = p["files"] + [{**spec, "content": content, "secret": True, "unit": False}
                          for spec, content in zip(p["secrets"], p["secret_contents"])]
    listed = {spec["path"] for spec in specs}
    gone = {"units": [], "running": [], "stop": [], "any": False}
    if p["orphans"] is not None and p["record"] is None:
        rule = p["orphans"]
        try:
            unit_files = os.listdir(rule["unit_dir"])
        except (FileNotFoundError, NotADirectoryError):
            unit_files = []
        gone, remove = orphans(rule, listed, unit_files, _list_units(module, rule["prefix"]))
        p["disable"] = list(dict.fromkeys(p["disable"] + gone["units"]))
        p["remove"] = list(dict.fromkeys(p["remove"] + remove))
    bad = [path for path in p["remove"] if not os.path.isabs(path) or path in listed]
    if bad:
        module.fail_json(msg=f"remove: paths must be absolute and not among the files written: {bad}")
    for spec in specs:
        if spec["secret"]:
            module.no_log_values.update({spec["content"], spec["content"].rstrip("\r\n")} - {""})
    roles = sorted({r for spec in specs for r in spec["roles"]} | {r for spec in p["inputs"] for r in spec["roles"]})

    if p["record"] is not None:
        if not p["applied_dir"]:
            module.fail_json(msg="record needs applied_dir")
        unknown = sorted(set(p["record"]) - set(roles))
        if unknown:
            module.fail_json(msg=f"record: unknown roles {unknown} (known: {roles})")
        finished = [s for s in specs if s.get("converged") is not None and _read(s["path"]) != s["converged"].encode()]
        if module.check_mode or not (p["record"] or finished):
            module.exit_json(changed=False, changed_paths=[], restart_roles=[], daemon_reload=False, recorded=[],
                             disabled=[], orphans=gone, restart=NO_RESTART, unfinished=[])
        if p["record"]:
            sources = [(s["path"], s["roles"], _counted(s, _read(s["path"]))) for s in specs] \
                + _input_sources(p["inputs"], listed)
            digests = _digests(sources, roles)
            _write_records(p["applied_dir"], {r: digests[r] for r in p["record"]})
        # Last, once the restarts are recorded: the change's steps are done.
        for spec in finished:
            _write_converged(module, spec)
        module.exit_json(changed=True, changed_paths=[s["path"] for s in finished], restart_roles=[],
                         daemon_reload=False, recorded=sorted(p["record"]), disabled=[], orphans=gone,
                         restart=NO_RESTART, unfinished=[])

    plan, diffs = [], []
    for spec in specs:
        path, want = spec["path"], spec["content"].encode()
        mode = int(spec["mode"], 8)
        try:
            uid, gid = pwd.getpwnam(spec["owner"]).pw_uid, grp.getgrnam(spec["group"]).gr_gid
        except KeyError as exc:
            if not module.check_mode:
                module.fail_json(msg=f"{path}: unknown owner or group ({exc})")
            uid = gid = -1  # in check mode the user may not exist yet
        have, st = _current(path)
        same = have == want and st is not None and (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (mode, uid, gid)
        plan.append({"spec": spec, "path": path, "want": want, "mode": mode, "uid": uid, "gid": gid,
                     "write": not same})
        if not same and have != want:
            if spec["secret"]:
                before, after = (SECRET_DIFF if have is not None else ""), SECRET_DIFF
            else:
                before, after = (have or b"").decode(errors="replace"), spec["content"]
            diffs.append({"before_header": path, "after_header": path, "before": before, "after": after})
    writes = [item for item in plan if item["write"]]

    if not module.check_mode and writes:
        _remove_leftovers(sorted({os.path.dirname(item["path"]) for item in writes}))
        # Data files first, units last (each group in the given order): an old unit
        # never points at a file that is not there yet, and systemd reads the new units
        # only at the daemon-reload after all renames.
        writes.sort(key=lambda item: item["spec"]["unit"])
        unit_dir = None
        try:
            # 1. every candidate beside its destination (same file system: rename is atomic)
            for item in writes:
                if item["spec"]["unit"] and _is_drop_in(item["path"]):
                    os.makedirs(os.path.dirname(item["path"]), mode=0o755, exist_ok=True)
                fd, item["tmp"] = tempfile.mkstemp(dir=os.path.dirname(item["path"]),
                                                   prefix=TMP_PREFIX, suffix=TMP_SUFFIX)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(item["want"])
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chown(item["tmp"], item["uid"], item["gid"])
                os.chmod(item["tmp"], item["mode"])
            # 2. every validator; one failure and nothing is installed
            unit_items = [item for item in writes if item["spec"]["unit"] and not _is_drop_in(item["path"])]
            if unit_items:
                unit_dir = tempfile.mkdtemp(prefix="pdnode-units-")
                for item in unit_items:
                    with open(os.path.join(unit_dir, os.path.basename(item["path"])), "wb") as fh:
                        fh.write(item["want"])
            failures = _validate(module, writes, unit_dir)
            if failures:
                module.fail_json(msg="validation failed, nothing was changed: " + "; ".join(failures),
                                 failed_paths=[f.split(":", 1)[0] for f in failures])
            # 3. only now the renames, last and in order
            for item in writes:
                os.replace(item["tmp"], item["path"])
            for d in sorted({os.path.dirname(item["path"]) for item in writes}):
                _fsync_dir(d)
        finally:
            for item in writes:
                if item.get("tmp") and os.path.exists(item["tmp"]):
                    os.unlink(item["tmp"])
            if unit_dir:
                shutil.rmtree(unit_dir, ignore_errors=True)

    restart = []
    if p["applied_dir"]:
        # As the files are now (after the writes), or would be (check mode).
        sources = [(item["path"], item["spec"]["roles"],
                    _counted(item["spec"], item["want"] if item["write"] else _read(item["path"])))
                   for item in plan] + _input_sources(p["inputs"], listed)
        digests = _digests(sources, roles)
        restart = [r for r in roles if _applied(p["applied_dir"], r) != digests[r]]
    records = _records_to_fix(p["applied_dir"], roles) if p["applied_dir"] else []
    if records and not module.check_mode:
        for record in records:
            _fix_record(record)

    # Only now, every validator passed and the files in place: units the plan no longer
    # has are disabled (their files still there for systemctl), then their files go.
    disabled = _disable(module, p["disable"]) if p["disable"] and not module.check_mode else []
    removed = [path for path in p["remove"] if os.path.lexists(path)]
    if removed and not module.check_mode:
        for path in removed:
            os.unlink(path)
            parent = os.path.dirname(path)
            if _is_drop_in(path) and not os.listdir(parent):
                os.rmdir(parent)
    reload_ = any(item["spec"]["unit"] for item in writes) or any(
        path.startswith("/etc/systemd/system/") for path in removed) or _needs_daemon_reload(
        module, [os.path.basename(item["path"]) for item in plan
                 if item["spec"]["unit"] and not _is_drop_in(item["path"])])
    changed_paths = [item["path"] for item in plan if item["write"]] + removed + records
    answer = restart_plan(p["restart"], restart, p["release_changed"], p["router_venv_changed"]) \
        if p["restart"] is not None else NO_RESTART
    # A file not yet at its converged content: a change whose steps have not all run (this
    # run's, or an interrupted one's): changed, so that the handlers take them and finish it.
    unfinished = [item["path"] for item in plan if item["spec"].get("converged") is not None
                  and item["want"] != item["spec"]["converged"].encode()]
    module.exit_json(changed=bool(changed_paths or restart or reload_ or disabled or unfinished),
                     changed_paths=changed_paths, restart_roles=restart, daemon_reload=reload_, recorded=[],
                     disabled=disabled, diff=diffs, orphans=gone, restart=answer, unfinished=unfinished)


if __name__ == "__main__":
    main()
