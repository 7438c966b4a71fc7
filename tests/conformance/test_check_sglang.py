"""`pdnode check` asks SGLang 0.5.23 itself (issue 17, section 2).

Each case changes one instance's extra_args on inventories/gpu01 to something pdnode's
own rules accept and SGLang refuses at start. The plans' ServerArgs are judged in one
batch (one SGLang import), as pdnode check judges a layout; then the CLI, reading those
cached verdicts, must print the refusal in pdnode's one-line form: the instance field,
SGLang's reason, the fix -- and exit 1. Controls: the shipped layouts and a setting
SGLang accepts pass.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdnode.core.rules import sglang_judge
from pdnode.core.inventory.read import load_inventory
from pdnode.core.plan.build import build_plan

pytestmark = pytest.mark.conformance

REPO = Path(__file__).resolve().parents[2]
GPU01 = REPO / "inventories" / "gpu01"

# name -> ({role: extra_args merged into instance 0}, the part of SGLang's reason expected)
REFUSED = {
    # (page_size and kv_cache_dtype go on both roles: pdnode refuses a KV layout that differs, disagg-kv-layout-same)
    "chunked_prefill_not_multiple_of_page": ({"prefill": {"chunked_prefill_size": 1000, "page_size": 64},
                                              "decode": {"page_size": 64}},
                                             "chunked_prefill_size must be divisible by page_size"),
    "page_size_zero": ({"prefill": {"page_size": 0}, "decode": {"page_size": 0}}, "ZeroDivisionError"),
    "tp_lm_head_all_to_all_with_dp_lm_head": ({"decode": {"enable_tp_lm_head_all_to_all": True}},
                                              "incompatible with --enable-dp-lm-head"),
    "priority_with_lpm": ({"prefill": {"enable_priority_scheduling": True, "schedule_policy": "lpm"}},
                          "schedule_policy must be 'fcfs' or 'lof'"),
    "negative_conservativeness": ({"decode": {"schedule_conservativeness": -1.0}}, "must be non-negative"),
    "torch_compile_without_graph_padding": ({"decode": {"enable_torch_compile": True,
                                                        "disable_cuda_graph_padding": True}},
                                            "incompatible with --enable-torch-compile"),
    "two_batch_overlap_without_attn_dp": ({"prefill": {"enable_two_batch_overlap": True}}, "attention DP"),
    "ngram_with_attn_dp": ({"decode": {"speculative_algorithm": "NGRAM"}}, "does not support dp attention"),
    # (grpc_port opens a listener without key checks: allowed explicitly, as an operator would)
    "grpc_port_equals_port": ({"prefill": {"grpc_port": 30000}, "vars": {"pdnode_allow_exposing_args": ["grpc_port"]}},
                              "must differ from --port"),
    "hicache_on_decode": ({"decode": {"enable_hierarchical_cache": True}}, "mutually exclusive"),
    "prefill_complete_with_attn_tp": ({"prefill": {"disaggregation_decode_allocation_policy": "prefill_complete"},
                                       "decode": {"disaggregation_decode_allocation_policy": "prefill_complete"}},
                                      "prefill_complete does not yet support attention tensor parallelism"),
    "retraction_backup_on_prefill": ({"prefill": {"disaggregation_decode_retraction_backup": "host_pool"}},
                                     "only supported on a PD decode server"),
    "pd_role_switch_with_ep": ({"decode": {"enable_pd_role_switch": True}}, "expert parallelism"),
    # docs/field-failures.md row 18: refused for every algorithm but EAGLE, EAGLE3 and DSPARK
    "decode_radix_cache_with_speculation": ({"decode": {"disaggregation_decode_enable_radix_cache": True,
                                                        "speculative_algorithm": "NGRAM"}},
                                            "--disaggregation-decode-enable-radix-cache is incompatible with "
                                            "speculative decoding"),
}
ACCEPTED = {
    "kv_cache_fp8": {"prefill": {"kv_cache_dtype": "fp8_e4m3"}, "decode": {"kv_cache_dtype": "fp8_e4m3"}},
    "chunked_prefill_multiple_of_page": {"prefill": {"chunked_prefill_size": 4096, "page_size": 64},
                                         "decode": {"page_size": 64}},
}
# A rule of the GPU generation: SGLang on a CPU machine refuses for the machine's sake,
# so check says it could not judge (a warning), never a false refusal.
MACHINE_DEPENDENT = {"kv_cache_nvfp4": {"prefill": {"kv_cache_dtype": "nvfp4"}, "decode": {"kv_cache_dtype": "nvfp4"}}}


def _variables(extra: dict) -> dict:
    v = load_inventory(GPU01).variables
    v.update(extra.get("vars", {}))
    for role, args in extra.items():
        if role == "vars":
            continue
        inst = v[f"pdnode_{role}_instances"][0]
        inst["extra_args"] = {**(inst.get("extra_args") or {}), **args}
    return v


def _inventory(tmp: Path, name: str, extra: dict) -> Path:
    inv = tmp / name
    shutil.copytree(GPU01, inv)
    v = _variables(extra)
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / "gpu01.yml").write_text(yaml.safe_dump(
        {k: v[k] for k in ("pdnode_prefill_instances", "pdnode_decode_instances", *extra.get("vars", {}))}))
    return inv


@pytest.fixture(scope="module")
def judged(sglang_env, tmp_path_factory):
    """Every case's engines judged in one SGLang import, into a cache of this module."""
    cache = tmp_path_factory.mktemp("verdicts")
    cases = {**{n: c[0] for n, c in REFUSED.items()}, **ACCEPTED, **MACHINE_DEPENDENT}
    services, settings = [], None
    for name, extra in cases.items():
        plan = build_plan(_variables(extra), "gpu01")
        settings = plan.settings
        for svc in plan.engines():
            services.append({**svc, "id": f"{name}.{svc['id']}"})
    env = {"PDNODE_CACHE_DIR": str(cache), "PDNODE_SGLANG_VALIDATOR": str(sglang_env)}
    with pytest.MonkeyPatch.context() as mp:
        for k, val in env.items():
            mp.setenv(k, val)
        verdicts = {v.service: v for v in sglang_judge.judge(services, settings, sglang_env)}
    return env, verdicts


def _check(inv: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "pdnode.commands.cli", "check", *extra, str(inv)], capture_output=True,
                          text=True, check=False, cwd=REPO, env={**os.environ, **env}, timeout=900)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_sglang_refuses_what_pdnode_rules_accept(judged, case):
    _, verdicts = judged
    extra, reason = REFUSED[case]
    refused = [v for sid, v in verdicts.items() if sid.startswith(f"{case}.") and not v.accepted]
    assert refused and any(reason in v.reason for v in refused), [(v.service, v.reason) for v in refused]
    assert not any(sglang_judge.depends_on_the_machine(v.reason) for v in refused), refused


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_sglang_accepts_the_controls(judged, case):
    _, verdicts = judged
    mine = [v for sid, v in verdicts.items() if sid.startswith(f"{case}.")]
    assert len(mine) == 2 and all(v.accepted for v in mine), mine


def test_a_gpu_generation_rule_is_could_not_judge_not_a_refusal(judged):
    _, verdicts = judged
    decode = verdicts["kv_cache_nvfp4.decode-0"]
    assert not decode.accepted and sglang_judge.depends_on_the_machine(decode.reason), decode


@pytest.mark.parametrize("case", ["chunked_prefill_not_multiple_of_page", "pd_role_switch_with_ep",
                                  "decode_radix_cache_with_speculation"])
def test_check_prints_the_refusal_in_one_line_per_instance(judged, tmp_path, case):
    env, _ = judged
    extra, reason = REFUSED[case]
    inv = _inventory(tmp_path, case, extra)
    r = _check(inv, env)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].endswith("1 problem in host gpu01:") and len(lines) == 2, r.stderr
    role, args = next(iter(extra.items()))
    assert lines[1].lstrip().startswith(f"pdnode_{role}_instances[0].extra_args."), lines[1]
    assert f"SGLang 0.5.23 refuses {role}-0's ServerArgs: " in lines[1] and reason in lines[1], lines[1]
    assert "Fix: " in lines[1] and "Traceback" not in r.stderr
    report = json.loads(_check(inv, env, "--json").stdout)
    assert [p["rule"] for p in report["problems"]] == ["sglang-rejects"]


def test_check_warns_where_sglang_cannot_judge_and_exits_0(judged, tmp_path):
    env, _ = judged
    inv = _inventory(tmp_path, "nvfp4", MACHINE_DEPENDENT["kv_cache_nvfp4"])
    r = _check(inv, env, "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], r.stdout
    # one warning per engine: the dtype is on both roles (the KV layout must agree)
    assert [w["rule"] for w in report["warnings"]] == ["sglang-could-not-judge"] * 2


def test_without_a_validator_check_says_so_in_one_line_and_applies_its_own_rules(tmp_path):
    env = {"PDNODE_CACHE_DIR": str(tmp_path / "empty-cache"), "PDNODE_SGLANG_VALIDATOR": ""}
    r = _check(GPU01, env)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 1 and "SGLang's own validation did not run" in warnings[0], r.stderr
    assert "scripts/sglang-validator" in warnings[0]


def test_a_warm_check_starts_no_sglang(sglang_env, tmp_path):
    """The second check of an unchanged description reads cached verdicts: a validator
    that logs each start is started once for two checks."""
    env_dir = tmp_path / "validator"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "lib").symlink_to(Path(sglang_env).parent.parent / "lib")  # its sglang dist-info
    log = tmp_path / "starts.log"
    wrapper = env_dir / "bin" / "python"
    wrapper.write_text(f"#!/bin/sh\necho started >> {log}\nexec {sglang_env} \"$@\"\n")
    wrapper.chmod(0o755)
    env = {"PDNODE_CACHE_DIR": str(tmp_path / "cache"), "PDNODE_SGLANG_VALIDATOR": str(wrapper)}
    inv = _inventory(tmp_path, "warm", REFUSED["grpc_port_equals_port"][0])
    first, second = _check(inv, env), _check(inv, env)
    assert first.returncode == second.returncode == 1 and first.stderr == second.stderr, (first.stderr, second.stderr)
    assert "must differ from --port" in second.stderr
    assert log.read_text().splitlines() == ["started"]
