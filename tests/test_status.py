"""`pdnode status` (src/pdnode/commands/status.py) over hosts' answers as playbooks/read.yml
writes them (pdnode.core.change.identity.node_answer): every recorded instance with its
unit's state, the router's word on it, its release and model; a node that is not serving
each of them is exit 1 with a line per problem. The read itself runs on the day-2 node
(molecule/node/tests/test_layout_order.py)."""

from __future__ import annotations

import json

from pdnode.commands import status
from pdnode.core.change import identity

WORKER = {"prefill-0": "http://127.0.0.1:30000", "decode-0": "http://127.0.0.1:30001"}


def answer(units: dict, listed: list | None) -> dict:
    record = {"schema": identity.SCHEMA, "engines": {
        iid: {"role": iid.split("-")[0], "name": "0", "gpus": [["node", g] for g in gpus], "shape": "{}",
              "ports": {}, "reserved": [], "worker": {"id": iid, "url": WORKER[iid]},
              "unit": f"sglang-pd-{iid}.service"}
        for iid, gpus in (("prefill-0", [0, 1, 2, 3]), ("decode-0", [4, 5, 6, 7]))}}
    plan = {"host": "node", "services": {"router": {}}, "install": {"venv": "/opt/sglang-pd/venvs/r1"},
            "model": {}, "change": {"by": "record", "notes": [], "steps": [], "windows": [], "record": record}}
    router = None if listed is None else {"rc": 0, "stdout": "line\n" + json.dumps({"listed": listed})}
    return identity.node_answer(plan, {"units": units}, router)


def unit(active="active", commit=None):
    return {"active": active, "since": "Sun 2026-12-06 11:00:00 UTC", "started_s": 1.6,
            "python": "/opt/sglang-pd/venvs/r1/bin/python", "model_commit": commit}


def test_a_serving_node_is_every_instance_active_listed_healthy():
    units = {"sglang-pd-prefill-0.service": unit(commit="c" * 40), "sglang-pd-decode-0.service": unit()}
    rows = status.instances({"node": answer(units, [{"url": u, "healthy": True} for u in WORKER.values()])})
    assert [r["instance"] for r in rows] == ["prefill-0", "decode-0"] and all(not r["problems"] for r in rows)
    assert rows[0]["release"] == "r1" and rows[0]["model_commit"] == "c" * 40 and rows[0]["last_start_s"] == 1.6
    assert rows[0]["gpus"] == "node:0,1,2,3"
    shown = status.text(rows)
    assert "prefill-0" in shown and "healthy" in shown and "r1 / cccccccccccc" in shown


def test_each_way_of_not_serving_is_named():
    units = {"sglang-pd-prefill-0.service": unit(active="failed")}
    rows = status.instances({"node": answer(units, [{"url": WORKER["prefill-0"], "healthy": False}])})
    problems = {r["instance"]: r["problems"] for r in rows}
    assert problems["prefill-0"] == ["sglang-pd-prefill-0.service is failed on node",
                                     "the router lists http://127.0.0.1:30000 unhealthy"]
    assert problems["decode-0"] == ["sglang-pd-decode-0.service is not read on node",
                                    "the router does not list http://127.0.0.1:30001"]
    rows = status.instances({"node": answer({}, None)})
    assert "the router's worker list could not be read" in rows[0]["problems"]
