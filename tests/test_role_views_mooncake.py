"""The mooncake role's build choice and loopback report (pdnode.core.host.roles.mooncake), case
by case as the role's Jinja computed them."""

from __future__ import annotations

import json

import pytest

from pdnode.core.rules import mooncake_select
from pdnode.core.host.roles import mooncake

VERSIONS = {"non-cuda": "0.3.13.post1", "cuda12": "0.3.13.post1", "cuda13": "0.3.14"}
SMI = "==============NVSMI LOG==============\n\nDriver Version                            : 580.95.05\nCUDA Version                              : 13.0\n"


def test_no_driver_chooses_the_non_cuda_build_and_removes_the_others():
    for smi in ({"rc": 127, "stdout": ""}, {}, {"rc": 0, "stdout": ""}):
        c = mooncake.choose(smi, "auto", "", VERSIONS)
        assert c["requirement"] == "mooncake-transfer-engine-non-cuda==0.3.13.post1"
        assert c["others"] == ["mooncake-transfer-engine", "mooncake-transfer-engine-cuda13"]


def test_the_drivers_cuda_picks_the_build_unless_the_nvidia_smi_call_failed():
    assert mooncake.choose({"rc": 0, "stdout": SMI}, "auto", "", VERSIONS)["flavor"] == "cuda13"
    assert mooncake.choose({"rc": 1, "stdout": SMI}, "auto", "", VERSIONS)["flavor"] == "non-cuda"


def test_the_stack_or_a_forced_build_wins_and_the_others_are_removed():
    stack12 = mooncake.choose({"rc": 0, "stdout": SMI}, "auto", "12", VERSIONS)
    assert stack12["requirement"] == "mooncake-transfer-engine==0.3.13.post1"
    assert stack12["others"] == ["mooncake-transfer-engine-cuda13", "mooncake-transfer-engine-non-cuda"]
    forced = mooncake.choose({"rc": 0, "stdout": SMI}, "non-cuda", "", VERSIONS)
    assert forced["flavor"] == "non-cuda" and forced["reason"].startswith("forced")


def test_a_cuda_build_without_a_driver_is_refused():
    with pytest.raises(mooncake_select.SelectionError):
        mooncake.choose({"rc": 127}, "cuda13", "", VERSIONS)


def test_the_loopback_report_is_the_line_the_role_printed():
    line = {"package": "mooncake-transfer-engine", "version": "0.3.13.post1", "protocol": "tcp", "bytes": 67108864,
            "iterations": 5, "write_gb_s_best": 3.2, "write_gb_s_mean": 2.95, "read_gb_s": 3.1, "intact": True,
            "ok": True}
    assert mooncake.loopback_report(["starting", json.dumps(line)]) == (
        "mooncake-transfer-engine 0.3.13.post1, tcp: 67108864 bytes x 5, write 3.2 GB/s best (2.95 mean), "
        "read 3.1 GB/s, data intact: True")
