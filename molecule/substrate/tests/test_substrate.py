"""The test substrate itself: a container whose PID 1 is a working systemd.

Every role scenario relies on this; if these fail, fix scripts/substrate or the
PDNODE_MOLECULE_* settings (scripts/substrate --print-env), not the roles.
"""

UNIT = "pdnode-substrate-probe"


def test_pid1_is_systemd(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"


def test_system_is_running(host):
    # "degraded" only means some unit failed; the manager itself works.
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state in ("running", "degraded"), state


def test_systemd_run_waits_for_a_command(host):
    # --wait needs the manager to track the transient unit through its cgroup and
    # report the exit status back over D-Bus: the full path a role's handlers use.
    assert host.run("timeout 60 systemd-run --wait --quiet true").rc == 0
    assert host.run("timeout 60 systemd-run --wait --quiet false").rc != 0


def test_transient_service_starts_and_stops(host):
    host.run(f"systemctl stop {UNIT}")  # leftovers from an interrupted run
    started = host.run(f"systemd-run --unit={UNIT} --quiet sleep 600")
    assert started.rc == 0, started.stderr
    try:
        assert host.service(UNIT).is_running
    finally:
        stopped = host.run(f"systemctl stop {UNIT}")
    assert stopped.rc == 0, stopped.stderr
    assert not host.service(UNIT).is_running


def test_modules_sent_by_ansible_get_cached_bytecode(host):
    # scripts/lib/substrate/ansiballz_bytecode.py: imported by every Python of the image
    # (a .pth), and the modules the converge and these tests ran left their compiled files.
    active = host.run("python3 -c 'import zipimport, ansiballz_bytecode as b; "
                      "print(zipimport._compile_source is b._compile_cached)'")
    assert active.rc == 0 and active.stdout.strip() == "True", active.stderr
    entries = host.run("ls /var/cache/ansiballz-bytecode | wc -l")
    assert int(entries.stdout.strip()) > 50, entries.stdout  # ansible.module_utils alone is more
