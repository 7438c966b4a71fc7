#!/usr/bin/python
"""Read what the node runs: the layout the last deploy recorded (pdnode.core.change.identity)
and how long each of its engine units took to start the last time (systemd's own record of
the start, readiness gate included). Read-only."""

from __future__ import annotations

DOCUMENTATION = r"""
module: layout_read
short_description: Read the layout a PD node runs and its engines' measured start times
description:
  - Reads O(path), the record of the layout the last deploy converged on (pdnode.layout/1,
    written by the pd_services role), and for each engine unit it names that systemd runs,
    the seconds its last start took, from systemd's own timestamps (from leaving the
    inactive state to entering the active one, after ExecStartPost, the unit's readiness
    gate). The plan names the instances after the record and predicts a change's windows
    from those measured starts.
  - With a record, the units of O(prefix) that systemd runs here and the record does not
    name (RV(strangers)); the plan refuses to change a node that runs what it does not know.
  - Read-only; it answers the same in check mode. A missing record answers content null.
options:
  path:
    description: The record's absolute path on the host.
    type: path
    required: true
  prefix:
    description: The units' prefix (pdnode_service_prefix); without it no unit is listed.
    type: str
    default: ""
author: pdnode
"""

EXAMPLES = r"""
- name: Read the layout the node runs
  pdnode.sglang_pd.layout_read:
    path: /var/lib/pdnode/applied/sglang-pd/layout.json
    prefix: sglang-pd
  register: _pdnode_running
"""

RETURN = r"""
content: {description: The record's text, null when there is none., returned: always, type: str}
started:
  description: Engine unit -> seconds its last start took (only units that run now).
  returned: always
  type: dict
units:
  description:
    - Engine unit of the record that systemd knows here -> C(active) (its ActiveState),
      C(since) (when it became active), C(started_s), and of its main process C(python) (the
      interpreter it runs, so its release) and C(model_commit) (PDNODE_MODEL_COMMIT in its
      environment), for pdnode status.
  returned: always
  type: dict
strangers:
  description:
    - Service units C(<prefix>-*.service) active (or starting, reloading, stopping) here that
      the record does not name, sorted; empty without a record.
  returned: always
  type: list
  elements: str
"""

import json

from ansible.module_utils.basic import AnsibleModule

PROPERTIES = ("ActiveState", "InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic", "LoadState",
              "ActiveEnterTimestamp", "MainPID")


def blocks(show: str) -> list[dict[str, str]]:
    """`systemctl show -p ... UNIT...` -> one dict per unit, in the order asked."""
    return [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            for block in show.strip().split("\n\n")] if show.strip() else []


def start_seconds(show: str) -> dict[int, float]:
    """`systemctl show -p ... UNIT...` (blank-line separated blocks, units in the order
    asked) -> {index: seconds} for each block of an active unit with both timestamps."""
    out = {}
    for i, values in enumerate(blocks(show)):
        try:
            left, ready = int(values.get("InactiveExitTimestampMonotonic", 0)), \
                int(values.get("ActiveEnterTimestampMonotonic", 0))
        except ValueError:
            continue
        if values.get("ActiveState") == "active" and 0 < left <= ready:
            out[i] = round((ready - left) / 1e6, 3)
    return out


def process(pid: str) -> dict[str, str | None]:
    """What a main process runs: its interpreter (argv[0]) and PDNODE_MODEL_COMMIT."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        with open(f"/proc/{int(pid)}/environ", "rb") as fh:
            env = dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)
    except (OSError, ValueError):
        return {"python": None, "model_commit": None}
    commit = env.get(b"PDNODE_MODEL_COMMIT")
    return {"python": argv[0].decode("utf-8", "replace") if argv and argv[0] else None,
            "model_commit": commit.decode("utf-8", "replace") if commit else None}


def running_units(module: AnsibleModule, systemctl: str, prefix: str) -> list[str]:
    """The service units PREFIX-*.service systemd runs here (active or on their way in or out)."""
    rc, out, _ = module.run_command([systemctl, "list-units", "--all", "--plain", "--no-legend", "--no-pager",
                                     "--type=service", "--", f"{prefix}-*.service"], expand_user_and_vars=False)
    if rc != 0:
        return []
    return sorted(line.split()[0] for line in out.splitlines()
                  if len(line.split()) >= 3 and line.split()[2] in ("active", "activating", "reloading", "deactivating"))


def main() -> None:
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True},
                                          "prefix": {"type": "str", "default": ""}}, supports_check_mode=True)
    try:
        with open(module.params["path"], encoding="utf-8", errors="replace") as fh:  # the plan judges it
            content = fh.read()
    except FileNotFoundError:
        module.exit_json(changed=False, content=None, started={}, units={}, strangers=[])
    except OSError as exc:
        module.fail_json(msg=f"{module.params['path']}: cannot read the node's layout record: {exc.strerror}")
    try:
        doc = json.loads(content)
        # both layouts of a change whose steps had not all run (``from``)
        units = sorted({e["unit"] for part in (doc["engines"], doc.get("from") or {}) for e in part.values()})
    except (ValueError, TypeError, KeyError, AttributeError):
        units = []  # the plan says what is wrong with it, in one line
    started, states = {}, {}
    systemctl = module.get_bin_path("systemctl")
    if units and systemctl:
        rc, out, _ = module.run_command([systemctl, "show", *(f"-p{p}" for p in PROPERTIES), "--", *units],
                                        expand_user_and_vars=False)
        if rc == 0:
            seconds = start_seconds(out)
            started = {units[i]: s for i, s in seconds.items() if i < len(units)}
            for i, values in enumerate(blocks(out)[:len(units)]):
                if values.get("LoadState") == "not-found" and values.get("ActiveState") != "active":
                    continue  # not this host's (a layout spanning hosts), or gone
                states[units[i]] = {"active": values.get("ActiveState"), "since": values.get("ActiveEnterTimestamp"),
                                    "started_s": seconds.get(i),
                                    **(process(values["MainPID"]) if values.get("MainPID", "0") != "0"
                                       else {"python": None, "model_commit": None})}
    strangers = [u for u in running_units(module, systemctl, module.params["prefix"]) if u not in units] \
        if units and systemctl and module.params["prefix"] else []
    module.exit_json(changed=False, content=content, started=started, units=states, strangers=strangers)


if __name__ == "__main__":
    main()
