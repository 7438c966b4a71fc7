"""SGLang 0.5.23's disaggregation settings the plan owns (issue 19, section 3): the KV
checksum and the decode allocation policy (ServerArgs, the same on every engine), and
the hand-off's timeouts and heartbeat (environment variables SGLang reads in every
engine: sglang/srt/environ.py). One inventory setting each; the engines' environment
and arguments are rendered from them, and the plan's restart coupling
(plan.heartbeat_detection_s) reads the heartbeat from the same rendered environment."""

from __future__ import annotations

from typing import Any

# inventory setting -> (SGLang environment variable, lowest value SGLang accepts)
ENVIRONMENT = {
    "pdnode_disagg_bootstrap_timeout_s": ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 1),
    "pdnode_disagg_waiting_timeout_s": ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 1),
    "pdnode_disagg_heartbeat_interval_s": ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 2),  # SGLang's floor
    "pdnode_disagg_heartbeat_max_failure": ("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 1),
}
ALLOCATION_POLICIES = ("early", "prefill_complete")


def check(c: Any, v: dict[str, Any]) -> None:
    """Ranges and choices, and no second source for a variable a setting owns."""
    for name, (variable, floor) in ENVIRONMENT.items():
        value = v.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < floor:
            c.error("disagg-setting-range", name, value, f"must be {floor} or more ({variable} in SGLang)",
                    f"use e.g. {floor if floor > 1 else 300}")
    policy = v.get("pdnode_decode_allocation_policy")
    if isinstance(policy, str) and policy not in ALLOCATION_POLICIES:
        c.error("disagg-setting-range", "pdnode_decode_allocation_policy", policy,
                f"is not one of SGLang's policies ({', '.join(ALLOCATION_POLICIES)})", "use early (SGLang's default)")
    env = v.get("pdnode_engine_environment")
    owned = {variable: name for name, (variable, _) in ENVIRONMENT.items()}
    for key in (env if isinstance(env, dict) else {}):
        if key in owned:
            c.error("disagg-environment-owned", f"pdnode_engine_environment.{key}", env[key],
                    f"is set by the plan from {owned[key]}", f"set {owned[key]} instead")


def environment(v: dict[str, Any]) -> dict[str, str]:
    """The variables every engine gets (explicit, SGLang's defaults included)."""
    out = {}
    for name, (variable, _) in ENVIRONMENT.items():
        value = v[name]
        out[variable] = str(int(value)) if float(value).is_integer() else str(value)
    return out


def server_args(v: dict[str, Any]) -> dict[str, Any]:
    """ServerArgs every engine gets from the settings (only where they differ from SGLang's default)."""
    args: dict[str, Any] = {}
    if v["pdnode_kv_checksum"]:
        args["disaggregation_enable_kv_checksum"] = True
    if v["pdnode_decode_allocation_policy"] != "early":
        args["disaggregation_decode_allocation_policy"] = v["pdnode_decode_allocation_policy"]
    return args


def engine_defaults(v: dict[str, Any]) -> dict[str, Any]:
    """What an instance has for the settings every engine must agree on, unless its
    extra_args override them (pdnode.core.rules.instances.check_same_disagg_settings)."""
    return {"disaggregation_decode_allocation_policy": v["pdnode_decode_allocation_policy"],
            "disaggregation_enable_kv_checksum": v["pdnode_kv_checksum"]}
