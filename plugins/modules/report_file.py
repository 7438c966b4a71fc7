#!/usr/bin/python
"""Documentation of the report_file action (plugins/action/report_file.py does the work,
in the controller's process)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: report_file
short_description: Write a report file on the controller, atomically, without reporting a change
description:
  - Writes O(content) to O(dest) on the controller, in the controller's own process (an
    action plugin, no module process, no connection to the host).
  - A report is a record of the run, not state of the host, so the task never reports a
    change; it writes in check mode too.
  - The file is replaced in one rename (a temporary file beside it first), so a reader never
    sees half a report. The parent directory is made (O(directory_mode)) when missing.
options:
  dest:
    description: Absolute path of the report file on the controller.
    type: path
    required: true
  content:
    description: The report's text.
    type: str
    required: true
  mode:
    description: Mode of the file, an octal string.
    type: str
    default: "0644"
  directory_mode:
    description: Mode of the parent directory when it has to be made, an octal string.
    type: str
    default: "0755"
author: pdnode
"""

EXAMPLES = r"""
- name: Keep the report on the controller
  pdnode.sglang_pd.report_file:
    dest: "{{ playbook_dir }}/.cache/verify/{{ inventory_hostname }}.json"
    content: "{{ report | to_nice_json }}\n"
    mode: "0644"
"""

RETURN = r"""
dest: {description: The file written., returned: always, type: str}
"""

if __name__ == "__main__":
    raise SystemExit("report_file is an action: it runs in the controller's process (plugins/action/report_file.py)")
