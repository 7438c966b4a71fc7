"""What the pinned SGLang (0.5.23, the validation environment's) does about field failures
pdnode leaves to it (docs/field-failures.md): read in its source and its settings, so a
new pin that drops the fix fails here, naming the row, before a node meets the failure.

- Row 3 (sglang#36029): a decode drops its cached bootstrap entry for a prefill when a
  hand-off with it fails, so a restarted prefill's new ports are fetched again.
- Row 4 (sglang#13054): a session blacklisted at its first transfer failure is probed and
  lifted again (the failed-session probe, on by default, every 30 s at first).
- Row 12 (sglang#39611): DP replicas draw their NCCL ports from the range the plan keeps
  its listeners out of (pdnode.core.rules.ports.REPLICA_NCCL_DRAW), and still cannot share a
  pinned one.

- Row 17 (sglang#27666): a decode with its radix cache and its KV offload both on releases
  a finished request's rows past the tree's protected prefix only, and unlocks the tree,
  where it used to free the prefix too and drive the protected count below zero.
- Row 16 (sglang#21395): the Mooncake transfer engine advertises get_local_ip_auto(), which
  takes SGLANG_HOST_IP before any guess from the host's NICs (the plan sets it to the
  host's address of a layout over hosts).

And what it still gets wrong, behind a refusal of the plan:

- Row 13 (llm-d#2433): prefill and decode of a non-MLA hybrid model at different attention
  TP. The pin slices sliding-window and Mamba state between the sizes; it still raises
  for the MXFP8 KV cache's block scales (disagg-attn-tp-block-scaled-kv).
- Row 14 (sglang#29725): a prefill of plain DP replicas is accepted by SGLang's validation,
  dispatches by bootstrap room, and each replica's KV sender compares the room with an
  attention-DP rank that is 0 in every replica (disagg-prefill-dp-replicas).
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.conformance

FACTS = """
import importlib.metadata, importlib.util, json, os
import sglang.srt.environ as e
root = os.path.join(os.path.dirname(importlib.util.find_spec("sglang").origin), "srt", "disaggregation")
names = ("SGLANG_ENABLE_FAILED_SESSION_PROBE", "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S",
         "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S", "SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S")
print(json.dumps({"version": importlib.metadata.version("sglang"), "common": os.path.join(root, "common", "conn.py"),
                  "mooncake": os.path.join(root, "mooncake", "conn.py"),
                  "defaults": {n: getattr(e.envs, n).default for n in names}}))
"""

@pytest.fixture(scope="module")
def pinned(sglang_run) -> dict:
    r = sglang_run(["-c", FACTS])
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def calls_in(path: str, name: str) -> dict[str, int]:
    """Function name -> how often it calls NAME (as self.NAME(...) or NAME(...))."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    out: dict[str, int] = {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        count = sum(1 for c in ast.walk(fn) if isinstance(c, ast.Call)
                    and getattr(c.func, "attr", getattr(c.func, "id", None)) == name)
        if count:
            out[fn.name] = out.get(fn.name, 0) + count
    return out


def defined_in(path: str) -> set[str]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


# A prefill of two TP-2 replicas, resolved by SGLang as `sglang serve` would: which replica
# a request goes to, and which rank each replica's KV sender believes it is.
REPLICAS = """
import json, sys
from pdnode.node.launcher import to_argv
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.model_override_base import resolving_view
from sglang.srt.runtime_context import attn_tp_size_of, derive_attention_ranks, num_dp_ranks_of
args = prepare_server_args(to_argv(json.loads(sys.argv[1])) + ["--device", "cuda"])
args.resolve_once()
args.check_server_args()
cfg = resolving_view(args)  # what resolution decided (the raw fields keep the inputs: "auto")
attn_tp = attn_tp_size_of(cfg)
print(json.dumps({"load_balance_method": cfg.load_balance_method, "num_dp_ranks": num_dp_ranks_of(cfg),
                  "attn_dp_ranks": sorted({derive_attention_ranks(tp_rank=r, attn_tp_size=attn_tp, attn_cp_size=1)[1]
                                           for r in range(cfg.tp_size)})}))
"""


def _sender_compares_attn_dp_rank_with_the_room(path: str) -> bool:
    """CommonKVSender.__init__ compares `<...>.attn_dp_rank` with `<room> % <...>.num_dp_ranks`."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "CommonKVSender"):
        for init in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
            for cmp in (n for n in ast.walk(init) if isinstance(n, ast.Compare)):
                left = cmp.left
                right = cmp.comparators[0]
                if isinstance(left, ast.Attribute) and left.attr == "attn_dp_rank" and isinstance(right, ast.BinOp) \
                        and isinstance(right.op, ast.Mod) and getattr(right.right, "attr", None) == "num_dp_ranks":
                    return True
    return False


def test_row_14_a_prefill_of_dp_replicas_is_accepted_and_then_fails_its_hand_offs(pinned, sglang_run):
    from sglang_cases import PREFILL_TP4, with_

    from pdnode.core.rules.catalogue import BY_ID

    assert BY_ID["disagg-prefill-dp-replicas"].severity == "error"
    # the reference prefill's four GPUs as the two TP-2 replicas the rule refuses
    args = with_(PREFILL_TP4, tp_size=2, dp_size=2, nccl_port=...)
    r = sglang_run(["-c", REPLICAS, json.dumps(args)])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    # SGLang's validation takes it; the prefill dispatches room r to replica r % 2; and every
    # replica's sender believes it is attention-DP rank 0
    assert seen == {"load_balance_method": "follow_bootstrap_room", "num_dp_ranks": 2, "attn_dp_ranks": [0]}, seen
    assert _sender_compares_attn_dp_rank_with_the_room(pinned["common"]), \
        "CommonKVSender no longer checks the room against attn_dp_rank (sglang#29725 fixed?): row 14 and " \
        "disagg-prefill-dp-replicas may go"


def test_the_pin_is_the_one_the_catalogue_read(pinned):
    assert pinned["version"] == "0.5.23", "docs/field-failures.md rows 3 and 4 were read in 0.5.23: read them again"


def test_row_3_a_failed_hand_off_drops_the_cached_bootstrap_entry(pinned):
    assert "invalidate_cached_bootstrap_infos" in defined_in(pinned["common"]), "sglang#36029's fix is gone"
    callers = calls_in(pinned["common"], "invalidate_cached_bootstrap_infos")
    # the bootstrap fetch, the KV-args registration and the failure of a hand-off all drop it
    assert sum(callers.values()) >= 3, callers


def test_row_4_a_blacklisted_session_is_probed_and_lifted(pinned):
    assert {"_unblacklist_session", "_run_one_probe_pass"} <= defined_in(pinned["mooncake"]), \
        "the failed-session probe (sglang#13054's recovery) is gone"
    assert calls_in(pinned["mooncake"], "_unblacklist_session"), "nothing lifts a blacklisted session"
    assert pinned["defaults"] == {"SGLANG_ENABLE_FAILED_SESSION_PROBE": True,
                                  "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S": 30.0,
                                  "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S": 300.0,
                                  "SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S": 600.0}
    # the stand-in's reproduction (tests/standin/test_failed_sessions.py) runs with the pin's defaults
    from pdnode.standin.config import load_sim_settings

    sim = load_sim_settings({})
    assert (sim.failed_session_probe, sim.failed_session_probe_interval_s, sim.failed_session_probe_max_interval_s,
            sim.failed_session_idle_timeout_s) == tuple(pinned["defaults"].values())
    assert '"sglang:failed_session_recoveries_total"' in Path(pinned["mooncake"]).read_text(encoding="utf-8")


DRAW = """
import inspect, json
import sglang.srt.utils.network as n
import sglang.srt.server_args as s
print(json.dumps({"draw": inspect.getsource(n.get_free_port_below_ephemeral),
                  "init_new": inspect.getsource(s.PortArgs.init_new)}))
"""


def test_row_12_dp_replicas_draw_their_nccl_port_where_the_plan_warns(sglang_run):
    from pdnode.core.rules.ports import REPLICA_NCCL_DRAW

    r = sglang_run(["-c", DRAW])
    assert r.returncode == 0, r.stderr[-3000:]
    src = json.loads(r.stdout.strip().splitlines()[-1])
    args = ast.parse(src["draw"].strip()).body[0].args
    names = [a.arg for a in args.args][-len(args.defaults):]
    defaults = dict(zip(names, (ast.literal_eval(d) for d in args.defaults)))
    assert range(defaults["low"], defaults["high"] + 1) == REPLICA_NCCL_DRAW, \
        "row 12: SGLang draws DP replicas' NCCL ports elsewhere now: move REPLICA_NCCL_DRAW"
    # a pinned nccl_port goes to every replica alike (why the plan pins none for them)
    init_new = src["init_new"]
    assert "get_free_port_below_ephemeral()" in init_new and "nccl_port = server_args.nccl_port" in init_new


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    return fn


def _attrs(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _strings(node: ast.AST) -> str:
    return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def test_row_13_hybrid_state_is_sliced_between_attention_tp_sizes_but_block_scales_are_not(pinned):
    from pdnode.core.rules.instances import BLOCK_SCALED_KV_DTYPES
    from pdnode.core.rules.catalogue import BY_ID

    disagg = Path(pinned["mooncake"]).parents[1]
    send = _function(ast.parse(Path(pinned["mooncake"]).read_text(encoding="utf-8")), "maybe_send_extra")
    # Mamba state (Qwen3-Next) goes to its slicing sender when the sizes differ
    assert calls_in(pinned["mooncake"], "_send_mamba_state_slice").get("maybe_send_extra"), \
        "row 13: Mamba state is no longer sliced between attention TP sizes"
    # the one refusal of different sizes spares sliding-window state (gpt-oss, the model)
    (refusal,) = [n for n in ast.walk(send) if isinstance(n, ast.If) and any(
        isinstance(r, ast.Raise) and "does NOT support PD different TP sizes" in _strings(r) for r in n.body)]
    assert "SWA" in _attrs(refusal.test), "row 13: sliding-window state is refused between TP sizes again"
    # ...and reaches every generic state type of a non-MLA model, the block scales among them
    generic = _function(ast.parse(Path(pinned["mooncake"]).read_text(encoding="utf-8")),
                        "_is_generic_kvcache_state_type")
    assert "BLOCK_SCALE" in _attrs(generic), \
        "row 13: block scales left the refused path: disagg-attn-tp-block-scaled-kv may go"
    # the block scales are a state of the MXFP8 pool, which a non-MLA model gets from kv_cache_dtype
    utils = Path(disagg / "utils.py").read_text(encoding="utf-8")
    registered = [n for n in ast.walk(ast.parse(utils)) if isinstance(n, ast.If)
                  and "MHATokenToKVPoolMXFP8" in {getattr(a, "id", None) for a in ast.walk(n.test)}]
    assert any("BLOCK_SCALE" in _attrs(ast.Module(body=n.body, type_ignores=[])) for n in registered), registered
    configurator = ast.parse((disagg.parent / "mem_cache" / "kv_cache_configurator.py").read_text(encoding="utf-8"))
    chosen_by = {c.value for n in ast.walk(configurator) if isinstance(n, ast.If)
                 and any(isinstance(r, ast.Return) and getattr(r.value, "id", None) == "MHATokenToKVPoolMXFP8"
                         for r in n.body)
                 for c in ast.walk(n.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    assert chosen_by == set(BLOCK_SCALED_KV_DTYPES), f"the MXFP8 pool is chosen by {chosen_by} now"
    assert BY_ID["disagg-attn-tp-block-scaled-kv"].severity == "error"


HOST_IP = """
import ast, inspect, json
import sglang.srt.distributed.device_communicators.mooncake_transfer_engine as te
from sglang.srt.utils.network import get_local_ip_auto
tree = ast.parse(inspect.getsource(te.maybe_init_shared_mooncake_transfer_engine))
hostnames = [ast.unparse(k.value) for c in ast.walk(tree) if isinstance(c, ast.Call)
             and getattr(c.func, "id", None) == "init_mooncake_transfer_engine" for k in c.keywords if k.arg == "hostname"]
print(json.dumps({"auto": get_local_ip_auto(), "hostnames": hostnames}))
"""


def test_row_16_the_transfer_engine_advertises_the_plans_host_address(sglang_env):
    import os

    from pdnode.core.plan import kv_path

    assert kv_path.ADDRESS_VARIABLE == "SGLANG_HOST_IP"
    # a process of its own: SGLang may read the variable when it is imported
    # a process of its own (not sglang_run): SGLang may read the variable when it is imported
    r = subprocess.run([str(sglang_env), "-c", HOST_IP], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "SGLANG_HOST_IP": "10.20.0.11"})
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    # the address SGLang takes is the variable's, whatever the NICs say, and the shared
    # transfer engine of a PD engine is made with it
    assert seen == {"auto": "10.20.0.11", "hostnames": ["get_local_ip_auto()"]}, \
        "row 16: the Mooncake transfer engine no longer advertises SGLANG_HOST_IP's address"


def test_row_17_a_finished_requests_offload_release_leaves_the_trees_prefix_alone(pinned):
    path = Path(pinned["mooncake"]).parents[1] / "decode_kvcache_offload_manager.py"
    release = _function(ast.parse(path.read_text(encoding="utf-8")), "_release_finished_req")
    # no raw change of the tree's protected count (the negative protected size)
    assert "protected_size_" not in _attrs(release), "row 17: the release touches protected_size_ again"
    # the rows freed start past the protected prefix, and the tree's lock is given back
    frees = [c for c in ast.walk(release) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "free_kv_row"]
    assert frees and all("cache_protected_len" in ast.unparse(c.args[1]) for c in frees), \
        [ast.unparse(c) for c in frees]
    assert calls_in(str(path), "unlock").get("_release_finished_req"), "row 17: the release no longer unlocks the tree"
