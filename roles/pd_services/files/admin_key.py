"""Make the router's admin key on the host, once (run by Ansible; the key is never printed).

    python - KEYFILE USER < admin_key.py

32 random bytes as hex, one trailing newline, mode 0400, owned by USER. Written to a
private temporary file and hard-linked into place, so the key file appears complete or
not at all, and a key that already exists is never replaced.
"""

import os
import pwd
import secrets
import sys

path, user = sys.argv[1], sys.argv[2]
pw = pwd.getpwnam(user)
directory = os.path.dirname(path)
tmp = os.path.join(directory, f".pdnode-key-{secrets.token_hex(8)}")
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
try:
    try:
        os.fchown(fd, pw.pw_uid, pw.pw_gid)
        os.fchmod(fd, 0o400)
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if a key appeared meanwhile: never replace one
    except FileExistsError:
        pass
finally:
    os.unlink(tmp)
dfd = os.open(directory, os.O_RDONLY)
try:
    os.fsync(dfd)
finally:
    os.close(dfd)
