"""Every rule of the plan core, with the exact line a user sees.

Each case starts from inventories/gpu01 (which must be valid), changes a few variables
(None removes one) and lists every problem the plan reports, in order.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdnode.inventory import load_inventory
from pdnode.plan import PlanError, build_plan

ROOT = Path(__file__).resolve().parents[1]
GPU01 = ROOT / "inventories" / "gpu01"


@pytest.fixture(scope="module")
def gpu01_vars():
    return load_inventory(GPU01).variables


def _apply(base, changes):
    v = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            v.pop(key, None)
        else:
            v[key] = value
    return v


CASES = [
    pytest.param(
        {'pdnode_decode_tp_size': 1, 'pdnode_decode_attn_dp_size': 4, 'pdnode_decode_ep_size': 1},
        ["pdnode_decode_gpus=[4, 5, 6, 7]: has 4 GPUs but pdnode_decode_tp_size=1 (with DP attention tp_size is still the instance's total GPU count). Fix: give decode exactly tp_size GPUs, or set pdnode_decode_tp_size=4.", "pdnode_decode_tp_size=1: is not divisible by the attention-DP size pdnode_decode_attn_dp_size=4 (SGLang asserts tp_size % attn_dp_size == 0; tp_size counts ALL GPUs of the instance, attention-TP per DP rank is tp_size/attn_dp_size). Fix: set pdnode_decode_tp_size to the instance's GPU count and pdnode_decode_attn_dp_size to a divisor of it (e.g. tp_size=4 with attn_dp_size=4)."],
        id='article_decode',
    ),
    pytest.param(
        {'pdnode_decode_attn_dp_size': 3},
        ["pdnode_decode_tp_size=4: is not divisible by the attention-DP size pdnode_decode_attn_dp_size=3 (SGLang asserts tp_size % attn_dp_size == 0; tp_size counts ALL GPUs of the instance, attention-TP per DP rank is tp_size/attn_dp_size). Fix: set pdnode_decode_tp_size to the instance's GPU count and pdnode_decode_attn_dp_size to a divisor of it (e.g. tp_size=4 with attn_dp_size=4)."],
        id='tp_not_div',
    ),
    pytest.param(
        {'pdnode_decode_ep_size': 3},
        ['pdnode_decode_ep_size=3: does not divide pdnode_decode_tp_size=4 (EP is carved out of the TP world). Fix: use an ep_size that divides 4, e.g. 4.'],
        id='ep_not_div',
    ),
    pytest.param(
        {'pdnode_model_kind': 'dense', 'pdnode_decode_moe_dense_tp_size': None},
        ["pdnode_decode_ep_size=4: expert parallelism needs a MoE model but pdnode_model_kind='dense'. Fix: set pdnode_decode_ep_size: 1 for a dense model."],
        id='ep_dense',
    ),
    pytest.param(
        {'pdnode_decode_moe_dense_tp_size': 2},
        ['pdnode_decode_moe_dense_tp_size=2: must be unset, 1 or tp_size (4). Fix: use 1 (dense layers data-parallel) or leave it unset.'],
        id='dense_tp_2',
    ),
    pytest.param(
        {'pdnode_decode_attn_dp_size': 1},
        ['pdnode_decode_enable_dp_lm_head=True: needs DP attention (pdnode_decode_attn_dp_size > 1). Fix: set pdnode_decode_attn_dp_size > 1 or set this to false.'],
        id='lm_head_no_dp',
    ),
    pytest.param(
        {'pdnode_decode_ep_size': 2, 'pdnode_decode_extra_args': {'moe_a2a_backend': 'deepep'}},
        ["pdnode_decode_ep_size=2: must equal tp_size=4 with an all-to-all MoE backend (moe_a2a_backend='deepep'). Fix: set pdnode_decode_ep_size: 4."],
        id='a2a',
    ),
    pytest.param(
        {'pdnode_decode_gpus': [6, 7, 8, 9]},
        ['pdnode_decode_gpus=[6, 7, 8, 9]: GPU ids [8, 9] do not exist on a host with pdnode_gpu_count=8. Fix: use ids 0..7.', "pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5_7'}: has no device for GPUs [8, 9] used by prefill/decode (SGLang raises 'No IB devices configured for GPU n'). Fix: map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)."],
        id='gpu_missing',
    ),
    pytest.param(
        {'pdnode_decode_gpus': [3, 4, 5, 6]},
        ['pdnode_decode_gpus=[3, 4, 5, 6]: GPUs [3] are also in pdnode_prefill_gpus. Fix: give each GPU to one role.'],
        id='gpu_twice',
    ),
    pytest.param(
        {'pdnode_prefill_gpus': [0, 0, 1, 2]},
        ['pdnode_prefill_gpus=[0, 0, 1, 2]: lists a GPU more than once. Fix: list each GPU once.'],
        id='gpu_dup',
    ),
    pytest.param(
        {'pdnode_prefill_gpus': [0, 2, 1, 3]},
        ['pdnode_prefill_gpus=[0, 2, 1, 3]: must be contiguous and ascending (SGLang places rank r on base_gpu_id + r). Fix: use a range such as [0, 1, 2, 3].'],
        id='gpu_noncontig',
    ),
    pytest.param(
        {'pdnode_prefill_gpus': [0, 1]},
        ["pdnode_prefill_gpus=[0, 1]: has 2 GPUs but pdnode_prefill_tp_size=4 (with DP attention tp_size is still the instance's total GPU count). Fix: give prefill exactly tp_size GPUs, or set pdnode_prefill_tp_size=2."],
        id='gpu_count',
    ),
    pytest.param(
        {'pdnode_transfer_backend': 'mooncake_tcp'},
        ["pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5_7'}: RDMA devices cannot be used with pdnode_transfer_backend='mooncake_tcp' (SGLang silently drops --disaggregation-ib-device there, so the mapping would do nothing). Fix: remove pdnode_ib_devices, or use the mooncake backend over RDMA."],
        id='ib_tcp',
    ),
    pytest.param(
        {'pdnode_ib_devices': {0: 'mlx5_0', 1: 'mlx5_1'}},
        ["pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1'}: has no device for GPUs [2, 3, 4, 5, 6, 7] used by prefill/decode (SGLang raises 'No IB devices configured for GPU n'). Fix: map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)."],
        id='ib_unmapped',
    ),
    pytest.param(
        {'pdnode_ib_devices': {0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5 7'}},
        ["pdnode_ib_devices.7='mlx5 7': must be an RDMA device name or a comma list of them. Fix: write the name as in /sys/class/infiniband, e.g. mlx5_0.", "pdnode_ib_devices={0: 'mlx5_0', 1: 'mlx5_1', 2: 'mlx5_2', 3: 'mlx5_3', 4: 'mlx5_4', 5: 'mlx5_5', 6: 'mlx5_6', 7: 'mlx5 7'}: has no device for GPUs [7] used by prefill/decode (SGLang raises 'No IB devices configured for GPU n'). Fix: map every GPU of prefill and decode to its closest NIC (see `nvidia-smi topo -m`)."],
        id='ib_badname',
    ),
    pytest.param(
        {'pdnode_transfer_backend': 'fake', 'pdnode_ib_devices': {}},
        ["pdnode_transfer_backend='fake': decode-only benchmarking; prefill refuses it and it cannot move KV from P to D. Fix: use one of mooncake, mooncake_tcp, nixl."],
        id='fake',
    ),
    pytest.param(
        {'pdnode_router_port': 30000},
        ['pdnode_router_port=30000: port 30000 is used by both pdnode_prefill_port and pdnode_router_port. Fix: give every listener its own port (decode also binds its port+233..+239).'],
        id='port_dup',
    ),
    pytest.param(
        {'pdnode_decode_nccl_port': 30235},
        ['pdnode_decode_port+234=30235: port 30235 is used by both pdnode_decode_nccl_port and pdnode_decode_port+234. Fix: give every listener its own port (decode also binds its port+233..+239).'],
        id='port_internal',
    ),
    pytest.param(
        {'pdnode_router_metrics_port': 80},
        ['pdnode_router_metrics_port=80: must be an unprivileged TCP port (1024-65535). Fix: choose a port in 1024-65535.'],
        id='port_range',
    ),
    pytest.param(
        {'pdnode_decode_extra_args': {'disaggregation_decode_tp': 4}},
        ["pdnode_decode_extra_args.disaggregation_decode_tp=4: was removed from SGLang in 2026-03 (now an unknown flag). Fix: decode's TP is its own tp_size: set pdnode_decode_tp_size."],
        id='removed',
    ),
    pytest.param(
        {'pdnode_decode_extra_args': {'enable_dp_attention': True}},
        ["pdnode_decode_extra_args.enable_dp_attention=True: is the deprecated DP-attention spelling (--enable-dp-attention --dp-size N; rewritten to attn_dp_size=N and rejected by SGLang's YAML config). Fix: remove it and set pdnode_decode_attn_dp_size."],
        id='deprecated_dp',
    ),
    pytest.param(
        {'pdnode_prefill_extra_args': {'tp_size': 8}},
        ['pdnode_prefill_extra_args.tp_size=8: is set by the plan from pdnode_prefill_tp_size. Fix: remove it from pdnode_prefill_extra_args.'],
        id='owned',
    ),
    pytest.param(
        {'pdnode_prefill_extra_args': {'cuda_graph_max_bs': 8}},
        ['pdnode_prefill_extra_args.cuda_graph_max_bs=8: is not a ServerArgs field of SGLang 0.5.23. Fix: use a field name from `python -m sglang.launch_server --help` with underscores.'],
        id='unknown_arg',
    ),
    pytest.param(
        {'pdnode_decode_dp_size': 4},
        ['pdnode_decode_dp_size=4: is not a variable this bundle knows. Fix: remove or rename it (did you mean pdnode_decode_tp_size?).'],
        id='unknown_var',
    ),
    pytest.param(
        {'pdnode_prefill_tp_size': '4'},
        ["pdnode_prefill_tp_size='4': must be an integer. Fix: write pdnode_prefill_tp_size as an integer (prefill tensor parallel size (= its GPU count))."],
        id='type',
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
        ["pdnode_router_policy='bucket': not a PD routing policy of sglang-router 0.3.2. Fix: use one of random, round_robin, cache_aware, power_of_two."],
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
        {'pdnode_decode_mem_fraction_static': 1.5},
        ['pdnode_decode_mem_fraction_static=1.5: must be between 0 and 1. Fix: use e.g. 0.85.'],
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
        build_plan(_apply(gpu01_vars, changes))
    assert [str(p) for p in info.value.problems] == expected


def test_gpu01_is_valid_and_matches_the_design(gpu01_vars):
    plan = build_plan(gpu01_vars, "gpu01")
    assert plan.warnings == []
    assert plan.gpus == {"prefill": [0, 1, 2, 3], "decode": [4, 5, 6, 7]}
    p, d = plan.prefill, plan.decode
    assert (p["tp_size"], p["base_gpu_id"], p["disaggregation_mode"]) == (4, 0, "prefill")
    assert "attn_dp_size" not in p and "ep_size" not in p
    assert (d["tp_size"], d["attn_dp_size"], d["ep_size"], d["base_gpu_id"]) == (4, 4, 4, 4)
    assert d["disaggregation_mode"] == "decode"
    assert p["disaggregation_ib_device"] == {"0": "mlx5_0", "1": "mlx5_1", "2": "mlx5_2", "3": "mlx5_3"}
    assert d["disaggregation_ib_device"] == {"4": "mlx5_4", "5": "mlx5_5", "6": "mlx5_6", "7": "mlx5_7"}
    assert p["host"] == d["host"] == "127.0.0.1"
    assert p["nccl_port"] != d["nccl_port"]


def test_router_gets_the_bootstrap_port_after_the_prefill_url(gpu01_vars):
    argv = build_plan(gpu01_vars).router_argv()
    i = argv.index("--prefill")
    assert argv[i + 1:i + 3] == ["http://127.0.0.1:30000", "8998"]
    assert argv[argv.index("--decode") + 1] == "http://127.0.0.1:30001"
    assert argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--pd-disaggregation" in argv


def test_all_problems_are_reported_at_once(gpu01_vars):
    bad = _apply(gpu01_vars, {"pdnode_decode_attn_dp_size": 3, "pdnode_router_port": 30000,
                              "pdnode_engine": "vllm"})
    with pytest.raises(PlanError) as info:
        build_plan(bad)
    fields = [p.field for p in info.value.problems]
    assert fields == ["pdnode_engine", "pdnode_decode_tp_size", "pdnode_router_port"]


def test_decode_internal_ports_count_only_with_dp_attention(gpu01_vars):
    plan = build_plan(_apply(gpu01_vars, {"pdnode_decode_attn_dp_size": 1, "pdnode_decode_enable_dp_lm_head": False,
                                          "pdnode_decode_nccl_port": 30235}))
    assert plan.ports["pdnode_decode_nccl_port"] == 30235
    assert not any("+" in name for name in plan.ports)


def test_prefill_dp_attention_is_a_warning_not_an_error(gpu01_vars):
    plan = build_plan(_apply(gpu01_vars, {"pdnode_prefill_attn_dp_size": 4, "pdnode_decode_port": 30100}))
    assert [str(w) for w in plan.warnings] == [
        "pdnode_prefill_attn_dp_size=4: DP attention on prefill makes each GPU attend one request: "
        "TTFT gets several times worse. Fix: use plain TP on prefill (attn_dp_size 1)."]


def test_dense_model_without_ep(gpu01_vars):
    plan = build_plan(_apply(gpu01_vars, {"pdnode_model_kind": "dense", "pdnode_decode_ep_size": 1,
                                          "pdnode_decode_moe_dense_tp_size": None}))
    assert "ep_size" not in plan.decode and "moe_dense_tp_size" not in plan.decode


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pdnode.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=30)


def test_cli_check_ok():
    r = _cli("check", "inventories/gpu01")
    assert r.returncode == 0, r.stderr
    assert "host gpu01 OK" in r.stdout


def test_cli_check_article_decode_exits_1_with_one_line(tmp_path):
    inv = tmp_path / "inv"
    subprocess.run(["cp", "-r", str(GPU01), str(inv)], check=True)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu01.yml").write_text(
        "---\npdnode_decode_tp_size: 1\npdnode_decode_gpus: [4]\npdnode_decode_attn_dp_size: 4\n"
        "pdnode_decode_ep_size: 1\n")
    r = _cli("check", str(inv))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "1 problem" in lines[0]
    assert "pdnode_decode_tp_size=1" in lines[1] and "pdnode_decode_attn_dp_size=4" in lines[1]
    assert "host_vars/gpu01.yml" in lines[1]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("content", "needle"), [
    ("all: [unclosed", "not valid YAML"),
    ("---\nfoo: {}\n", "expected a top-level 'all:' group"),
])
def test_cli_unreadable_inventory_exits_2(tmp_path, content, needle):
    (tmp_path / "hosts.yml").write_text(content)
    r = _cli("check", str(tmp_path))
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_cli_render_prints_the_serverargs_json():
    r = _cli("render", "inventories/gpu01", "--role", "decode")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["attn_dp_size"] == 4


def test_cli_explain_table():
    r = _cli("explain", "inventories/gpu01")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["role", "GPUs", "parallelism", "listens", "on"]
    assert lines[2].startswith("prefill  0-3") and "TP 4" in lines[2]
    assert "attn-DP 4 (attn-TP 1), EP 4" in lines[3]


def test_check_does_not_load_the_verifier():
    """`pdnode check` must stay well under a second: it never imports the HTTP/metrics code."""
    code = ("import sys; from pdnode.cli import main; rc = main(['check', 'inventories/gpu01']); "
            "heavy = [m for m in ('pdnode.verify.engine', 'prometheus_client') if m in sys.modules]; "
            "sys.exit(rc or (3 if heavy else 0))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0, r.stderr
