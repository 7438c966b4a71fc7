"""The firewall role on the one-host node (its plan disables the firewall): one read
(pdnode.sglang_pd.node_state) looks for what an earlier multi-host layout left, and the
removal runs, as one include, only when the read found something. Each kind of leftover
the read claims to see is planted (the unit, enabled and running; the rules file), the
phase's playbook must remove it and report the change, and a re-run must change nothing
and skip the removal. The table itself cannot be planted here: the container has no
CAP_NET_ADMIN (the cluster scenario loads and checks real tables)."""

from __future__ import annotations

import os

import pytest
from playbook_record import run_playbook

CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")
UNIT = "sglang-pd-firewall.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
RULES = "/etc/sglang-pd-firewall.nft"
REMOVAL = "Remove what an earlier multi-host layout left"


def firewall_yml(inventory) -> dict:
    return run_playbook(inventory, "playbooks/firewall.yml")


def task_result(record: dict, name: str) -> dict:
    (found,) = [t["hosts"][CONTAINER] for p in record["plays"] for t in p["tasks"]
              if t["task"]["name"].endswith(f" : {name}")]
    return found


def plant(host, what: str) -> None:
    if what == "unit":
        unit = "[Unit]\\nDescription=left by a multi-host layout\\n[Service]\\nType=oneshot\\nRemainAfterExit=yes\\n" \
               "ExecStart=/bin/true\\n[Install]\\nWantedBy=multi-user.target\\n"
        assert host.run(f"printf '{unit}' > {UNIT_PATH} && systemctl daemon-reload && "
                        f"systemctl enable --now {UNIT}").rc == 0
        assert host.service(UNIT).is_running and host.service(UNIT).is_enabled
    else:
        assert host.run(f"printf 'table inet sglang_pd_pdnode {{}}\\n' > {RULES}").rc == 0


@pytest.mark.parametrize("what", ["unit", "rules"])
def test_what_an_earlier_layout_left_is_seen_removed_and_then_left_alone(host, inventory, what):
    plant(host, what)
    first = firewall_yml(inventory)
    assert first["stats"][CONTAINER]["changed"] > 0, first["stats"]
    assert not task_result(first, REMOVAL).get("skipped")
    assert not host.file(UNIT_PATH).exists and not host.file(RULES).exists
    # stopped and disabled, and systemd no longer knows the unit (testinfra's service module
    # cannot be asked about a unit that has no file)
    assert host.run(f"systemctl is-active {UNIT}").stdout.strip() == "inactive"
    assert host.run(f"systemctl is-enabled {UNIT}").rc != 0
    again = firewall_yml(inventory)
    assert again["stats"][CONTAINER]["changed"] == 0, again["stats"]
    assert task_result(again, REMOVAL).get("skipped")
