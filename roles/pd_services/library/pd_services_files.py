#!/usr/bin/python
"""Write a set of small files in one round trip (check and diff mode aware)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_services_files
short_description: Write several small files at once, each validated before it replaces the old
description:
  - Writes each file whose content, mode, owner or group differs, atomically (a temporary
    file in the same directory, validated, then renamed over the old one).
  - One module call instead of one per file keeps a no-change run of the deploy fast.
  - Returns the paths that changed, so handlers restart only what changed.
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
        description: Command run on the candidate before it is installed; C(%s) is its path.
        type: str
author: pdnode
"""

EXAMPLES = r"""
- name: Write the service files
  pd_services_files:
    files:
      - {path: /etc/app/app.json, content: "{}", mode: "0640", group: app}
"""

RETURN = r"""
changed_paths:
  description: Paths written (or that would be written in check mode).
  type: list
  elements: str
  returned: always
"""

import grp
import os
import pwd
import shlex
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _current(path):
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            return fh.read(), st
    except FileNotFoundError:
        return None, None


def main():
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True, "options": {
            "path": {"type": "path", "required": True},
            "content": {"type": "str", "required": True},
            "mode": {"type": "str", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "validate": {"type": "str"},
        }}},
        supports_check_mode=True,
    )
    changed, diffs = [], []
    for spec in module.params["files"]:
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
        if same:
            continue
        changed.append(path)
        if have != want:
            diffs.append({"before_header": path, "after_header": path,
                          "before": (have or b"").decode(errors="replace"), "after": spec["content"]})
        if module.check_mode:
            continue
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".pdnode-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(want)
            os.chown(tmp, uid, gid)
            os.chmod(tmp, mode)
            if spec.get("validate"):
                cmd = spec["validate"].replace("%s", shlex.quote(tmp))
                rc, out, err = module.run_command(cmd, use_unsafe_shell=True)
                if rc != 0:
                    module.fail_json(msg=f"{path}: validation failed: {cmd}", rc=rc, stdout=out, stderr=err)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    module.exit_json(changed=bool(changed), changed_paths=changed, diff=diffs)


if __name__ == "__main__":
    main()
