"""rdma: the user space is installed and usable, and the memlock limits file is right."""

import time

import pytest

LIMITS = "/etc/security/limits.d/90-pdnode-rdma-memlock.conf"


@pytest.mark.parametrize("pkg", ["rdma-core", "libibverbs1", "ibverbs-providers", "ibverbs-utils", "perftest", "infiniband-diags"])
def test_packages(host, pkg):
    assert host.package(pkg).is_installed


def test_verbs_tools_run(host):
    # No NIC in a container: libibverbs loads and reports none (exit 255; "Function not
    # implemented" when the kernel has no RDMA core at all, as here).
    out = host.run("ibv_devinfo -l")
    assert out.rc in (0, 255), out.stderr
    assert "HCA" in out.stdout or "IB devices" in (out.stdout + out.stderr), out.stdout + out.stderr
    assert host.exists("ib_write_bw") and host.exists("ibstat")


def test_limits_file(host):
    f = host.file(LIMITS)
    assert f.exists and f.user == "root" and f.mode == 0o644
    rules = [l.split() for l in f.content_string.splitlines() if l.strip() and not l.startswith("#")]
    assert rules == [["sglang", "soft", "memlock", "unlimited"], ["sglang", "hard", "memlock", "unlimited"]]


def test_pam_applies_it_to_a_login(host):
    """A login of the service user through PAM (runuser -l, as su/login/sudo) applies the file.

    Raising a hard limit needs CAP_SYS_RESOURCE. With it, the login gets "unlimited".
    Our CI hosts' root lacks it, so no container there can have it: pam_limits still reads
    the file and calls setrlimit with exactly its values, the kernel refuses, the login
    goes on with the old limit, and pam_limits logs the attempt. That log line, of this
    very login (its PID), is what we check there: without the file, or with other values
    in it, it is absent or names other numbers.
    """
    def session_lines(service):
        return [l.split() for l in host.file(f"/etc/pam.d/{service}").content_string.splitlines()
                if l.startswith("session")]
    assert ["session", "include", "runuser"] in session_lines("runuser-l")
    assert ["session", "required", "pam_limits.so"] in session_lines("runuser")
    # `exec` keeps the PID: the journal entries of this login carry it.
    out = host.run("""sh -c 'echo $$; exec runuser -l sglang -s /bin/bash -c "ulimit -l"' 2>/dev/null""")
    assert out.rc == 0, out.stderr
    pid, limit = out.stdout.split()[0], out.stdout.split()[-1]
    cap = int(host.check_output("grep CapEff /proc/1/status").split()[-1], 16)
    if cap & (1 << 24):  # CAP_SYS_RESOURCE: the real outcome is observable
        assert limit == "unlimited", out.stdout
        return
    # The session's last line comes after pam_limits' (journald may take a moment, longer
    # on a busy machine: the wait ends when the line is there, the deadline is generous).
    deadline = time.monotonic() + 120
    while True:
        log = host.check_output(f"journalctl --no-pager -q -o cat _PID={pid}")
        if "session closed for user sglang" in log or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # RLIM_INFINITY prints as -1: "unlimited" for both the soft and the hard limit.
    assert "pam_limits(runuser-l:session): Could not set limit for 'memlock' to soft=-1, hard=-1" in log, log
    assert "session opened for user sglang" in log, log
