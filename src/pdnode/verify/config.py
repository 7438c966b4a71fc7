"""What to verify and where: the plan (as ``Plan.as_dict()`` gives it) + options -> Run.

Both entry points build a Run from the same plan dict, so `pdnode verify INVENTORY` and
`python -m pdnode.verify --plan PLAN.json` judge a node identically.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from ..core.inventory.thresholds import THRESHOLD_KEYS

ROUTE_QUERY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
ENGINE_ROLES = ("prefill", "decode")
# What the verifier reads from the plan's settings. The plan carries every one (fields.py
# has their defaults, build_plan fills them in): a plan that lacks one is refused, never
# completed here with defaults of its own.
SETTINGS = ("pdnode_verify_prompt_words", "pdnode_verify_max_tokens", "pdnode_verify_burst_requests",
            "pdnode_verify_burst_concurrency", "pdnode_verify_timeout_s", "pdnode_verify_reference_prompt",
            "pdnode_verify_reference_answer", "pdnode_verify_thresholds")
RENDER = "give the JSON of `pdnode render INVENTORY --role plan`"


class ConfigError(ValueError):
    """Bad arguments or an unusable plan (exit code 2)."""


@dataclass(frozen=True)
class Instance:
    """One engine instance of the plan (plan["services"][id] with role prefill or decode)."""

    id: str  # "prefill-0": the check ids and the evidence name instances by it
    role: str  # "prefill" | "decode"
    unit: str | None
    url: str | None  # HTTP root from here; None: not reachable from where the verifier runs
    bootstrap_url: str | None  # prefill only, same rule
    bootstrap_port: int | None  # prefill only: what the router must list with it
    router_url: str  # the URL the router was told for it (/workers lists this one)
    bootstrap_host: str  # what the router sends decode as bootstrap_host for this prefill
    tp_size: int
    attn_dp_size: int
    dp_size: int  # DP replicas (1: none)
    host: str | None = None  # the inventory host it runs on, when not the verifier's own (several hosts)

    @property
    def where(self) -> str:
        """" on <host>" for an instance on another host of the layout (evidence names it)."""
        return f" on {self.host}" if self.host else ""

    @property
    def ranks(self) -> int:
        """Prefill ranks the bootstrap server must have registered per pipeline stage."""
        per_replica = self.tp_size // max(self.attn_dp_size, 1)
        return per_replica * (self.dp_size if self.dp_size > 1 else self.attn_dp_size)


@dataclass(frozen=True)
class Targets:
    base_url: str  # OpenAI-compatible server root clients use (router or a gateway)
    router_url: str  # router root (/readiness, /workers)
    router_metrics_url: str | None
    on_node: bool  # the verifier runs on the node (loopback URLs are the node's)
    instances: tuple[Instance, ...] = ()  # engine instances, in the plan's order

    def role(self, role: str) -> list[Instance]:
        return [i for i in self.instances if i.role == role]

    def instance(self, iid: str) -> Instance:
        return next(i for i in self.instances if i.id == iid)

    def as_dict(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "router_url": self.router_url,
                "router_metrics_url": self.router_metrics_url, "on_node": self.on_node,
                "instances": {i.id: {"role": i.role, "url": i.url, "bootstrap_url": i.bootstrap_url}
                              for i in self.instances}}


@dataclass(frozen=True)
class Expect:
    served_model_name: str
    router_prefill: list[tuple[str, int | None]]  # (url, bootstrap port) as the router was told
    router_decode: list[str]
    units: list[str]  # systemd units: every engine instance, then the router
    # seconds the router keeps a tripped circuit open (the plan's cb_timeout_duration_secs;
    # sglang-router's own default, 60, when the plan does not set it)
    circuit_open_s: int = 60
    # the plan starts the router with a control-plane admin key: /workers must refuse
    # requests without it
    admin_key: bool = False
    # the KV path's link checks (plan.cluster.kv.checks: pair, GPUs, the Mooncake check's
    # arguments) and the check's path on the host; none: the plan measures no link here
    kv_link_checks: tuple[dict[str, Any], ...] = ()
    kv_check_tool: str | None = None
    kv_path: str | None = None


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


def _port(d: Mapping[str, Any], key: str, where: str) -> int:
    """A port the plan names (its own allocation: never a fallback of the verifier's)."""
    value = d.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"the plan has no {where}.{key} (got {value!r}): {RENDER}")
    return value


def _service_map(plan: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(engine services in the plan's order, the router service), or ConfigError."""
    services = plan.get("services")
    if not isinstance(services, Mapping) or not isinstance(services.get("router"), Mapping):
        why = "an old plan (top-level prefill/decode): re-render it with this release" \
            if "prefill" in plan else "no services.router"
        raise ConfigError(f"the plan lacks services ({why}): give the JSON of `pdnode render INVENTORY --role plan`")
    engines = []
    for sid, svc in services.items():
        if not isinstance(svc, Mapping):
            raise ConfigError(f"plan services.{sid} is {type(svc).__name__}, not an object")
        if svc.get("role") in ENGINE_ROLES:
            engines.append(dict(svc, id=str(svc.get("id") or sid)))
    if not any(e["role"] == "prefill" for e in engines) or not any(e["role"] == "decode" for e in engines):
        raise ConfigError("the plan has no prefill or no decode service: give the JSON of "
                          "`pdnode render INVENTORY --role plan`")
    return engines, dict(services["router"])


def _pairs(values: Sequence[str] | None, what: str, plain: bool) -> dict[str, str]:
    """--instance-url ID=URL options -> {ID: URL}; with ``plain``, a bare URL is keyed ''."""
    out: dict[str, str] = {}
    for v in values or ():
        sid, eq, url = v.partition("=")
        if not eq or "://" in sid:
            sid, url = "", v
        if (not sid and not plain) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{what} {v!r}: give ID=http://HOST:PORT (e.g. prefill-0=http://127.0.0.1:30000)")
        out[sid] = url.rstrip("/")
    return out


def _override(role_flag: str | None, pairs: dict[str, str], engines: list[dict[str, Any]], role: str,
              what: str) -> dict[str, str]:
    """Per-instance URL overrides: ID=URL pairs, and the one-instance shorthand (--prefill-url URL)."""
    ids = [e["id"] for e in engines if e["role"] == role]
    out = {k: v for k, v in pairs.items() if k in ids}
    plain = [v for k, v in ((None, role_flag), *pairs.items()) if v and k in (None, "")]
    if plain:
        if len(ids) != 1:
            name = "--instance-url" if what != "--bootstrap-url" else what
            raise ConfigError(f"{what} {plain[0]}: the plan has {len(ids)} {role} instances ({', '.join(ids)}); "
                              f"name one: {name} {ids[0]}=URL")
        out[ids[0]] = plain[0].rstrip("/")
    return out


def build_run(plan: Mapping[str, Any], *, node_address: str | None = None, base_url: str | None = None,
              router_url: str | None = None, prefill_url: str | None = None, decode_url: str | None = None,
              bootstrap_url: str | None = None, router_metrics_url: str | None = None,
              instance_urls: Sequence[str] | None = None, bootstrap_urls: Sequence[str] | None = None,
              api_key_file: str | None = None, admin_key_file: str | None = None,
              auth_template: str | None = None, timeout_s: float | None = None, overall_s: float | None = None,
              max_tokens: int | None = None, skip_burst: bool = False, env: Mapping[str, str] | None = None,
              on_node: bool = False) -> Run:
    """Plan dict (Plan.as_dict(): plan["services"]) + overrides -> Run. Raises ConfigError.

    ``on_node``: the verifier runs on the node itself, so the node's loopback services
    (every engine instance, the bootstrap servers, router metrics) and systemd are
    reachable here. It is said by the caller (--on-node, the node's entry point), never
    guessed from an address: 127.0.0.1 may as well be a tunnel from the controller.
    ``instance_urls`` / ``bootstrap_urls``: "ID=URL" per instance; prefill_url,
    decode_url and bootstrap_url name the one instance of their role (refused when
    there are several)."""
    engines, router_svc = _service_map(plan)
    try:
        router = dict(router_svc.get("args") or {})
        settings = dict(plan.get("settings") or {})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the plan is not usable ({exc}): {RENDER}") from None
    missing = [k for k in SETTINGS if k not in settings]
    if missing:
        raise ConfigError(f"the plan's settings lack {', '.join(missing)}: {RENDER}")

    # Where the router is: an explicit address, else its bind address, else the node's
    # inventory address, else this machine.
    r_host = str(router.get("host", "127.0.0.1"))
    address = node_address or (None if _wildcard(r_host) else r_host) or "127.0.0.1"
    r_port = _port(router, "port", "services.router.args")
    default_router = f"http://{url_host(address)}:{r_port}"
    # On another host of a layout spanning hosts: its public URL; its metrics listener
    # (loopback there) and its unit are that host's.
    router_remote = router_svc.get("host") not in (None, plan.get("host"))
    if router_remote:
        default_router = str(dict(plan.get("cluster") or {}).get("router", {}).get("url") or default_router)
    router_root = (router_url or default_router).rstrip("/")
    m_host = str(router.get("prometheus_host", "127.0.0.1"))
    m_host = address if _wildcard(m_host) else m_host
    m_url = router_metrics_url or (
        f"http://{url_host(m_host)}:{_port(router, 'prometheus_port', 'services.router.args')}/metrics"
        if (on_node or not is_loopback(m_host)) and not router_remote else None)

    urls = _pairs(instance_urls, "--instance-url", plain=False)
    boots = _pairs(bootstrap_urls, "--bootstrap-url", plain=True)
    known = {e["id"] for e in engines} | {""}
    for given, what in ((urls, "--instance-url"), (boots, "--bootstrap-url")):
        for sid in given:
            if sid not in known:
                raise ConfigError(f"{what} {sid}=...: the plan has no instance {sid!r} "
                                  f"(instances: {', '.join(e['id'] for e in engines)})")
    url_for = {**_override(prefill_url, {}, engines, "prefill", "--prefill-url"),
               **_override(decode_url, {}, engines, "decode", "--decode-url"), **urls}
    boot_for = _override(bootstrap_url, boots, engines, "prefill", "--bootstrap-url")
    instances = []
    for e in engines:
        args = dict(e.get("args") or {})
        plan_url = str(e.get("url") or "").rstrip("/")
        if not plan_url:
            raise ConfigError(f"the plan has no services.{e['id']}.url: {RENDER}")
        host = urlsplit(plan_url).hostname or "127.0.0.1"
        boot_port = e.get("bootstrap_port", args.get("disaggregation_bootstrap_port")) \
            if e["role"] == "prefill" else None
        boot_port = boot_port if isinstance(boot_port, int) and not isinstance(boot_port, bool) else None
        url = url_for.get(e["id"]) or (plan_url if on_node else None)
        b_url = boot_for.get(e["id"]) or (f"http://{url_host(host)}:{boot_port}"
                                          if on_node and boot_port is not None else None)
        remote = e.get("host") not in (None, plan.get("host"))  # another host of a layout spanning hosts
        instances.append(Instance(
            id=e["id"], role=e["role"], unit=str(e["unit"]) if e.get("unit") and not remote else None, url=url,
            bootstrap_url=b_url if e["role"] == "prefill" else None, bootstrap_port=boot_port,
            router_url=plan_url, bootstrap_host=host, tp_size=_int(args, "tp_size", 1),
            attn_dp_size=_int(args, "attn_dp_size", 1), dp_size=_int(args, "dp_size", 1),
            host=str(e["host"]) if remote else None))
    targets = Targets(base_url=(base_url or router_root).rstrip("/"), router_url=router_root,
                      router_metrics_url=m_url, on_node=on_node, instances=tuple(instances))

    router_prefill = []
    for item in router.get("prefill") or []:
        url, boot = (item[0], item[1] if len(item) > 1 else None) if isinstance(item, (list, tuple)) else (item, None)
        router_prefill.append((str(url).rstrip("/"), boot))
    first = dict(engines[0].get("args") or {})
    units = [i.unit for i in instances if i.unit] + (
        [str(router_svc["unit"])] if router_svc.get("unit") and not router_remote else [])
    kv = dict((plan.get("cluster") or {}).get("kv") or {})
    expect = Expect(
        served_model_name=str(first.get("served_model_name") or first.get("model_path") or ""),
        router_prefill=router_prefill,
        router_decode=[str(u).rstrip("/") for u in router.get("decode") or []],
        units=units,
        circuit_open_s=_int(router, "cb_timeout_duration_secs", 60),
        admin_key=bool(admin_key_file) or _plan_has_admin_key(plan),
        kv_link_checks=tuple(kv.get("checks") or ()),
        kv_check_tool=(plan.get("install") or {}).get("kv_check_tool"),
        kv_path=kv.get("path"),
    )

    t = float(timeout_s if timeout_s is not None else settings["pdnode_verify_timeout_s"])
    if t <= 0:
        raise ConfigError(f"--timeout {t}: must be positive")
    burst_n = int(settings["pdnode_verify_burst_requests"])
    conc = max(1, int(settings["pdnode_verify_burst_concurrency"]))
    # Overall bound: the sequential requests (about 8, and one hand-off per instance
    # beyond the first pair) plus the burst's rounds, each at most one request timeout.
    rounds = 0 if skip_burst else -(-burst_n // conc)
    pairs = max(len([i for i in instances if i.role == r]) for r in ENGINE_ROLES)
    overall = float(overall_s) if overall_s is not None else t * (8 + pairs + rounds)
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
