"""Make the router's admin key on the host, once, and keep its mode and owners (run by
Ansible; the key is never read nor printed).

    python - KEYFILE OWNER GROUP MODE < admin_key.py

A missing key: 32 random bytes as hex, one trailing newline, written to a private
temporary file with OWNER, GROUP and MODE (octal) and hard-linked into place, so the key
file appears complete or not at all, and a key that already exists is never replaced.
An existing key keeps its content; its mode, owner and group are set to these when they
differ (the router, running as OWNER, reads it at every start). Prints "changed" or
"unchanged"; anything but a regular file at KEYFILE is refused, left as it is.
"""

import grp
import os
import pwd
import secrets
import stat
import sys

path, owner, group, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4], 8)
uid, gid = pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid
directory = os.path.dirname(path)


def fsync_directory():
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


try:
    st = os.lstat(path)
except FileNotFoundError:
    st = None
if st is not None:
    if not stat.S_ISREG(st.st_mode):
        sys.exit(f"{path} is not a regular file; fix: remove it, and the next deploy makes a new key there")
    if (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, uid, gid):
        print("unchanged")
        sys.exit(0)
    # O_NOFOLLOW: the file examined above, never what a link put there since points at
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    print("changed")
    sys.exit(0)

tmp = os.path.join(directory, f".pdnode-key-{secrets.token_hex(8)}")
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
try:
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
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
fsync_directory()
print("changed")
