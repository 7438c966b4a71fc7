"""Write a report file on the controller, in the controller's own process (no module, no
round trip): the preflight's facts and verdict, the verification's report.

A report is a record of this run, not state of the host, so the task never reports a
change; it is written in check mode too (the preflight judges in check mode, and its
report is what an operator reads afterwards). The file is replaced atomically (a temporary
file in the same directory, then rename), so a reader never sees half a report; its
parent directory is made when missing. Documentation: plugins/modules/report_file.py."""

from __future__ import annotations

import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = {
    "dest": {"type": "path", "required": True},
    "content": {"type": "str", "required": True},
    "mode": {"type": "str", "default": "0644"},
    "directory_mode": {"type": "str", "default": "0755"},
}


def parse_mode(name: str, value: str) -> int:
    """An octal mode string ("0644") -> int; anything else is refused naming the field."""
    text = str(value)
    if not text or any(c not in "01234567" for c in text) or int(text, 8) > 0o7777:
        raise AnsibleActionFail(f"{name}={value!r} is not an octal file mode: write it as a quoted string such as '0644'")
    return int(text, 8)


def write_atomically(dest: str, content: bytes, mode: int, directory_mode: int) -> None:
    """Replace dest with content and mode in one rename; the parent is made when missing."""
    parent = os.path.dirname(dest) or "."
    os.makedirs(parent, mode=directory_mode, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(dest)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # mkstemp makes it 0600; the umask does not apply to chmod
        os.replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False  # it never touches the host

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        dest = args["dest"]
        if not os.path.isabs(dest):
            raise AnsibleActionFail(f"dest={dest!r} is not an absolute path: name the report file from the root")
        mode = parse_mode("mode", args["mode"])
        directory_mode = parse_mode("directory_mode", args["directory_mode"])
        try:
            write_atomically(dest, to_bytes(args["content"], errors="surrogate_or_strict"), mode, directory_mode)
        except OSError as exc:
            raise AnsibleActionFail(f"dest={dest!r}: cannot write the report: {to_text(exc.strerror or exc)}") from None
        result.update(changed=False, dest=dest, mode=args["mode"])
        return result
