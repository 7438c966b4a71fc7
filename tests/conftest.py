"""Fixtures shared by the plan tests at this level: inventory variables to change per test."""

from __future__ import annotations

import pytest
from planvars import changed, variables


@pytest.fixture(autouse=True)
def _sglang_judge_off_outside_conformance(request, monkeypatch):
    """pdnode check asks SGLang when a validator environment exists on the machine; the
    unit tests must not depend on whether one does (a fresh CI machine builds it only in
    the conformance stage), so there the judge is switched off and says so. The
    conformance tests (tests/conformance/test_check_sglang.py) run it for real."""
    if request.node.get_closest_marker("conformance") is None:
        monkeypatch.setenv("PDNODE_SGLANG_VALIDATOR", "off")


@pytest.fixture(scope="module")
def gpu01_vars():
    return variables("gpu01")


@pytest.fixture(scope="module")
def host16():
    """A 16-GPU host without RDMA mapping: room for an 8-GPU instance beside a decode, or for
    4 prefills and 4 decodes of 2 GPUs."""
    return changed(variables("gpu01"), {"pdnode_gpu_count": 16, "pdnode_transfer_backend": "mooncake_tcp",
                                        "pdnode_ib_devices": None})
