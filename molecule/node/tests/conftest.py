"""Fixtures shared by the node scenario's tests that drive the bundle from the controller."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTAINER = os.environ.get("PDNODE_TEST_CONTAINER", "pdnode-mol-node")


def pytest_configure(config):
    config.addinivalue_line("markers", "day2: a day-2 test of the node (layouts, upgrade): scenario day2 runs them")
    config.addinivalue_line("markers", "repair: how a deploy repairs the node (drift matrix, interrupted deploys): "
                            "scenario repair runs them")


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    """An inventory for the scenario's instance with the scenario's description."""
    inv = tmp_path_factory.mktemp("inv")
    (inv / "host_vars").mkdir()
    (inv / "group_vars").symlink_to(REPO / "inventories" / "demo" / "group_vars")
    (inv / "hosts.yml").write_text(json.dumps({"all": {"hosts": {CONTAINER: {
        "ansible_connection": "community.docker.docker", "ansible_host": CONTAINER}}}}))
    (inv / "host_vars" / f"{CONTAINER}.yml").write_text(
        (REPO / "molecule" / "node" / "host_vars" / "pdnode-mol-node.yml").read_text())
    return inv
