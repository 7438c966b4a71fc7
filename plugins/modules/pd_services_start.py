#!/usr/bin/python
"""Start the services that do not run, the workers before the router, and name each one that
did not start with its own last journal lines (check mode aware)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_services_start
short_description: Start the PD services that do not run, workers first, naming each that did not start
description:
  - Reads C(systemctl is-active) of O(start.workers), O(start.others) and O(start.after); when all are active it
    changes nothing.
  - Otherwise clears the start limits of an earlier failed start of O(start.workers) and O(start.others)
    (an operator's deploy is a new attempt), waits out the hold of each O(start.hold) unit that is
    not running (one of several prefills stopped moments ago stays down until every decode
    has dropped it, C(pdnode.node.drain hold)), starts O(start.workers) with one
    C(systemctl start), and only when they all started, O(start.after) (the router where the layout
    runs it, the probe's timer, the target). The units themselves, not the target, are
    started (the target only Wants= them, so starting it succeeds with failed services).
    systemctl waits for every job (each start ends when its readiness gate passes, or at
    once when the service's process exits).
  - A service that did not start fails the task with one block per service, naming it, its
    state and the last O(journal_lines) lines of its own journal since this start began
    (its SyslogIdentifier is the unit's name), and says when the router was not started
    because its workers did not start.
  - In check mode it reads and reports, and starts nothing.
options:
  start:
    description: What to start (the plan's C(roles.pd_services.start)).
    type: dict
    required: true
    suboptions:
      workers:
        description: The engine units, in start order.
        type: list
        elements: str
        required: true
      others:
        description: The other services (the router where this host runs it), checked after the start.
        type: list
        elements: str
        default: []
      after:
        description: Units started once every worker runs (the router, timers, the target).
        type: list
        elements: str
        default: []
      hold:
        description: Units to hold down before the start when they do not run, each with the argv that waits.
        type: list
        elements: dict
        default: []
        suboptions:
          unit: {description: The unit., type: str, required: true}
          argv: {description: The command that waits until the unit may start (no shell)., type: list, elements: str, required: true}
  journal_lines:
    description: How many of a failed service's last journal lines to show.
    type: int
    default: 8
author: pdnode
"""

RETURN = r"""
not_active:
  description: The units that were not active before the start, in the order given.
  type: list
  elements: str
  returned: always
failed:
  description: Each service that did not start (unit, state, journal), in start order.
  type: list
  elements: dict
  returned: always
"""

import re
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _systemctl(module, *args):
    return module.run_command(["systemctl", *args], expand_user_and_vars=False)


def states(module, units):
    """unit -> its is-active answer (one line per unit, in order, whatever the exit code)."""
    if not units:
        return {}
    _, out, _ = _systemctl(module, "is-active", *units)
    lines = out.splitlines()
    return dict(zip(units, lines + ["unknown"] * (len(units) - len(lines))))


def journal(module, unit, since, lines):
    _, out, _ = module.run_command(["journalctl", "--unit", unit, "--identifier", unit.removesuffix(".service"),
                                    "--since", since, "--lines", str(lines), "--no-pager", "--output", "cat"],
                                   expand_user_and_vars=False)
    return ANSI.sub("", out)


def failure_message(failed, router_skipped):
    """One block per service that did not start, then the router line."""
    text = "".join(f"{f['unit']} did not start (now {f['state']}); its journal ends:\n"
                   + "".join(f"  {line}\n" for line in f["journal"].splitlines())
                   for f in failed)
    return text + ("the router was not started: its workers did not start" if router_skipped else "")


def main():
    module = AnsibleModule(
        argument_spec={
            "start": {"type": "dict", "required": True, "options": {
                "workers": {"type": "list", "elements": "str", "required": True},
                "others": {"type": "list", "elements": "str", "default": []},
                "after": {"type": "list", "elements": "str", "default": []},
                "hold": {"type": "list", "elements": "dict", "default": [], "options": {
                    "unit": {"type": "str", "required": True},
                    "argv": {"type": "list", "elements": "str", "required": True}}}}},
            "journal_lines": {"type": "int", "default": 8},
        },
        supports_check_mode=True,
    )
    p = {**module.params["start"], "journal_lines": module.params["journal_lines"]}
    services = p["workers"] + p["others"]
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    before = states(module, services + [u for u in p["after"] if u not in services])
    down = [unit for unit, state in before.items() if state != "active"]
    if not down or module.check_mode:
        module.exit_json(changed=bool(down), not_active=down, failed=[])
    if any(before[u] != "active" for u in services):
        _systemctl(module, "reset-failed", *services)
    for entry in p["hold"]:
        if before.get(entry["unit"]) != "active":
            done = subprocess.run(entry["argv"], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                module.fail_json(msg=f"waiting to start {entry['unit']} failed: {(done.stderr or done.stdout).strip()}",
                                 not_active=down, failed=[])
    workers_rc = 0
    if any(before[u] != "active" for u in p["workers"]):
        workers_rc, _, _ = _systemctl(module, "start", *p["workers"])
    router_skipped = workers_rc != 0
    if not router_skipped and p["after"]:
        _systemctl(module, "start", *p["after"])
    checked = p["workers"] if router_skipped else services
    after = states(module, checked)
    failed = [{"unit": u, "state": s, "journal": journal(module, u, since, p["journal_lines"])}
              for u, s in after.items() if s != "active"]
    if failed or router_skipped:
        module.fail_json(msg=failure_message(failed, router_skipped), changed=True, not_active=down, failed=failed)
    module.exit_json(changed=True, not_active=down, failed=[])


if __name__ == "__main__":
    main()
