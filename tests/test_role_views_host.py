"""The host-layer roles' small computations (pdnode.core.plan.roles.host) and the role values'
one-call check (pdnode.core.rules.values.role_value_problems), as the roles' Jinja did them."""

from __future__ import annotations

import pytest

from pdnode.core.plan.roles import host
from pdnode.core.rules.values import role_value_problem, role_value_problems


@pytest.mark.parametrize(("facts", "named"), [
    (("Ubuntu", "22.04", "22"), "ubuntu 22.04"),
    (("Ubuntu", "24.04", "24"), "ubuntu 24.04"),
    (("Debian", "12.7", "12"), "debian 12"),  # Debian by its major version
    (("CentOS", "9.3", "9"), "centos 9"),
])
def test_the_os_is_named_as_the_supported_lists_name_it(facts, named):
    distribution, version, major = facts
    assert host.os_release({"distribution": distribution, "distribution_version": version,
                            "distribution_major_version": major}) == named


def test_each_user_gets_a_soft_and_a_hard_line_padded_to_20_columns():
    assert host.memlock_lines(["sglang", "@rdma"], "unlimited") == (
        "sglang               soft    memlock    unlimited\n"
        "sglang               hard    memlock    unlimited\n"
        "@rdma                soft    memlock    unlimited\n"
        "@rdma                hard    memlock    unlimited\n")
    long = "u" * 25
    assert host.memlock_lines([long], 1024) == f"{long} soft    memlock    1024\n{long} hard    memlock    1024\n"
    assert host.memlock_lines([], "unlimited") == ""


def test_role_value_problems_names_each_bad_value_once_in_order():
    named = {"rdma_memlock_users": ["sglang", "root\n* hard"], "rdma_memlock_limit": "unlimited",
             "rdma_limits_file": "/etc/sudoers.d/x.conf", "rdma_packages": ["rdma-core"]}
    assert role_value_problems(named) == [role_value_problem("rdma_memlock_users", named["rdma_memlock_users"]),
                                          role_value_problem("rdma_limits_file", named["rdma_limits_file"])]
    assert all(line.startswith(name) for line, name in zip(role_value_problems(named),
                                                              ["rdma_memlock_users", "rdma_limits_file"]))
    assert role_value_problems({"rdma_memlock_limit": "unlimited", "wheelhouse_src": ""}) == []
