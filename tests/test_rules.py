"""The registry of the plan's rules (pdnode.core.rules.catalogue) is whole and true.

RULE_CASES gives each registered rule a minimal change to inventories/gpu01 (valid; see
tests/planvars.py) that triggers it: the problem the plan reports carries that rule's id
and severity. RULE_CASES and the registry name the same rules; every problem any plan
test provokes carries a registered id; every call site in the plan's modules passes a
registered id (read from the source, so a branch no test reaches cannot hold a typo).
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import test_plan
import test_plan_hostile
from planvars import DECODE_REPLICAS, ROOT, changed

from pdnode.commands import cli
from pdnode.core.inventory.deferred import Deferred
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import PlanError, build_plan
from pdnode.core.rules.catalogue import BY_ID, RULES

IB = {i: f"mlx5_{i}" for i in range(8)}
GPU01_MODEL = "/models/GLM-4.5-Air-FP8"  # inventories/gpu01's pdnode_model_path

# rule id -> (changes to gpu01, other rule ids the same change also reports)
RULE_CASES: dict[str, tuple[dict, set[str]]] = {
    "variable-unknown": ({"pdnode_bogus": 1}, set()),
    "variable-retired": ({"pdnode_prefill_tp_size": 4}, set()),
    "variable-required": ({"pdnode_model_path": None}, set()),
    "variable-type": ({"pdnode_router_port": "8000"}, set()),
    "value-templated": ({"pdnode_model_served_name": "{{ name }}"}, set()),
    "value-control-character": ({"pdnode_model_served_name": "a\nb"}, set()),
    "value-finite": ({"pdnode_sim_startup_s": math.nan}, set()),
    # values the inventory's reading did not compute (tests/test_check_runs_no_code.py reads them)
    "value-needs-lookup": ({"pdnode_model_path": Deferred("{{ lookup('pipe', 'x') }}", "lookup('pipe')")}, set()),
    "value-templated-at-deploy": ({"pdnode_fast_path": Deferred("{{ lookup('env', 'X') }}", "lookup('env')")}, set()),
    "role-variable-pattern": ({"pd_services_watchdog_s": "60s"}, set()),
    "hardening-off": ({"pd_services_device_policy": False}, set()),
    "engine-known": ({"pdnode_engine": "vllm"}, set()),
    "model-kind-known": ({"pdnode_model_kind": "big"}, set()),
    "model-kind-needed": ({"pdnode_model_kind": None}, set()),
    # where the model comes from: the forms (the files' rules are MODEL_RULE_CASES below)
    "model-source-form": ({"pdnode_model_source": "s3://bucket/glm"}, set()),
    "model-endpoint-form": ({"pdnode_model_source": f"local://{GPU01_MODEL}", "pdnode_model_endpoint": "ftp://m"},
                            set()),
    "model-token-file": ({"pdnode_model_source": f"local://{GPU01_MODEL}", "pdnode_model_token_file": "no/such"},
                         set()),
    "model-source-local-path": ({"pdnode_model_source": "local:///models/other"}, set()),
    "model-reserve-range": ({"pdnode_model_source": f"local://{GPU01_MODEL}", "pdnode_model_reserve_gb": -1.0},
                            set()),
    # build_plan without the inventory's directory: no lock can be found
    "model-lock-missing": ({"pdnode_model_source": "hf://zai-org/GLM-4.5-Air-FP8@main"}, set()),
    "model-path-absolute": ({"pdnode_model_path": "zai-org/GLM-4.5-Air-FP8"}, set()),
    "path-absolute": ({"pdnode_install_root": "opt/sglang-pd"}, set()),
    "path-length": ({"pdnode_install_root": "/opt/" + "a" * 300}, set()),
    "path-characters": ({"pdnode_install_root": "/opt/sglang pd"}, set()),
    "path-normalized": ({"pdnode_config_dir": "/etc/sglang-pd/"}, set()),
    "path-not-system-dir": ({"pdnode_config_dir": "/etc"}, set()),
    "controller-path-pattern": ({"pdnode_wheelhouse": "-r evil"}, set()),
    "api-key-file-one-key": ({"pdnode_api_key_file": "README.md"}, set()),  # a file, but not one key
    "service-user-not-root": ({"pdnode_service_user": "root"}, set()),
    "service-user-name": ({"pdnode_service_user": "Sglang"}, set()),
    "service-prefix-name": ({"pdnode_service_prefix": "pd-"}, set()),
    "served-name-pattern": ({"pdnode_model_served_name": "my model"}, set()),
    "gpu-model-name": ({"pdnode_gpu_model": "NVIDIA;H200"}, set()),
    # no GPU exists then: the instances' GPUs are reported too
    "gpu-count-positive": ({"pdnode_gpu_count": 0}, {"gpus-exist"}),
    "drain-timeout-positive": ({"pdnode_drain_timeout_s": 0}, set()),
    "pair-probe-interval-range": ({"pdnode_pair_probe_interval_s": 5}, set()),
    "sim-value-range": ({"pdnode_sim_decode_ms_per_request": -1.0}, set()),
    "version-pattern": ({"pdnode_sglang_version": "latest"}, set()),
    "host-address": ({"pdnode_router_host": "-h"}, set()),
    "host-zone-id": ({"pdnode_router_host": '::%a --help ; +sh -c "id > pwned" ; echo x'}, set()),
    "worker-host-loopback": ({"pdnode_worker_host": "0.0.0.0"}, set()),
    "verify-reference-length": ({"pdnode_verify_reference_answer": "a" * 201}, set()),
    "environment-name": ({"pdnode_engine_environment": {"sglang_x": "1"}}, set()),
    "environment-value-type": ({"pdnode_engine_environment": {"X": [1]}}, set()),
    "environment-value-pattern": ({"pdnode_engine_environment": {"X": "$HOME"}}, set()),
    # every KV path (tests/test_environment_types.py): gpu01's NVLink does not read it, and refuses it still
    "environment-value-parses": ({"pdnode_engine_environment": {"MC_GID_INDEX": "three"}}, set()),
    # the TCP path, where MC_FORCE_TCP is no contradiction: "0" turns it on all the same
    "environment-presence-switch": ({"pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None,
                                     "pdnode_kv_intranode_nvlink": False,
                                     "pdnode_engine_environment": {"MC_FORCE_TCP": "0"}}, {"kv-over-tcp"}),
    "load-format-value": ({"pdnode_model_load_format": "bogus"}, set()),
    "threshold-known": ({"pdnode_verify_thresholds": {"ttft_p42_max_s": 1.0}}, set()),
    "threshold-positive": ({"pdnode_verify_thresholds": {"ttft_p99_max_s": -1}}, set()),
    "instances-not-empty": ({"pdnode_decode_instances": []}, set()),
    "instance-mapping": ({"pdnode_decode_instances": ["gpus: [4, 5, 6, 7]"]}, set()),
    "instance-key-unknown": ({"decode[0]": {"bootstrap_port": 9000}}, set()),
    "instance-key-required": ({"decode[0]": {"gpus": None}}, set()),
    "instance-key-type": ({"decode[0]": {"tp_size": "four"}}, set()),
    "instance-name-pattern": ({"prefill[0]": {"name": "A"}}, set()),
    "instance-name-unique": ({"pdnode_prefill_instances": [{"gpus": [0, 1], "name": "a"},
                                                           {"gpus": [2, 3], "name": "a"}]}, set()),
    "mem-fraction-range": ({"decode[0]": {"mem_fraction_static": 1.5}}, set()),
    "size-at-least-1": ({"decode[0]": {"attn_dp_size": 0}}, set()),
    "dp-replicas-without-attn-dp": ({"decode[0]": {"dp_size": 2}}, set()),
    "dp-divides-gpus": ({"prefill[0]": {"tp_size": None, "dp_size": 3}}, set()),
    "tp-divisible-by-attn-dp": ({"decode[0]": {"attn_dp_size": 3}}, set()),
    "nccl-port-not-pinned-with-dp": ({"decode[0]": {**DECODE_REPLICAS, "nccl_port": 31000}}, set()),
    "gpus-not-empty": ({"decode[0]": {"gpus": []}}, set()),
    "gpus-exist": ({"pdnode_gpu_count": 6}, set()),
    "gpus-unique": ({"decode[0]": {"gpus": [4, 4, 5, 6]}}, set()),
    "gpus-evenly-spaced": ({"decode[0]": {"gpus": [4, 5, 7, 6]}}, set()),
    "gpus-match-tp-dp": ({"decode[0]": {"gpus": [4, 5]}}, set()),
    "gpus-not-shared": ({"decode[0]": {"gpus": [0, 1, 2, 3]}}, set()),
    "ep-divides-tp": ({"decode[0]": {"ep_size": 3}}, set()),
    "ep-equals-tp-with-a2a": ({"decode[0]": {"ep_size": 2, "extra_args": {"moe_a2a_backend": "deepep"}}}, set()),
    "moe-dense-tp-1-or-tp": ({"decode[0]": {"moe_dense_tp_size": 2}}, set()),
    "dp-lm-head-needs-attn-dp": ({"decode[0]": {"attn_dp_size": 1}}, set()),
    "dense-ignores-moe": ({"pdnode_model_kind": "dense", "decode[0]": {"moe_dense_tp_size": None}}, set()),
    "prefill-attn-dp": ({"prefill[0]": {"attn_dp_size": 4}}, set()),
    "extra-arg-removed-flag": ({"decode[0]": {"extra_args": {"disaggregation_decode_tp": 4}}}, set()),
    "extra-arg-deprecated-dp-attention": ({"decode[0]": {"extra_args": {"enable_dp_attention": True}}}, set()),
    "extra-arg-owned": ({"prefill[0]": {"extra_args": {"port": 30000}}}, set()),
    "extra-arg-unknown": ({"prefill[0]": {"extra_args": {"chunked_prefil_size": 8192}}}, set()),
    "extra-arg-no-flag": ({"prefill[0]": {"extra_args": {"grpc_worker_threads": 4}}}, set()),
    "extra-arg-secret": ({"prefill[0]": {"extra_args": {"admin_api_key": "S3CRET"}}}, set()),
    "extra-arg-value": ({"prefill[0]": {"extra_args": {"chunked_prefill_size": "abc"}}}, set()),
    "exposing-arg": ({"prefill[0]": {"extra_args": {"decoupled_spec_bind_endpoint": "tcp://0.0.0.0:5555"}}}, set()),
    "exposing-arg-allowed": ({"prefill[0]": {"extra_args": {"otlp_traces_endpoint": "collector.example:4317"}},
                              "pdnode_allow_exposing_args": ["otlp_traces_endpoint"]}, set()),
    "exposing-allow-known": ({"pdnode_allow_exposing_args": ["otlp_endpoint"]}, set()),
    "kv-over-tcp": ({"pdnode_transfer_backend": "mooncake_tcp", "pdnode_ib_devices": None,
                     "pdnode_kv_intranode_nvlink": False}, set()),
    "disagg-setting-range": ({"pdnode_disagg_heartbeat_interval_s": 1}, set()),
    "disagg-environment-owned": ({"pdnode_engine_environment": {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 60}},
                                 set()),
    "disagg-setting-same-everywhere": ({"decode[0]": {"extra_args": {"disaggregation_enable_kv_checksum": True}}},
                                       set()),
    "disagg-kv-layout-same": ({"decode[0]": {"extra_args": {"page_size": 64}}}, set()),
    # gpu01's model is not MLA: prefill attention TP 3 against the decode's 2 (4 / attn_dp_size 2)
    "disagg-attn-tp-divides": ({"prefill[0]": {"gpus": [0, 1, 2], "tp_size": 3}, "decode[0]": {"attn_dp_size": 2}},
                               set()),
    # gpu01's prefill attention TP 4 against the decode's 1, both with the MXFP8 KV cache
    "disagg-attn-tp-block-scaled-kv": ({"prefill[0]": {"extra_args": {"kv_cache_dtype": "mxfp8"}},
                                        "decode[0]": {"extra_args": {"kv_cache_dtype": "mxfp8"}}}, set()),
    "disagg-prefill-dp-replicas": ({"prefill[0]": {"tp_size": 2, "dp_size": 2}}, set()),
    "disagg-context-length-same": ({"prefill[0]": {"extra_args": {"context_length": 9217}}}, set()),
    "disagg-hicache-hisparse": ({"prefill[0]": {"extra_args": {"enable_hierarchical_cache": True}},
                                 "decode[0]": {"extra_args": {"enable_hisparse": True}}}, set()),
    "port-range": ({"prefill[0]": {"port": 80}}, set()),
    "port-collision": ({"prefill[0]": {"port": 8000}}, set()),
    # DP replicas draw their NCCL ports from 22000-29999, where gpu01's router metrics port is
    "dp-replica-port-draw": ({"decode[0]": DECODE_REPLICAS}, set()),
    "router-port-not-30000": ({"pdnode_router_port": 30000}, set()),
    "transfer-backend-supported": ({"pdnode_transfer_backend": "fake"}, set()),
    "ib-devices-need-rdma-backend": ({"pdnode_transfer_backend": "mooncake_tcp"}, set()),
    "ib-device-key-gpu-id": ({"pdnode_ib_devices": {**IB, "gpu8": "mlx5_8"}}, set()),
    "ib-device-name": ({"pdnode_ib_devices": {**IB, 8: "mlx5 8"}}, set()),
    "ib-devices-cover-gpus": ({"pdnode_ib_devices": {0: "mlx5_0"}}, set()),
    # the engines' environment against the plan's KV path (gpu01: NVLink; tests/test_kv_environment.py)
    "kv-environment-owned": ({"pdnode_engine_environment": {"MC_INTRANODE_NVLINK": "1"}}, set()),
    "kv-environment-contradicts": ({"pdnode_engine_environment": {"MC_FORCE_MNNVL": "1"}}, set()),
    "kv-environment-surprising": ({"pdnode_engine_environment": {"MC_GID_INDEX": 3}}, set()),
    "router-package-known": ({"pdnode_router_package": "sglang_router"}, set()),
    "router-smg-cache-aware": ({"pdnode_router_policy": "cache_aware", "pdnode_prefill_instances": [{"gpus": [0, 1], "tp_size": 2},
                                                                          {"gpus": [2, 3], "tp_size": 2}]}, set()),
    "router-policy-known": ({"pdnode_router_policy": "least_load"}, set()),
    "router-dp-aware-broken": ({"pdnode_router_extra_args": {"dp_aware": True}}, set()),
    "router-arg-owned": ({"pdnode_router_extra_args": {"port": 8001}}, set()),
    "router-arg-name": ({"pdnode_router_extra_args": {1: "x"}}, set()),
    "router-arg-dashes": ({"pdnode_router_extra_args": {"retry-max-retries": 3}}, set()),
    "router-arg-unknown": ({"pdnode_router_extra_args": {"no_such_option": 1}}, set()),
    "router-arg-secret": ({"pdnode_router_extra_args": {"oracle_password": "S3CRET"}}, set()),
    "router-arg-value": ({"pdnode_router_extra_args": {"retry_max_retries": "many"}}, set()),
    "router-arg-refused": ({"pdnode_router_extra_args": {"jwt_issuer": "https://idp.example"}}, set()),
    "router-judge-unavailable": ({"pdnode_smg_version": "1.12.0",
                                  "pdnode_router_extra_args": {"retry_max_retries": 3}}, set()),
    "router-metrics-loopback": ({"pdnode_router_metrics_host": "0.0.0.0"}, set()),
    "capacity-weights-gb": ({"pdnode_model_weights_gb": 0}, set()),
    "capacity-model-dir": ({"pdnode_model_weights_gb": None, "pdnode_model_controller_path": "tests/no-such-model"},
                           set()),
    # 300 GB on a TP-2 prefill: 150 GB per GPU does not fit an H200; TP 4 would (4 + 4 GPUs fit the host)
    "capacity-weights-fit": ({"pdnode_model_weights_gb": 300, "prefill[0]": {"gpus": [0, 1], "tp_size": 2}}, set()),
    # 671 GB: each instance needs 8 H200s, 16 together on an 8-GPU host
    "capacity-gpus-for-all": ({"pdnode_model_weights_gb": 671}, {"capacity-weights-fit"}),
    "capacity-gpu-known": ({"pdnode_gpu_model": "NVIDIA H100 PCIe"}, set()),
    # gpu01 alone: any other host name is not in its inventory
    "host-known": ({"decode[0]": {"hosts": ["gpu09"]}}, set()),
    "hosts-unique": ({"decode[0]": {"hosts": ["node", "node"], "gpus": [4, 5]}}, set()),
    "dist-init-port-spanning-only": ({"decode[0]": {"dist_init_port": 32100}}, set()),
}

# Rules about several hosts: the change to inventories/gpu-pair as gpu01 plans it, and
# the change to its peer gpu02's variables.
PAIR_RULE_CASES: dict[str, tuple[dict, dict, set[str]]] = {
    "host-in-layout": ({"pdnode_router_node": "gpu02", "prefill[0]": {"hosts": ["gpu02"], "gpus": [0, 1, 2, 3]},
                        "prefill[1]": {"hosts": ["gpu02"], "gpus": [0, 1, 2, 3]}},
                       {}, {"gpus-not-shared", "layout-same-on-every-host"}),
    "node-address-required": ({}, {"pdnode_node_address": None}, set()),
    "node-address-ip": ({"pdnode_node_address": "gpu01.example.internal"}, {}, set()),
    "node-address-unique": ({}, {"pdnode_node_address": "10.20.0.11"}, set()),
    "layout-same-on-every-host": ({}, {"pdnode_router_node": "gpu01"}, set()),
    "multi-host-api-key": ({"pdnode_api_key_file": None}, {"pdnode_api_key_file": None}, set()),
    "spanning-without-dp-replicas": ({"prefill[0]": {"hosts": ["gpu01", "gpu02"], "tp_size": 4, "dp_size": 2}},
                                     {"prefill[0]": {"hosts": ["gpu01", "gpu02"], "tp_size": 4, "dp_size": 2}},
                                     {"gpus-not-shared", "disagg-prefill-dp-replicas"}),
}


def _reported(variables_: dict) -> tuple[list, list]:
    """(errors, warnings) of a node description, as Problems."""
    try:
        return [], build_plan(variables_).warnings
    except PlanError as exc:
        return exc.problems, []


# Rules that need the model's lock file and the controller's cache: rule id -> (changes to
# gpu01, what the inventory's directory and the cache hold, other ids the change reports).
MODEL_RULE_CASES: dict[str, tuple[dict, str, set[str]]] = {
    "model-lock-readable": ({}, "broken-lock", set()),
    "model-lock-stale": ({"pdnode_model_source": "hf://zai-org/GLM-4.5-Air-FP8@v2"}, "lock", set()),
    "model-cache-missing": ({}, "lock-only", set()),
    "model-fact-contradicts-files": ({"pdnode_model_kind": "dense"}, "lock", set()),
}


# Rules that need the node's record of the layout it runs (the deploy reads it from the
# hosts): rule id -> (changes to gpu01, the layout the record holds (None: the record's text
# is not JSON), what else the hosts' read says: strangers, the units of the prefix the host
# runs that its record does not name; interrupted, the record of a change that did not
# finish, from gpu01 to the record's layout). gpu01 runs prefill TP4 on GPUs 0-3, decode DP4 on 4-7.
TWO_DECODES = {"pdnode_decode_instances": [{"gpus": g, "tp_size": 2, "attn_dp_size": 2, "ep_size": 2}
                                           for g in ([4, 5], [6, 7])]}
RUNNING_RULE_CASES: dict[str, tuple[dict, dict | None, dict]] = {
    "layout-record-readable": ({}, None, {}),
    # the record: two decodes on GPUs 4-5 and 6-7; gpu01's one decode needs both GPU pairs
    # free before it starts, so no decode serves meanwhile
    "layout-change-keeps-serving": ({}, TWO_DECODES, {}),
    "layout-record-names-what-runs": ({}, {}, {"strangers": {"gpu01": ["sglang-pd-decode-7.service"]}}),
    # the deploy to two decodes was interrupted; gpu01's own layout is another change
    "layout-change-finishes-first": ({}, TWO_DECODES, {"interrupted": True}),
}


# Rules of `pdnode check` that come from SGLang's own validation, after the plan is built:
# tests/conformance/test_check_sglang.py triggers each through the CLI.
SGLANG_JUDGE_RULES = {"sglang-rejects", "sglang-could-not-judge", "sglang-validation-not-run"}


def test_every_rule_has_a_case_and_every_case_a_rule():
    cases = set(RULE_CASES) | set(PAIR_RULE_CASES) | set(MODEL_RULE_CASES) | set(RUNNING_RULE_CASES) \
        | SGLANG_JUDGE_RULES
    assert not set(RULE_CASES) & set(PAIR_RULE_CASES), "a rule has two cases"
    assert not (set(RULE_CASES) | set(PAIR_RULE_CASES)) & set(MODEL_RULE_CASES), "a rule has two cases"
    assert sorted(set(BY_ID) - cases) == [], "rules without a case in RULE_CASES or PAIR_RULE_CASES"
    assert sorted(cases - set(BY_ID)) == [], "cases for rules that are not registered"


def test_registry_is_well_formed():
    assert len(BY_ID) == len(RULES), "an id is registered twice"
    for r in RULES:
        assert r.id == r.id.lower() and " " not in r.id and r.id.strip("-") == r.id, r.id
        assert r.severity in ("error", "warning"), r.id
        assert r.doc and "\n" not in r.doc and "|" not in r.doc, r.id  # one line, one table cell


@pytest.mark.parametrize("rule_id", sorted(RULE_CASES))
def test_the_case_triggers_its_rule(gpu01_vars, rule_id):
    changes, also = RULE_CASES[rule_id]
    errors, warnings = _reported(changed(gpu01_vars, changes))
    problems = errors or warnings
    ids = [p.rule_id for p in problems]
    assert rule_id in ids, [str(p) for p in problems]
    assert set(ids) <= {rule_id} | also, [f"{p.rule_id}: {p}" for p in problems]
    for p in problems:
        assert p.severity == BY_ID[p.rule_id].severity, p.rule_id
    # an error refuses the node; a warning alone lets the plan be built
    assert bool(errors) == (BY_ID[rule_id].severity == "error")


@pytest.mark.parametrize("rule_id", sorted(PAIR_RULE_CASES))
def test_the_two_host_case_triggers_its_rule(rule_id):
    mine, theirs, also = PAIR_RULE_CASES[rule_id]
    pair = ROOT / "inventories" / "gpu-pair"
    peers = {"gpu01": changed(load_inventory(pair, "gpu01").variables, mine),
             "gpu02": changed(load_inventory(pair, "gpu02").variables, theirs)}
    try:
        build_plan(peers["gpu01"], "gpu01", peers)
        problems = []
    except PlanError as exc:
        problems = exc.problems
    ids = [p.rule_id for p in problems]
    assert rule_id in ids, [str(p) for p in problems]
    assert set(ids) <= {rule_id} | also, [f"{p.rule_id}: {p}" for p in problems]


@pytest.mark.parametrize("rule_id", sorted(RUNNING_RULE_CASES))
def test_the_running_layout_case_triggers_its_rule(gpu01_vars, rule_id):
    changes, ran, read = RUNNING_RULE_CASES[rule_id]
    if ran is None:
        text = "{not json"
    else:
        record = build_plan(changed(gpu01_vars, ran), "gpu01").as_dict()["change"]["converged"]
        if read.get("interrupted"):  # the change from gpu01 to RAN, its steps not all taken
            first = build_plan(gpu01_vars, "gpu01").as_dict()["change"]["converged"]
            record = build_plan(changed(gpu01_vars, ran), "gpu01", running={"gpu01": json.dumps(first)},
                                ).as_dict()["change"]["record"]
            assert "from" in record
        text = json.dumps(record)
    try:
        plan = build_plan(changed(gpu01_vars, changes), "gpu01", running={"gpu01": text},
                          strangers=read.get("strangers"))
    except PlanError as exc:  # the record's rules refuse the plan
        assert [p.rule_id for p in exc.problems] == [rule_id], [str(p) for p in exc.problems]
        return
    # the change's rules are the plan's refusal line: deploy.yml and upgrade.yml refuse with
    # it, the playbooks that change no layout plan on (build_plan reports it as the Problem)
    said = {"layout-change-keeps-serving": "no order of this change keeps a",
            "layout-record-names-what-runs": "the deploy does not stop what it did not start",
            "layout-change-finishes-first": "an earlier deploy was interrupted"}[rule_id]
    assert said in (plan.change["refusal"] or ""), plan.change


@pytest.mark.parametrize("rule_id", sorted(MODEL_RULE_CASES))
def test_the_model_files_case_triggers_its_rule(gpu01_vars, tmp_path, monkeypatch, rule_id):
    from pdnode.core.inventory.model_source import Lock, ManifestFile, cache_path

    changes, setup, also = MODEL_RULE_CASES[rule_id]
    monkeypatch.setenv("PDNODE_CACHE_DIR", str(tmp_path / "cache"))
    lock = Lock("hf://zai-org/GLM-4.5-Air-FP8@main", "zai-org/GLM-4.5-Air-FP8", "main", "c" * 40,
                (ManifestFile("config.json", 100, None), ManifestFile("model.safetensors", 110_000_000_000, "d" * 64)))
    (tmp_path / ".model.lock.json").write_text("{not json" if setup == "broken-lock" else lock.text())
    if setup == "lock":
        cache = cache_path(lock.repo, lock.commit)
        cache.mkdir(parents=True)
        (cache / "config.json").write_text(json.dumps({"architectures": ["Glm4MoeForCausalLM"],
                                                       "n_routed_experts": 128, "num_hidden_layers": 46,
                                                       "num_attention_heads": 96, "num_key_value_heads": 8,
                                                       "head_dim": 128}))
    v = changed(gpu01_vars, {"pdnode_model_source": lock.source, "pdnode_model_weights_gb": None, **changes})
    try:
        problems = build_plan(v, "gpu01", None, str(tmp_path)).warnings
    except PlanError as exc:
        problems = exc.problems
    ids = [p.rule_id for p in problems]
    assert rule_id in ids, [str(p) for p in problems]
    assert set(ids) <= {rule_id} | also, [f"{p.rule_id}: {p}" for p in problems]


def _params(cases: list) -> list:
    return [pytest.param(p.values[0], id=p.id) for p in cases]


@pytest.mark.parametrize("changes", _params(test_plan.CASES) + _params(test_plan_hostile.REFUSED)
                         + _params(test_plan_hostile.ACCEPTED))
def test_every_problem_of_the_plan_tests_has_a_registered_id(gpu01_vars, changes):
    errors, warnings = _reported(changed(gpu01_vars, changes))
    for p in errors + warnings:
        assert p.rule_id in BY_ID, f"{p.rule_id!r} is not in pdnode.rules: {p}"
        assert p.severity == BY_ID[p.rule_id].severity, p.rule_id


# The checker's calls in the plan's modules: c.error / c.warn / self.error (plan,
# instances, ports), error (values), WeightsError (capacity).
MODULES = ["plan/build.py", "rules/instances.py", "rules/ports.py", "rules/values.py", "rules/capacity.py",
           "plan/cluster.py", "rules/guards.py", "rules/router_judge.py", "rules/disagg.py", "plan/model.py"]
_FORWARDS = {"rule_id"}  # c.error(exc.rule_id, ...) passes on an id set at the source


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        # (c.error if ... else c.warn)(...): the capacity findings' dispatch
        if isinstance(f, ast.IfExp) or name in ("error", "warn", "WeightsError"):
            yield node
        # a Problem made with its rule id (the layout change's refusal, a line the playbooks assert)
        elif name == "Problem" and node.args and isinstance(node.args[0], ast.Constant):
            yield node


def test_every_call_site_passes_a_registered_id():
    seen: set[str] = set()
    count = 0
    for module in MODULES:
        path = ROOT / "src" / "pdnode" / "core" / module
        for call in _calls(ast.parse(path.read_text(), str(path))):
            count += 1
            first = call.args[0] if call.args else None
            where = f"{module}:{call.lineno}"
            if isinstance(first, ast.Attribute) and first.attr in _FORWARDS:
                continue
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), f"{where}: no rule id literal"
            assert first.value in BY_ID, f"{where}: {first.value!r} is not in pdnode.rules"
            seen.add(first.value)
    assert count > 60  # the walk found the call sites at all
    # the capacity findings' ids are made by Finding.rule_id, not at a call site
    capacity_source = (ROOT / "src" / "pdnode" / "core" / "rules" / "capacity.py").read_text()
    found = {r for r in BY_ID if f'"{r}"' in capacity_source}
    cli_source = (ROOT / "src" / "pdnode" / "commands" / "cli.py").read_text()
    judged = {r for r in SGLANG_JUDGE_RULES if f'"{r}"' in cli_source}
    assert judged == SGLANG_JUDGE_RULES, "an SGLang verdict rule no longer passed by pdnode check"
    assert sorted(set(BY_ID) - seen - found - judged) == [], "registered but never passed by any call site"


# --- pdnode check --json ---------------------------------------------------------------------

def _check_json(capsys, inventory: Path) -> tuple[int, dict]:
    rc = cli.main(["check", "--json", str(inventory)])
    out, err = capsys.readouterr()
    assert err == ""
    report = json.loads(out)
    # the unit tests switch SGLang's judge off (tests/conftest.py): its one warning says so
    if report["ok"]:
        assert [w["rule"] for w in report["warnings"]][-1:] == ["sglang-validation-not-run"], report["warnings"]
        report["warnings"] = report["warnings"][:-1]
    return rc, report


def test_check_json_ok(capsys):
    rc, got = _check_json(capsys, ROOT / "inventories" / "gpu01")
    assert (rc, got) == (0, {"ok": True, "host": "gpu01", "problems": [], "warnings": []})


def test_check_json_lists_each_problem_with_its_rule(capsys, tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n")
    src = ROOT / "inventories" / "gpu01" / "group_vars"
    (inv / "group_vars").symlink_to(src)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu01.yml").write_text(
        "---\npdnode_decode_instances:\n  - gpus: [4, 5, 6, 7]\n    tp_size: 4\n    attn_dp_size: 3\n"
        "pdnode_install_root: /opt/" + "a" * 200 + "\n")
    rc, got = _check_json(capsys, inv)
    assert rc == 1 and got["ok"] is False and got["warnings"] == []
    by_rule = {p["rule"]: p for p in got["problems"]}
    assert set(by_rule) == {"tp-divisible-by-attn-dp", "path-length"}
    tp = by_rule["tp-divisible-by-attn-dp"]
    assert tp == {"rule": "tp-divisible-by-attn-dp", "field": "pdnode_decode_instances[0].tp_size", "value": 4,
                  "message": tp["message"], "fix": "use an attn_dp_size that divides 4 (e.g. 2)",
                  "severity": "error", "source": "inv/host_vars/gpu01.yml"}
    assert tp["message"].startswith("is not divisible by attn_dp_size=3")
    # a long value is cut as in the text line
    assert by_rule["path-length"]["value"] == "/opt/" + "a" * 95 + "... (205 characters)"


def test_check_json_warnings(capsys, tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n      pdnode_router_metrics_host: 0.0.0.0\n")
    (inv / "group_vars").symlink_to(ROOT / "inventories" / "gpu01" / "group_vars")
    rc, got = _check_json(capsys, inv)
    assert rc == 0 and got["ok"] is True and got["problems"] == []
    assert [(w["rule"], w["severity"], w["value"]) for w in got["warnings"]] == [
        ("router-metrics-loopback", "warning", "0.0.0.0")]


def test_a_system_directory_is_refused_and_a_directory_of_its_own_is_not():
    """values.system_directory, the judge of every directory pdnode chowns or writes into:
    each tree and each named directory under /etc and /var/lib, a home and its dot
    directories are the system's; what lies beside them is the deploy's own."""
    from pdnode.core.rules.values import system_directory

    system = ["/", "/pdnode", "/etc", "/var/lib", "/srv", "/usr", "/usr/local/bin", "/var/log/pdnode", "/etc/ssh",
              "/etc/systemd/system", "/etc/docker", "/etc/hosts", "/etc/cron.custom", "/etc/ssh_extra", "/var/lib/docker", "/var/lib/docker/x",
              "/home/alice", "/home/alice/.ssh", "/home/alice/.config/x"]
    own = ["/etc/pdnode", "/etc/pdnode/keys", "/var/lib/pdnode", "/var/lib/pdnode/cache", "/home/alice/models",
           "/srv/ssh", "/srv/pdnode", "/opt/pdnode", "/data/models", "/var/spooler", "/var/logs"]
    assert [p for p in system if not system_directory(p)] == []
    assert [p for p in own if system_directory(p)] == []


@pytest.mark.parametrize("bad", ["a\nb", float("nan")], ids=["control", "nan"])
def test_the_backstop_finds_a_bad_value_inside_a_list_once_per_variable(bad):
    """values.backstop walks lists as well as dicts, and names a variable once however
    many of its values are bad."""
    from pdnode.core.rules.values import backstop

    errors = []
    raw = {"pdnode_a": ["fine", {"k": [bad, bad]}, bad], "pdnode_b": ["fine", 1.5], "pdnode_c": bad}
    hit = backstop(raw, ["pdnode_a", "pdnode_b", "pdnode_c", "pdnode_absent"],
                   lambda rule, path, value, why, fix: errors.append((rule, path)))
    rule = "value-control-character" if isinstance(bad, str) else "value-finite"
    assert hit == {"pdnode_a", "pdnode_c"}
    assert errors == [(rule, "pdnode_a[1].k[0]"), (rule, "pdnode_c")], errors


def test_a_secret_is_named_by_its_words_and_where_it_lies_is_no_secret():
    """values.is_secret_name (extra args that would put a secret on the command line) and
    safe_name (a variable path as a message prints it)."""
    from pdnode.core.rules.values import is_secret_name, safe_name

    secret = ["api_key", "admin-key", "hf_token", "db_password", "MyPassword", "ssl_keyfile_password"]
    where = ["api_key_file", "admin_key_path", "secrets_dir", "ssl_keyfile", "model_path", "tp_size"]
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in where if is_secret_name(n)] == []
    assert safe_name("pdnode_engine_environment.MC_IB_PORT") == "pdnode_engine_environment.MC_IB_PORT"
    assert safe_name("pdnode_x[0]") == "pdnode_x[0]"
    assert safe_name("a b\n") == repr("a b\n")
