"""Test only (never shipped): end ansible-playbook abruptly at an exact task boundary.

PDNODE_KILL_BEFORE=NAME: when a task or handler named NAME ("role : task", handlers
prefixed "handler: ") is about to start, append its name to PDNODE_KILL_LOG and
os._exit(99): every earlier task is complete, NAME never began, and nothing runs after
(no handlers, no cleanup), as if the controller had been killed between two tasks.
PDNODE_KILL_BEFORE="" only appends every task's name to PDNODE_KILL_LOG (the boundaries).
Enable with ANSIBLE_CALLBACK_PLUGINS=<this dir> ANSIBLE_CALLBACKS_ENABLED=pdnode_kill_after.
"""

from __future__ import annotations

import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: pdnode_kill_after
type: aggregate
short_description: exit the controller before task PDNODE_KILL_BEFORE (tests only)
description: See the module docstring.
requirements: [enabled in callbacks_enabled]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pdnode_kill_after"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._before = os.environ.get("PDNODE_KILL_BEFORE", "")
        self._log = os.environ.get("PDNODE_KILL_LOG", os.devnull)

    def _start(self, task, handler):
        name = ("handler: " if handler else "") + task.get_name()
        if not self._before or name == self._before:
            with open(self._log, "a", encoding="utf-8") as fh:
                fh.write(f"{name}\n")
        if name == self._before:
            os._exit(99)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start(task, False)

    def v2_playbook_on_handler_task_start(self, task):
        self._start(task, True)
