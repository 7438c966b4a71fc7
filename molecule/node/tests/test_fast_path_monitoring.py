"""The monitoring role's fast path on the deployed node (issue 20, section 5): its one
read (pdnode.sglang_pd.node_state) names every way the host differs from what the role
converges, so a drifted host is never reported as converged.

Each kind of drift the read claims to see is planted (a file's content, mode, owner and
group, the rules directory's mode, a unit stopped, one disabled, a configuration
Prometheus refused to reload), then playbooks/monitoring.yml runs as an operator runs
it: the read must name each difference, the run must change something and leave the
host as the role makes it. In check mode it shows the differences and changes nothing.
At the end a run changes nothing and runs no Prometheus task: the node is left as the
scenario's converge made it, for the tests after this file.
Packages are not planted here (removing one needs the package archive on a host with no
network); tests/test_node_state.py compares that verdict with the apt module's.
"""

from __future__ import annotations

import json
import os

import pytest
from playbook_record import make_report_dirs, run_playbook
from test_monitoring import wait_for

CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")
PROMETHEUS = "http://127.0.0.1:9090"
NODE_EXPORTER_DEFAULT = "/etc/default/prometheus-node-exporter"
PROMETHEUS_DEFAULT = "/etc/default/prometheus"
CONFIG = "/etc/prometheus/prometheus.yml"
RULES_DIR = "/etc/prometheus/rules"
RULES_FILE = f"{RULES_DIR}/pdnode-alerts.rules.yml"
FILES = [PROMETHEUS_DEFAULT, NODE_EXPORTER_DEFAULT, CONFIG, RULES_FILE]
UNITS = ["prometheus.service", "prometheus-node-exporter.service"]
READ = "Read what the monitoring role converges on the host (one call)"
CONVERGE = "Prometheus and the node exporter (the read found a difference, or monitoring_fast_path is false)"
RELOAD_CHECK = "Check that Prometheus runs the configuration on disk"
GAUGE = "prometheus_config_last_reload_successful"


def run_monitoring(inventory, *args: str) -> dict:
    """playbooks/monitoring.yml against the instance (it may fail: "rc" says so)."""
    return run_playbook(inventory, "playbooks/monitoring.yml", *args, must_pass=False)


def results(record: dict, name: str) -> list[dict]:
    """This host's results of the tasks called NAME (Ansible may prefix the role)."""
    return [t["hosts"][CONTAINER] for play in record["plays"] for t in play["tasks"]
            if t["task"]["name"].split(" : ")[-1] == name and CONTAINER in t["hosts"]]


def drift(record: dict) -> list[str]:
    (read,) = results(record, READ)
    return read["drift"]


def changed(record: dict) -> int:
    return record["stats"][CONTAINER]["changed"]


def state(host) -> dict:
    """What the read compares, as the host reports it (stat and systemctl, not the module)."""
    files = {}
    for path in [*FILES, RULES_DIR]:
        files[path] = host.check_output("stat -c '%%a %%U %%G' %s", path)
    return {"files": files, "content": {p: host.check_output("sha256sum %s", p).split()[0] for p in FILES},
            "units": {u: (host.run("systemctl is-enabled %s", u).stdout.strip(),
                          host.run("systemctl is-active %s", u).stdout.strip()) for u in UNITS}}


def gauge(host) -> str | None:
    out = host.run("curl -sS --max-time 5 %s/metrics", PROMETHEUS).stdout
    return next((line.split()[1] for line in out.splitlines() if line.startswith(GAUGE + " ")), None)


@pytest.fixture(scope="module")
def converged(host, inventory) -> dict:
    """The host as the role makes it: a first run must change nothing and run no Prometheus
    task (the converge of the scenario left it so), and the state it leaves."""
    make_report_dirs()
    record = run_monitoring(inventory)
    assert record["rc"] == 0 and changed(record) == 0, record["stats"]
    assert drift(record) == []
    good = state(host)
    assert all(v == "644 root root" for p, v in good["files"].items() if p != RULES_DIR), good
    assert good["files"][RULES_DIR] == "755 root root"
    assert set(good["units"].values()) == {("enabled", "active")}
    return good


def plant(host, commands: list[str]):
    for command in commands:
        host.check_output(command)


DRIFT = [
    f"echo '# planted' >> {NODE_EXPORTER_DEFAULT}",
    f"echo '# planted' >> {CONFIG}",
    f"chmod 0600 {RULES_FILE}",
    f"chown nobody:nogroup {PROMETHEUS_DEFAULT}",
    f"chmod 0700 {RULES_DIR}",
    "systemctl stop prometheus.service",
    "systemctl disable prometheus-node-exporter.service",
]
# One line of the read per planted difference (the module's wording).
NAMED = [
    f"file {NODE_EXPORTER_DEFAULT}: content differs",
    f"file {CONFIG}: content differs",
    f"file {RULES_FILE}: mode 0600, wants 0644",
    f"file {PROMETHEUS_DEFAULT}: owner nobody, wants root",
    f"file {PROMETHEUS_DEFAULT}: group nogroup, wants root",
    f"directory {RULES_DIR}: mode 0700, wants 0755",
    "unit prometheus.service: inactive, wants active",
    "unit prometheus-node-exporter.service: disabled, wants enabled",
]


def test_check_mode_names_the_drift_shows_the_diff_and_changes_nothing(host, inventory, converged):
    plant(host, DRIFT)
    planted = state(host)
    record = run_monitoring(inventory, "--check", "--diff")
    assert record["rc"] == 0, record["stats"]
    got = drift(record)
    for line in NAMED:
        assert line in got, f"{line!r} not named by the read: {got}"
    assert changed(record) > 0
    (write,) = results(record, "Write the node exporter's command line (systemd collector with restart counts)")
    assert write["changed"] and "# planted" in json.dumps(write["diff"]), write
    assert state(host) == planted, "check mode changed the host"


def test_a_run_names_every_planted_difference_and_repairs_it(host, inventory, converged):
    planted = state(host)
    assert planted != converged, "the drift planted by the check-mode test is gone"
    record = run_monitoring(inventory)
    assert record["rc"] == 0, record["stats"]
    got = drift(record)
    for line in NAMED:
        assert line in got, f"{line!r} not named by the read: {got}"
    assert changed(record) > 0
    assert wait_for(lambda: state(host) == converged), (state(host), converged)
    assert wait_for(lambda: gauge(host) == "1")


def test_a_configuration_prometheus_refused_is_seen_with_the_files_as_on_disk(host, inventory, converged):
    """Prometheus refused a reload and runs an older configuration, while the file is
    back as the role writes it: only its own gauge says so. The run must not pass as
    converged; the role's check fails (it names a refused reload, as before the read)."""
    host.check_output(f"cp -p {CONFIG} {CONFIG}.mon-test")
    try:
        host.check_output(f"echo 'scrape_configs: [{{job_name: x, static_configs: oops}}]' > {CONFIG}")
        host.check_output("systemctl reload prometheus.service")
        assert wait_for(lambda: gauge(host) == "0"), "Prometheus accepted a broken configuration"
    finally:
        host.check_output(f"mv {CONFIG}.mon-test {CONFIG}")
    assert state(host) == converged
    record = run_monitoring(inventory)
    assert f"http {PROMETHEUS}/metrics: no line '{GAUGE} 1'" in drift(record)
    (check,) = results(record, RELOAD_CHECK)
    assert record["rc"] != 0 and check.get("failed"), record["stats"]
    host.check_output("systemctl reload prometheus.service")
    assert wait_for(lambda: gauge(host) == "1")


def test_then_a_run_changes_nothing_and_runs_no_prometheus_task(host, inventory, converged):
    record = run_monitoring(inventory)
    assert record["rc"] == 0 and changed(record) == 0, record["stats"]
    assert drift(record) == []
    (include,) = results(record, CONVERGE)
    assert include.get("skipped"), include
    assert results(record, RELOAD_CHECK) == []
    assert state(host) == converged
