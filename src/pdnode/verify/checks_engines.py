"""Each engine instance on its own: bootstrap.<prefill id> (the bootstrap server listens and
has every rank of that prefill) and <instance id> (healthy, runs the plan's arguments)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from .base import FAIL, NA, PASS, Ctx, Result, conn_hint, refused, root_of, unit_hint
from .config import ROUTE_QUERY
from .http import port_open


def bootstrap_check(iid: str) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        return check_bootstrap(ctx, iid)
    return run


def engine_check(iid: str) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        return check_engine(ctx, iid)
    return run


def check_bootstrap(ctx: Ctx, iid: str) -> Result:
    inst = ctx.t.instance(iid)
    url = inst.bootstrap_url
    if url is None:
        return Result(NA, f"not applicable (remote): {iid}'s bootstrap server listens on the node's loopback",
                      f"run on the node, or tunnel it and pass --bootstrap-url {iid}=URL")
    p = urlsplit(url)
    why = port_open(p.hostname or "127.0.0.1", p.port or 8998, timeout_s=min(3.0, ctx.limit()))
    ctx.reached[root_of(url)] = why is None
    if why is not None:
        return Result(FAIL, f"{iid}{inst.where} bootstrap {p.netloc}: {why}",
                      f"{iid}'s bootstrap server is not listening: decode cannot find its ranks and PD requests "
                      f"routed to it hang or fail; check its disaggregation_bootstrap_port and its log: "
                      f"{unit_hint(ctx, iid)}")
    health = ctx.get(url + "/health", auth=False)
    if not (health.ok and health.text.strip() == "OK"):
        return Result(FAIL, f"{iid} bootstrap {p.netloc} listening; /health: {health.short()}",
                      f"the process on {p.netloc} is not SGLang's bootstrap server (port clash?)")
    route = ctx.get(url + ROUTE_QUERY, auth=False)
    want = inst.ranks
    if route.status == 503:
        return Result(FAIL, f"{iid} bootstrap {p.netloc} /health OK; /route: {route.short()}",
                      f"{iid}'s ranks have not all registered (plan: {want}); it is still loading or a rank "
                      f"died: {unit_hint(ctx, iid)}")
    info = route.json() if route.ok else None
    if not isinstance(info, dict):
        return Result(FAIL, f"{iid} bootstrap {p.netloc} /health OK; /route: {route.short()}",
                      "unexpected answer from /route")
    attn_tp = int(info.get("attn_tp_size") or 0)
    dp = int(info.get("dp_size") or 1)
    cp = int(info.get("attn_cp_size") or 1)
    pp = int(info.get("pp_size") or 1)
    ranks = attn_tp * dp * cp
    evidence = (f"{iid} bootstrap {p.netloc} /health OK; /route: attn_tp {attn_tp} x dp {dp}"
                + (f" x cp {cp}" if cp > 1 else "")
                + f" = {ranks} ranks per pipeline stage registered" + (f", pp {pp}" if pp > 1 else "")
                + f" (plan: {want}: tp_size {inst.tp_size}" + (f", dp_size {inst.dp_size}" if inst.dp_size > 1 else "")
                + ")")
    if ranks != want:
        return Result(FAIL, evidence, f"the running {iid} has another parallel layout than the plan: redeploy "
                                      f"(playbooks/deploy.yml) or restart {inst.unit or iid}")
    return Result(PASS, evidence)


def check_engine(ctx: Ctx, iid: str) -> Result:
    inst = ctx.t.instance(iid)
    base = inst.url
    if base is None:
        return Result(NA, f"not applicable (remote): {iid} listens on the node's loopback",
                      f"run on the node, or tunnel it and pass --instance-url {iid}=URL")
    health = ctx.get(base + "/health", auth=False)
    if not health.reached:
        return Result(FAIL, f"{iid}{inst.where} {base}/health: {health.short()}", conn_hint(health, iid, ctx, iid))
    if not health.ok:
        return Result(FAIL, f"{iid} {base}/health: {health.short()}",
                      f"{iid} answers but is not healthy (503 while loading the model; a dead peer makes "
                      f"health checks fail too): {unit_hint(ctx, iid)}")
    info_resp = ctx.get(base + "/server_info")
    if info_resp.status == 404:
        info_resp = ctx.get(base + "/get_server_info")
    if info_resp.status in (401, 403):
        return refused(ctx, iid, base + "/server_info", info_resp)
    info = info_resp.json() if info_resp.ok else None
    if not isinstance(info, dict):
        return Result(FAIL, f"{iid} /health OK; /server_info: {info_resp.short()}",
                      "unexpected answer from /server_info")
    got_dp = info.get("attn_dp_size")
    if got_dp is None:  # older spelling: enable_dp_attention + dp_size
        got_dp = info.get("dp_size", 1) if info.get("enable_dp_attention") else 1
    got = {"disaggregation_mode": info.get("disaggregation_mode"), "tp_size": info.get("tp_size"),
           "attn_dp_size": got_dp, "served_model_name": info.get("served_model_name")}
    expected = {"disaggregation_mode": inst.role, "tp_size": inst.tp_size, "attn_dp_size": inst.attn_dp_size,
                "served_model_name": ctx.run.expect.served_model_name}
    diffs = [f"{k} {got[k]!r} (plan {expected[k]!r})" for k in expected if got[k] != expected[k]]
    version = info.get("version")
    evidence = (f"{iid}{inst.where} {base}: /health OK; mode {got['disaggregation_mode']}, tp {got['tp_size']}, "
                f"attn-DP {got_dp}, model {got['served_model_name']!r}" + (f", SGLang {version}" if version else ""))
    if diffs:
        return Result(FAIL, f"{iid} {base}: /server_info disagrees with the plan: " + "; ".join(diffs),
                      f"the running {iid} was started with other arguments: redeploy (playbooks/deploy.yml) or "
                      f"restart {inst.unit or iid} so it reads the plan's {iid}.json")
    return Result(PASS, evidence)
