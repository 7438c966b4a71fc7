"""Every rule of the plan core, with the exact line a user sees.

Each case starts from inventories/gpu01 (which must be valid), changes a few variables
or instance keys (tests/planvars.py: ``"decode[0]": {...}`` patches an instance entry,
None removes a key) and lists every problem the plan reports, in order.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from planvars import ROOT, changed, engine_args, variables

from pdnode.core.plan.build import PlanError, build_plan

GPU01 = ROOT / "inventories" / "gpu01"


CASES = [
    pytest.param(
        {'decode[0]': {'tp_size': 1, 'ep_size': 1}},
        ["pdnode_decode_instances[0].tp_size=1: is not divisible by attn_dp_size=4 (SGLang asserts tp_size % attn_dp_size == 0; tp_size counts ALL GPUs of the instance, attention-TP per DP rank is tp_size/attn_dp_size). Fix: set tp_size: 4 (the instance's GPU count; attention-TP per DP rank is then 1)."],
        id='article_decode',
    ),
    pytest.param(
        {'decode[0]': {'attn_dp_size': 3}},
        ['pdnode_decode_instances[0].tp_size=4: is not divisible by attn_dp_size=3 (SGLang asserts tp_size % attn_dp_size == 0; tp_size counts ALL GPUs of the instance, attention-TP per DP rank is tp_size/attn_dp_size). Fix: use an attn_dp_size that divides 4 (e.g. 2).'],
        id='tp_not_div',
    ),
    pytest.param(
        {'prefill[0]': {'tp_size': None, 'dp_size': 3}},
        ["pdnode_prefill_instances[0].dp_size=3: does not divide the instance's 4 GPUs (each replica has tp_size GPUs). Fix: list dp_size x tp_size GPUs."],
        id='dp_not_div',
    ),
    pytest.param(
        {'decode[0]': {'dp_size': 2}},
        ['pdnode_decode_instances[0].dp_size=2: DP replicas cannot be combined with DP attention (attn_dp_size=4); SGLang 0.5.23 refuses --dp-size with --attn-dp-size. Fix: remove dp_size and list each replica as an instance of its own, or remove attn_dp_size.'],
        id='dp_with_attn_dp',
    ),
    pytest.param(
        {'decode[0]': {'tp_size': 2, 'dp_size': 2, 'attn_dp_size': None, 'ep_size': None, 'enable_dp_lm_head': None,
                       'nccl_port': 31000}},
        ["pdnode_decode_instances[0].nccl_port=31000: cannot be pinned with dp_size=2: every DP replica would bind this one port (SGLang's data-parallel controller). Fix: remove nccl_port from this instance; SGLang picks a free port per replica."],
        id='dp_nccl_pinned',
    ),
    pytest.param(
        {'prefill[0]': {'extra_args': {'context_length': 9217}}},
        ["pdnode_decode_instances[0].extra_args.context_length=None: differs from prefill-0 (9217): a request longer "
         "than one side's limit is admitted by the other, and its decode then waits for KV the prefill refused to "
         "make (InferenceX#2257). Fix: set the same context_length in the extra_args of every prefill and decode, "
         "or on none."],
        id='context_length_prefill_only',
    ),
    pytest.param(
        {'prefill[0]': {'tp_size': 2, 'dp_size': 2}},
        ["pdnode_prefill_instances[0].dp_size=2: makes prefill-0 2 plain DP replicas, and SGLang 0.5.23 fails every "
         "hand-off of replicas 1..1 ('follow_bootstrap_room conflict': its KV sender compares the request's room "
         "with the attention-DP rank, 0 in every replica; sglang#29725). Fix: list each replica as a prefill "
         "instance of its own in pdnode_prefill_instances."],
        id='prefill_dp_replicas',
    ),
    pytest.param(
        {'decode[0]': {'attn_dp_size': 0}},
        ['pdnode_decode_instances[0].attn_dp_size=0: must be at least 1. Fix: use 1 to turn it off.'],
        id='size_zero',
    ),
    pytest.param(
        {'prefill[0]': {'tp_size': 0}},
        ['pdnode_prefill_instances[0].tp_size=0: must be at least 1. Fix: set the number of GPUs of one replica.'],
        id='tp_zero',
    ),
    pytest.param(
        {'decode[0]': {'ep_size': 3}},
        ['pdnode_decode_instances[0].ep_size=3: does not divide tp_size=4 (EP is carved out of the TP world). Fix: use an ep_size that divides 4, e.g. 4.'],
        id='ep_not_div',
    ),
    pytest.param(
        {'decode[0]': {'ep_size': 0}},
        ['pdnode_decode_instances[0].ep_size=0: must be at least 1. Fix: use 1 for no expert parallelism.'],
        id='ep_zero',
    ),
    pytest.param(
        {'decode[0]': {'moe_dense_tp_size': 2}},
        ['pdnode_decode_instances[0].moe_dense_tp_size=2: must be unset, 1 or tp_size (4). Fix: use 1 (dense layers data-parallel) or leave it unset.'],
        id='dense_tp_2',
    ),
    pytest.param(
        {'decode[0]': {'attn_dp_size': 1}},
        ['pdnode_decode_instances[0].enable_dp_lm_head=True: needs DP attention (attn_dp_size > 1). Fix: set attn_dp_size > 1 or set this to false.'],
        id='lm_head_no_dp',
    ),
    pytest.param(
        {'decode[0]': {'ep_size': 2, 'extra_args': {'moe_a2a_backend': 'deepep'}}},
        ["pdnode_decode_instances[0].ep_size=2: must equal tp_size=4 with moe_a2a_backend='deepep': SGLang 0.5.23 replaces any other ep_size with tp_size for this backend, so 2 would not take effect. Fix: leave ep_size out (SGLang sets it to tp_size) or set ep_size: 4."],
        id='a2a',
    ),
    pytest.param(
        {'decode[0]': {'gpus': [6, 7, 8, 9]}},
        ['pdnode_decode_instances[0].gpus=[6, 7, 8, 9]: GPU ids [8, 9] do not exist on a host with pdnode_gpu_count=8. Fix: use ids 0..7.', "pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5_7'}: has no device for GPUs [8, 9] used by the engine instances (SGLang raises 'No IB devices configured for GPU n'). Fix: map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)."],
        id='gpu_missing',
    ),
    pytest.param(
        {'decode[0]': {'gpus': [3, 4, 5, 6]}},
        ['pdnode_decode_instances[0].gpus=[3, 4, 5, 6]: GPUs [3] are also used by prefill-0 (pdnode_prefill_instances[0]). Fix: give each GPU to one instance.'],
        id='gpu_twice',
    ),
    pytest.param(
        {'prefill[0]': {'gpus': [0, 0, 1, 2]}},
        ['pdnode_prefill_instances[0].gpus=[0, 0, 1, 2]: lists a GPU more than once. Fix: list each GPU once.'],
        id='gpu_dup',
    ),
    pytest.param(
        {'prefill[0]': {'gpus': [0, 2, 1, 3]}},
        ['pdnode_prefill_instances[0].gpus=[0, 2, 1, 3]: must be ascending and evenly spaced (SGLang places rank r on base_gpu_id + r * gpu_id_step). Fix: use e.g. [0, 1, 2, 3].'],
        id='gpu_uneven',
    ),
    pytest.param(
        {'prefill[0]': {'gpus': [0, 1]}},
        ['pdnode_prefill_instances[0].gpus=[0, 1]: has 2 GPUs but prefill-0 runs on tp_size=4 GPUs. Fix: list 4 GPUs for prefill-0, or set tp_size: 2.'],
        id='gpu_count',
    ),
    pytest.param(
        {'prefill[0]': {'gpus': []}},
        ['pdnode_prefill_instances[0].gpus=[]: is empty. Fix: list the physical GPU ids prefill-0 runs on.'],
        id='gpu_empty',
    ),
    pytest.param(
        {'prefill[0]': {'gpus': None}},
        ["pdnode_prefill_instances[0].gpus=None: is required and not set. Fix: set gpus (physical GPU ids on each of its hosts, evenly spaced (the spacing is SGLang's gpu_id_step); tp_size x dp_size of them in all hosts together)."],
        id='gpus_required',
    ),
    pytest.param(
        {'pdnode_decode_instances': []},
        ['pdnode_decode_instances=[]: is empty: a PD node needs at least one decode instance. Fix: list one, e.g. pdnode_decode_instances: [{gpus: [0, 1, 2, 3]}].'],
        id='instances_empty',
    ),
    pytest.param(
        {'pdnode_prefill_instances': ['0-3']},
        ["pdnode_prefill_instances[0]='0-3': must be a mapping of instance keys. Fix: write e.g. {gpus: [0, 1, 2, 3], tp_size: 4}."],
        id='instance_not_mapping',
    ),
    pytest.param(
        {'pdnode_prefill_instances': {'gpus': [0, 1, 2, 3]}},
        ["pdnode_prefill_instances={'gpus': [0, 1, 2, 3]}: must be a list of instance mappings. Fix: write pdnode_prefill_instances as a list of instance mappings (prefill instances of the host, each a mapping of INSTANCE_KEYS (below))."],
        id='instances_not_list',
    ),
    pytest.param(
        {'prefill[0]': {'gpu': [0]}},
        ['pdnode_prefill_instances[0].gpu=[0]: is not a key of a prefill instance. Fix: use one of name, hosts, gpus, tp_size, dp_size, attn_dp_size, ep_size, moe_dense_tp_size, enable_dp_lm_head, port, bootstrap_port, nccl_port, dist_init_port, mem_fraction_static, extra_args.'],
        id='instance_key_unknown',
    ),
    pytest.param(
        {'decode[0]': {'bootstrap_port': 9000}},
        ['pdnode_decode_instances[0].bootstrap_port=9000: is not a key of a decode instance. Fix: use one of name, hosts, gpus, tp_size, dp_size, attn_dp_size, ep_size, moe_dense_tp_size, enable_dp_lm_head, port, nccl_port, dist_init_port, mem_fraction_static, extra_args.'],
        id='bootstrap_on_decode',
    ),
    pytest.param(
        {'prefill[0]': {'name': 'Prefill_A'}},
        ["pdnode_prefill_instances[0].name='Prefill_A': must be 1-12 characters a-z 0-9 (it names the unit and its files). Fix: use e.g. a, b or 0."],
        id='instance_name',
    ),
    pytest.param(
        {'pdnode_prefill_instances': [{'gpus': [0, 1], 'name': 'a'}, {'gpus': [2, 3], 'name': 'a'}]},
        ["pdnode_prefill_instances[1].name='a': two prefill instances are named 'a'. Fix: give each instance its own name."],
        id='instance_name_twice',
    ),
    pytest.param(
        {'pdnode_transfer_backend': 'mooncake_tcp'},
        ["pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5_7'}: RDMA devices cannot be used with pdnode_transfer_backend='mooncake_tcp' (SGLang silently drops --disaggregation-ib-device there, so the mapping would do nothing). Fix: remove pdnode_ib_devices, or use the mooncake backend over RDMA."],
        id='ib_tcp',
    ),
    pytest.param(
        {'pdnode_ib_devices': {0: 'mlx5_0', 1: 'mlx5_1'}},
        ["pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1'}: has no device for GPUs [2, 3, 4, 5, 6, 7] used by the engine instances (SGLang raises 'No IB devices configured for GPU n'). Fix: map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)."],
        id='ib_unmapped',
    ),
    pytest.param(
        {'pdnode_ib_devices': {0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5 7'}},
        ["pdnode_ib_devices.7='mlx5 7': must be an RDMA device name or a comma list of them. Fix: write the name as in /sys/class/infiniband, e.g. mlx5_0.", "pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5 7'}: has no device for GPUs [7] used by the engine instances (SGLang raises 'No IB devices configured for GPU n'). Fix: map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)."],
        id='ib_badname',
    ),
    pytest.param(
        {'pdnode_transfer_backend': 'fake', 'pdnode_ib_devices': {}},
        ["pdnode_transfer_backend='fake': decode-only benchmarking; prefill refuses it and it cannot move KV from P to D. Fix: use one of mooncake, mooncake_tcp, nixl."],
        id='fake',
    ),
    pytest.param(
        {'pdnode_router_port': 30000, 'prefill[0]': {'port': 30000}},
        ["pdnode_prefill_instances[0].port=30000: prefill-0's port and the router's port are both port 30000. Fix: set pdnode_prefill_instances[0].port: 30002 (the nearest free port), or leave the instances' ports out so the plan allocates them."],
        id='port_router',
    ),
    pytest.param(
        {'decode[0]': {'port': 30001, 'nccl_port': 30235}},
        ["pdnode_decode_instances[0].nccl_port=30235: decode-0's nccl_port and its port+233..+239 (30234-30240) overlap at port 30235 (an instance with DP attention also binds its port+233..+239). Fix: set pdnode_decode_instances[0].nccl_port: 30241 (the nearest free port), or leave the instances' ports out so the plan allocates them."],
        id='port_internal',
    ),
    pytest.param(
        {'pdnode_router_metrics_port': 80},
        ['pdnode_router_metrics_port=80: must be an unprivileged TCP port (1024-65535). Fix: choose a port in 1024-65535.'],
        id='port_range',
    ),
    pytest.param(
        {'prefill[0]': {'port': 80}},
        ['pdnode_prefill_instances[0].port=80: must be an unprivileged TCP port (1024-65535). Fix: choose a port in 1024-65535, or leave it out to have one allocated.'],
        id='port_range_instance',
    ),
    pytest.param(
        {'decode[0]': {'port': 65400}},
        ['pdnode_decode_instances[0].port=65400: must be an unprivileged TCP port (1024-65296) (with DP attention it also binds port+233..+239). Fix: choose a port in 1024-65296, or leave it out to have one allocated.'],
        id='port_range_dp_attention',
    ),
    pytest.param(
        {'decode[0]': {'extra_args': {'disaggregation_decode_tp': 4}}},
        ["pdnode_decode_instances[0].extra_args.disaggregation_decode_tp=4: was removed from SGLang in 2026-03 (now an unknown flag). Fix: decode's TP is its own tp_size: set tp_size on the decode instance."],
        id='removed',
    ),
    pytest.param(
        {'decode[0]': {'attn_dp_size': None, 'enable_dp_lm_head': None, 'extra_args': {'enable_dp_attention': True, 'dp_size': 4}}},
        ['pdnode_decode_instances[0].extra_args.enable_dp_attention=True: is the deprecated DP-attention spelling (--enable-dp-attention --dp-size N; rewritten by SGLang to attn_dp_size=N and rejected by its YAML config). Fix: remove enable_dp_attention and dp_size from extra_args and set attn_dp_size: 4 on the instance.'],
        id='deprecated_dp',
    ),
    pytest.param(
        {'prefill[0]': {'extra_args': {'tp_size': 8}}},
        ["pdnode_prefill_instances[0].extra_args.tp_size=8: is set by the plan from the instance's tp_size. Fix: remove it from extra_args and set tp_size on the instance."],
        id='owned',
    ),
    pytest.param(
        {'prefill[0]': {'extra_args': {'gpu_id_step': 2}}},
        ["pdnode_prefill_instances[0].extra_args.gpu_id_step=2: is set by the plan from the instance's gpus (their spacing). Fix: remove it from extra_args."],
        id='owned_gpu_id_step',
    ),
    pytest.param(
        {'prefill[0]': {'extra_args': {'cuda_graph_max_bs': 8}}},
        ['pdnode_prefill_instances[0].extra_args.cuda_graph_max_bs=8: is not a ServerArgs field of SGLang 0.5.23. Fix: use a field name from `python -m sglang.launch_server --help` with underscores.'],
        id='unknown_arg',
    ),
    pytest.param(
        {'pdnode_decode_dp_size': 4},
        ['pdnode_decode_dp_size=4: is not a variable this bundle knows. Fix: remove or rename it (dp_size is a key of each entry of pdnode_decode_instances).'],
        id='unknown_var',
    ),
    pytest.param(
        {'pdnode_decode_tp_size': 4, 'pdnode_decode_attn_dp_size': 4},
        ['pdnode_decode_tp_size=4: the one-instance variables (pdnode_decode_tp_size, pdnode_decode_attn_dp_size) were replaced by a list of instances per role (one spelling for one fact; docs/inventory.md). Fix: write pdnode_decode_instances: [{tp_size: 4, attn_dp_size: 4}] and remove the old variables.'],
        id='retired',
    ),
    pytest.param(
        {'prefill[0]': {'tp_size': '4'}},
        ["pdnode_prefill_instances[0].tp_size='4': must be an integer. Fix: write tp_size as an integer."],
        id='type',
    ),
    pytest.param(
        {'pdnode_gpu_count': '8'},
        ["pdnode_gpu_count='8': must be an integer. Fix: write pdnode_gpu_count as an integer (GPUs on the host) unquoted; "
         "-e pdnode_gpu_count=... is a string too: on the command line give JSON, -e '{\"pdnode_gpu_count\": ...}'."],
        id='type_variable',
    ),
    pytest.param(
        {'prefill[0]': {'extra_args': {'chunked_prefill_size': 8192}, 'tp_size': '{{ tp }}'}},
        ["pdnode_prefill_instances[0].tp_size='{{ tp }}': templated values are not supported in the node description. Fix: write the literal value; the plan is computed without Ansible."],
        id='instance_template',
    ),
    pytest.param(
        {'pdnode_model_path': None},
        ['pdnode_model_path=None: is required and not set. Fix: set pdnode_model_path (absolute path of the model directory on the host (path rule below)) in group_vars.'],
        id='required',
    ),
    pytest.param(
        {'pdnode_model_path': 'deepseek-ai/DeepSeek-V3'},
        ["pdnode_model_path='deepseek-ai/DeepSeek-V3': must be an absolute local path (otherwise SGLang and the router try to reach a model hub). Fix: download the model to the host and give its directory."],
        id='relpath',
    ),
    pytest.param(
        {'pdnode_worker_host': '0.0.0.0'},
        ["pdnode_worker_host='0.0.0.0': prefill and decode must listen on loopback only (the router is the node's one public endpoint). Fix: use 127.0.0.1."],
        id='worker_host',
    ),
    pytest.param(
        {'pdnode_router_extra_args': {'dp_aware': True}},
        ['pdnode_router_extra_args.dp_aware=True: is broken in PD mode in sglang-router 0.3.2. Fix: remove it.'],
        id='dp_aware',
    ),
    pytest.param(
        {'pdnode_router_extra_args': {'port': 30000}},
        ['pdnode_router_extra_args.port=30000: is set by the plan from pdnode_router_port. Fix: remove it from pdnode_router_extra_args.'],
        id='router_owned',
    ),
    pytest.param(
        {'pdnode_router_policy': 'bucket'},
        ["pdnode_router_policy='bucket': not a PD routing policy pdnode offers. Fix: use one of random, round_robin, cache_aware, power_of_two."],
        id='policy',
    ),
    pytest.param(
        {'pdnode_engine': 'vllm'},
        ["pdnode_engine='vllm': unknown engine. Fix: use sglang (real) or sim (stand-in)."],
        id='engine',
    ),
    pytest.param(
        {'pdnode_model_kind': 'mla'},
        ["pdnode_model_kind='mla': unknown model kind. Fix: use one of moe_mla, moe, dense."],
        id='kind',
    ),
    pytest.param(
        {'pdnode_verify_thresholds': {'ttft_p99': 1}},
        ['pdnode_verify_thresholds.ttft_p99=1: is not a known threshold. Fix: use one of ttft_p50_max_s, ttft_p99_max_s, itl_p50_max_s, itl_p99_max_s, e2e_p99_max_s, decode_throughput_min_tok_s, kv_transfer_speed_min_gb_s.'],
        id='threshold',
    ),
    pytest.param(
        {'pdnode_verify_thresholds': {'ttft_p99_max_s': -1}},
        ['pdnode_verify_thresholds.ttft_p99_max_s=-1: must be a positive number. Fix: write a number in the unit of its name.'],
        id='threshold_neg',
    ),
    pytest.param(
        {'decode[0]': {'mem_fraction_static': 1.5}},
        ['pdnode_decode_instances[0].mem_fraction_static=1.5: must be between 0 and 1. Fix: use e.g. 0.85.'],
        id='memfrac',
    ),
    pytest.param(
        {'pdnode_model_served_name': '{{ x }}'},
        ["pdnode_model_served_name='{{ x }}': templated values are not supported in the node description. Fix: write the literal value; the plan is computed without Ansible."],
        id='template',
    ),
]


@pytest.mark.parametrize(("changes", "expected"), CASES)
def test_rule_reports_exact_lines(gpu01_vars, changes, expected):
    with pytest.raises(PlanError) as info:
        build_plan(changed(gpu01_vars, changes))
    assert [str(p) for p in info.value.problems] == expected


def test_gpu01_is_valid_and_matches_the_design(gpu01_vars):
    plan = build_plan(gpu01_vars, "gpu01")
    assert plan.warnings == []
    assert list(plan.services) == ["prefill-0", "decode-0", "router"]
    assert {s["id"]: s["gpus"] for s in plan.engines()} == {"prefill-0": [0, 1, 2, 3], "decode-0": [4, 5, 6, 7]}
    p, d = plan.services["prefill-0"]["args"], plan.services["decode-0"]["args"]
    assert (p["tp_size"], p["base_gpu_id"], p["gpu_id_step"], p["disaggregation_mode"]) == (4, 0, 1, "prefill")
    assert "attn_dp_size" not in p and "ep_size" not in p and "dp_size" not in p
    assert (d["tp_size"], d["attn_dp_size"], d["ep_size"], d["base_gpu_id"]) == (4, 4, 4, 4)
    assert d["disaggregation_mode"] == "decode"
    assert p["disaggregation_ib_device"] == {"0": "mlx5_0", "1": "mlx5_1", "2": "mlx5_2", "3": "mlx5_3"}
    assert d["disaggregation_ib_device"] == {"4": "mlx5_4", "5": "mlx5_5", "6": "mlx5_6", "7": "mlx5_7"}
    assert p["host"] == d["host"] == "127.0.0.1"
    assert (p["port"], d["port"], p["nccl_port"], d["nccl_port"]) == (30000, 30001, 31000, 31100)
    assert plan.services["prefill-0"]["bootstrap_port"] == p["disaggregation_bootstrap_port"] == 8998


@pytest.mark.parametrize(("inventory", "layout"), [
    ("gpu01-2p1d", {"prefill-0": [0, 1], "prefill-1": [2, 3], "decode-0": [4, 5, 6, 7]}),
    ("gpu01-1p2d", {"prefill-0": [0, 1, 2, 3], "decode-0": [4, 5], "decode-1": [6, 7]}),
])
def test_the_xpyd_examples_are_valid(inventory, layout):
    plan = build_plan(variables(inventory))
    assert {s["id"]: s["gpus"] for s in plan.engines()} == layout
    assert list(plan.services)[-1] == "router"
    router = plan.services["router"]["args"]
    assert router["prefill"] == [[s["url"], s["bootstrap_port"]] for s in plan.engines("prefill")]
    assert router["decode"] == [s["url"] for s in plan.engines("decode")]
    assert len({s["url"] for s in plan.engines()}) == len(layout)


def test_router_gets_the_bootstrap_port_after_the_prefill_url(gpu01_vars):
    argv = build_plan(gpu01_vars).router_argv()
    i = argv.index("--prefill")
    assert argv[i + 1:i + 3] == ["http://127.0.0.1:30000", "8998"]
    assert argv[argv.index("--decode") + 1] == "http://127.0.0.1:30001"
    assert argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--pd-disaggregation" in argv


def test_all_problems_are_reported_at_once(gpu01_vars):
    bad = changed(gpu01_vars, {"decode[0]": {"attn_dp_size": 3}, "prefill[0]": {"port": 8000},
                               "pdnode_engine": "vllm"})
    with pytest.raises(PlanError) as info:
        build_plan(bad)
    fields = [p.field for p in info.value.problems]
    assert fields == ["pdnode_engine", "pdnode_decode_instances[0].tp_size", "pdnode_prefill_instances[0].port"]


def test_dp_attention_ports_are_reserved_only_with_dp_attention(gpu01_vars):
    plan = build_plan(changed(gpu01_vars, {"decode[0]": {"attn_dp_size": 1, "enable_dp_lm_head": False,
                                                         "port": 30001, "nccl_port": 30235}}))
    assert plan.ports["decode-0.nccl_port"] == 30235
    assert not any("+" in name for name in plan.ports)
    plan = build_plan(gpu01_vars)
    assert [plan.ports[f"decode-0.port+{off}"] for off in range(233, 240)] == list(range(30234, 30241))


def test_prefill_dp_attention_is_a_warning_not_an_error(gpu01_vars):
    plan = build_plan(changed(gpu01_vars, {"prefill[0]": {"attn_dp_size": 4}}))
    assert [str(w) for w in plan.warnings] == [
        "pdnode_prefill_instances[0].attn_dp_size=4: DP attention on prefill makes each GPU attend one request: "
        "TTFT gets several times worse. Fix: use plain TP on prefill (attn_dp_size 1)."]
    assert plan.services["prefill-0"]["args"]["attn_dp_size"] == 4


def test_dense_model_without_ep(gpu01_vars):
    plan = build_plan(changed(gpu01_vars, {"pdnode_model_kind": "dense",
                                           "decode[0]": {"ep_size": None, "moe_dense_tp_size": None}}))
    assert plan.warnings == []
    for args in engine_args(plan).values():
        assert "ep_size" not in args and "moe_dense_tp_size" not in args


def test_instance_names_name_the_units_and_files(gpu01_vars):
    plan = build_plan(changed(gpu01_vars, {"prefill[0]": {"name": "a"}, "decode[0]": {"name": "big"}}))
    assert list(plan.services) == ["prefill-a", "decode-big", "router"]
    s = plan.services["decode-big"]
    assert (s["unit"], s["config"], s["env_file"]) == (
        "sglang-pd-decode-big.service", "/etc/sglang-pd/decode-big.json", "/etc/sglang-pd/decode-big.env")
    assert plan.ports["decode-big.port"] == 30001


def test_settings_hold_the_normalised_instances(gpu01_vars):
    """Every key filled in, ports allocated: what Ansible and the verifier read."""
    settings = build_plan(gpu01_vars).settings
    (p,), (d,) = settings["pdnode_prefill_instances"], settings["pdnode_decode_instances"]
    assert (p["name"], p["dp_size"], p["attn_dp_size"], p["port"], p["bootstrap_port"], p["nccl_port"]) == (
        "0", 1, 1, 30000, 8998, 31000)
    assert "bootstrap_port" not in d and (d["port"], d["nccl_port"]) == (30001, 31100)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pdnode.commands.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=30)


def test_cli_check_ok():
    r = _cli("check", "inventories/gpu01")
    assert r.returncode == 0, r.stderr
    assert "host gpu01 OK (prefill-0 GPUs 0-3, decode-0 GPUs 4-7; " in r.stdout


def _article_inventory(tmp_path):
    inv = tmp_path / "inv"
    subprocess.run(["cp", "-r", str(GPU01), str(inv)], check=True)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu01.yml").write_text(
        "---\npdnode_decode_instances:\n  - gpus: [4]\n    tp_size: 1\n    attn_dp_size: 4\n")
    return inv


def test_cli_check_article_decode_exits_1_with_one_line(tmp_path):
    r = _cli("check", str(_article_inventory(tmp_path)))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "1 problem" in lines[0], r.stderr
    assert lines[1].strip().startswith("pdnode_decode_instances[0].tp_size=1: is not divisible by attn_dp_size=4")
    assert "Traceback" not in r.stderr


def test_cli_check_names_the_file_that_set_the_instance(tmp_path):
    r = _cli("check", str(_article_inventory(tmp_path)))
    assert "host_vars/gpu01.yml" in r.stderr.strip().splitlines()[1], r.stderr


@pytest.mark.parametrize(("content", "needle"), [
    ("all: [unclosed", "not valid YAML"),
    ("---\nfoo: {}\n", "Ansible read no hosts from it"),
])
def test_cli_unreadable_inventory_exits_2(tmp_path, content, needle):
    (tmp_path / "hosts.yml").write_text(content)
    r = _cli("check", str(tmp_path))
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_cli_render_prints_the_serverargs_json():
    r = _cli("render", "inventories/gpu01", "--role", "decode-0")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["attn_dp_size"] == 4


def test_cli_render_an_unknown_service_exits_2():
    r = _cli("render", "inventories/gpu01", "--role", "decode")
    assert r.returncode == 2
    assert r.stderr.strip() == ("pdnode: no service 'decode' in this plan (services: prefill-0, decode-0, router)")


def test_cli_explain_table():
    r = _cli("explain", "inventories/gpu01-2p1d")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["service", "unit", "GPUs", "parallelism", "listens", "on"]
    assert lines[2].split()[:4] == ["prefill-0", "sglang-pd-prefill-0.service", "0-1", "TP"]
    assert lines[3].startswith("prefill-1") and ":8999 (bootstrap)" in lines[3]
    assert "attn-DP 4 (attn-TP 1), EP 4" in lines[4] and ":30234-30240 (internal)" in lines[4]
    assert lines[5].startswith("router")
    # 2P1D: two pairs for the per-pair probe beside the router
    assert "sglang-pd-pair-probe.timer sends one request to each prefill-decode pair (2) every 60 s" in r.stdout


def test_check_does_not_load_the_verifier():
    """`pdnode check` must stay well under a second: it never imports the HTTP/metrics code."""
    code = ("import sys; from pdnode.commands.cli import main; rc = main(['check', 'inventories/gpu01']); "
            "heavy = [m for m in ('pdnode.verify.engine', 'prometheus_client') if m in sys.modules]; "
            "sys.exit(rc or (3 if heavy else 0))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0, r.stderr
