"""What to verify and where: the plan (as ``Plan.as_dict()`` gives it) + options -> Run.

Both entry points build a Run from the same plan dict, so `pdnode verify INVENTORY` and
`python -m pdnode.verify --plan PLAN.json` judge a node identically.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping

ROUTE_QUERY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
THRESHOLD_KEYS = (
    "ttft_p50_max_s", "ttft_p99_max_s", "itl_p50_max_s", "itl_p99_max_s", "e2e_p99_max_s",
    "decode_throughput_min_tok_s", "kv_transfer_speed_min_gb_s",
)
DEFAULTS = {  # the pdnode_verify_* defaults of fields.py, for a plan that lacks them
    "pdnode_verify_prompt_words": 256, "pdnode_verify_max_tokens": 32, "pdnode_verify_burst_requests": 16,
    "pdnode_verify_burst_concurrency": 4, "pdnode_verify_timeout_s": 60.0,
    "pdnode_verify_reference_prompt": "What is the capital of France? Answer in one word.",
    "pdnode_verify_reference_answer": "Paris", "pdnode_verify_thresholds": {},
}


class ConfigError(ValueError):
    """Bad arguments or an unusable plan (exit code 2)."""


@dataclass(frozen=True)
class Targets:
    base_url: str  # OpenAI-compatible server root clients use (router or a gateway)
    router_url: str  # router root (/readiness, /workers)
    prefill_url: str | None  # None: not reachable from where the verifier runs
    decode_url: str | None
    bootstrap_url: str | None
    router_metrics_url: str | None
    on_node: bool  # the verifier runs on the node (loopback URLs are the node's)

    def as_dict(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "router_url": self.router_url, "prefill_url": self.prefill_url,
                "decode_url": self.decode_url, "bootstrap_url": self.bootstrap_url,
                "router_metrics_url": self.router_metrics_url, "on_node": self.on_node}


@dataclass(frozen=True)
class Expect:
    served_model_name: str
    prefill: dict[str, int]  # tp_size, attn_dp_size
    decode: dict[str, int]
    router_prefill: list[tuple[str, int | None]]  # (url, bootstrap port) as the router was told
    router_decode: list[str]
    units: list[str]  # systemd units: prefill, decode, router
    # seconds the router keeps a tripped circuit open (the plan's cb_timeout_duration_secs;
    # sglang-router's own default, 60, when the plan does not set it)
    circuit_open_s: int = 60
    # the plan starts the router with a control-plane admin key: /workers must refuse
    # requests without it
    admin_key: bool = False


@dataclass(frozen=True)
class Settings:
    prompt_words: int
    max_tokens: int
    burst_requests: int
    burst_concurrency: int
    timeout_s: float  # per request
    overall_s: float  # the whole run
    reference_prompt: str
    reference_answer: str
    thresholds: dict[str, float]
    skip_burst: bool = False


@dataclass
class Run:
    host: str
    targets: Targets
    expect: Expect
    settings: Settings
    api_key_file: str | None = None
    admin_key_file: str | None = None  # the router's control-plane admin key (/workers only)
    auth_template: str = "Bearer {key}"
    env: Mapping[str, str] = field(default_factory=dict)


def _wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "", "[::]")


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _int(d: Mapping[str, Any], key: str, default: int) -> int:
    value = d.get(key, default)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def build_run(plan: Mapping[str, Any], *, node_address: str | None = None, base_url: str | None = None,
              router_url: str | None = None, prefill_url: str | None = None, decode_url: str | None = None,
              bootstrap_url: str | None = None, router_metrics_url: str | None = None,
              api_key_file: str | None = None, admin_key_file: str | None = None,
              auth_template: str | None = None, timeout_s: float | None = None, overall_s: float | None = None,
              max_tokens: int | None = None, skip_burst: bool = False, env: Mapping[str, str] | None = None,
              on_node: bool = False) -> Run:
    """Plan dict (Plan.as_dict()) + overrides -> Run. Raises ConfigError.

    ``on_node``: the verifier runs on the node itself, so the node's loopback services
    (prefill, decode, bootstrap, router metrics) and systemd are reachable here. It is
    said by the caller (--on-node, the node's entry point), never guessed from an
    address: 127.0.0.1 may as well be a tunnel from the controller."""
    try:
        prefill, decode, router = dict(plan["prefill"]), dict(plan["decode"]), dict(plan["router"])
        install = dict(plan.get("install") or {})
        settings = {**DEFAULTS, **dict(plan.get("settings") or {})}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the plan lacks {exc}: give the JSON of `pdnode render INVENTORY --role plan`") from None

    # Where the router is: an explicit address, else its bind address, else the node's
    # inventory address, else this machine.
    r_host = str(router.get("host", "127.0.0.1"))
    address = node_address or (None if _wildcard(r_host) else r_host) or "127.0.0.1"
    r_port = _int(router, "port", 8000)
    default_router = f"http://{url_host(address)}:{r_port}"
    router_root = (router_url or default_router).rstrip("/")

    w_host = str(prefill.get("host", "127.0.0.1"))
    w_host = "127.0.0.1" if _wildcard(w_host) else w_host

    def local(url: str) -> str | None:
        return url if on_node else None

    p_url = prefill_url or local(f"http://{url_host(w_host)}:{_int(prefill, 'port', 30000)}")
    d_url = decode_url or local(f"http://{url_host(str(decode.get('host', w_host)))}:{_int(decode, 'port', 30001)}")
    b_url = bootstrap_url or local(f"http://{url_host(w_host)}:{_int(prefill, 'disaggregation_bootstrap_port', 8998)}")
    m_host = str(router.get("prometheus_host", "127.0.0.1"))
    m_host = address if _wildcard(m_host) else m_host
    m_url = router_metrics_url or (
        f"http://{url_host(m_host)}:{_int(router, 'prometheus_port', 29000)}/metrics"
        if (on_node or not is_loopback(m_host)) else None)
    targets = Targets(
        base_url=(base_url or router_root).rstrip("/"),
        router_url=router_root,
        prefill_url=p_url.rstrip("/") if p_url else None,
        decode_url=d_url.rstrip("/") if d_url else None,
        bootstrap_url=b_url.rstrip("/") if b_url else None,
        router_metrics_url=m_url,
        on_node=on_node,
    )

    def role(d: Mapping[str, Any]) -> dict[str, int]:
        return {"tp_size": _int(d, "tp_size", 1), "attn_dp_size": _int(d, "attn_dp_size", 1)}

    router_prefill = []
    for item in router.get("prefill") or []:
        url, boot = (item[0], item[1] if len(item) > 1 else None) if isinstance(item, (list, tuple)) else (item, None)
        router_prefill.append((str(url).rstrip("/"), boot))
    expect = Expect(
        served_model_name=str(prefill.get("served_model_name") or prefill.get("model_path") or ""),
        prefill=role(prefill), decode=role(decode),
        router_prefill=router_prefill,
        router_decode=[str(u).rstrip("/") for u in router.get("decode") or []],
        units=[install[k] for k in ("unit_prefill", "unit_decode", "unit_router") if install.get(k)],
        circuit_open_s=_int(router, "cb_timeout_duration_secs", 60),
        admin_key=bool(admin_key_file) or _plan_has_admin_key(plan),
    )

    t = float(timeout_s if timeout_s is not None else settings["pdnode_verify_timeout_s"])
    if t <= 0:
        raise ConfigError(f"--timeout {t}: must be positive")
    burst_n = int(settings["pdnode_verify_burst_requests"])
    conc = max(1, int(settings["pdnode_verify_burst_concurrency"]))
    # Overall bound: the sequential requests (about 8) plus the burst's rounds, each at
    # most one request timeout. Stated in the output.
    rounds = 0 if skip_burst else -(-burst_n // conc)
    overall = float(overall_s) if overall_s is not None else t * (8 + rounds)
    thresholds = {str(k): float(v) for k, v in dict(settings.get("pdnode_verify_thresholds") or {}).items()}
    unknown = sorted(set(thresholds) - set(THRESHOLD_KEYS))
    if unknown:
        raise ConfigError(f"unknown threshold(s) {', '.join(unknown)}: known are {', '.join(THRESHOLD_KEYS)}")
    sett = Settings(
        prompt_words=int(settings["pdnode_verify_prompt_words"]),
        max_tokens=int(max_tokens if max_tokens is not None else settings["pdnode_verify_max_tokens"]),
        burst_requests=burst_n, burst_concurrency=conc, timeout_s=t, overall_s=overall,
        reference_prompt=str(settings["pdnode_verify_reference_prompt"]),
        reference_answer=str(settings["pdnode_verify_reference_answer"]),
        thresholds=thresholds, skip_burst=skip_burst,
    )
    template = auth_template or "Bearer {key}"
    if "{key}" not in template:
        raise ConfigError(f"--auth-template {template!r}: must contain {{key}}")
    return Run(host=str(plan.get("host") or address), targets=targets, expect=expect, settings=sett,
               api_key_file=api_key_file, admin_key_file=admin_key_file, auth_template=template,
               env=dict(env or {}))


def _plan_has_admin_key(plan: Mapping[str, Any]) -> bool:
    """Does the plan start the router with --admin-key-file?"""
    services = plan.get("services")
    router = services.get("router") if isinstance(services, Mapping) else None
    argv = router.get("exec") if isinstance(router, Mapping) else None
    return isinstance(argv, list) and "--admin-key-file" in argv


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
