# The test hosts' share of the CPU, for one run of scripts/test (sourced by it).
#
# With Docker's cgroupfs driver on cgroup v1, every container sits under one cgroup,
# /docker, and the kernel weighs that cgroup against each process outside it as if it were
# one process (cpu.shares 1024). Beside two CPU burners, all the test hosts together (each
# a node with its engines, systemd and journald) then got half the CPU of one burner: a
# container's services stalled for a minute at a time, engines missed their watchdog and
# their heartbeats, and stages failed on a machine that was merely busy (session 21's
# burner run). Each container stands for a host of its own, so for the run /docker weighs
# as much as the hosts the lanes run at once (TEST_HOSTS_CPU_SHARES: 8 processes); the
# weight it had comes back when the run ends. With the systemd driver or cgroup v2 the
# containers are scopes in system.slice, weighed as a slice against the user's: nothing
# is changed there.
TEST_HOSTS_CPU_SHARES=8192
_test_hosts_shares_file=${PDNODE_DOCKER_CPU_SHARES_FILE:-/sys/fs/cgroup/cpu/docker/cpu.shares}  # the variable: for tests
_test_hosts_shares_before=""

weigh_test_hosts() {
  local driver
  driver=$(docker info --format '{{.CgroupDriver}} {{.CgroupVersion}}' 2>/dev/null || true)
  [ "$driver" = "cgroupfs 1" ] || return 0
  [ -d "${_test_hosts_shares_file%/*}" ] || mkdir "${_test_hosts_shares_file%/*}" 2>/dev/null || true
  if [ ! -w "$_test_hosts_shares_file" ]; then
    say "the test hosts keep Docker's CPU weight: $_test_hosts_shares_file is not writable (not root?)"
    return 0
  fi
  local before; before=$(cat "$_test_hosts_shares_file")
  [ "$before" -lt "$TEST_HOSTS_CPU_SHARES" ] || return 0
  echo "$TEST_HOSTS_CPU_SHARES" > "$_test_hosts_shares_file"
  _test_hosts_shares_before=$before
  say "the test hosts (Docker's cgroup) weigh $TEST_HOSTS_CPU_SHARES CPU shares for this run (were $before)"
}

restore_test_hosts_weight() {
  [ -n "$_test_hosts_shares_before" ] || return 0
  echo "$_test_hosts_shares_before" > "$_test_hosts_shares_file" 2>/dev/null || true
  _test_hosts_shares_before=""
}
