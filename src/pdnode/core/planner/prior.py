"""NVIDIA aiconfigurator as a prior for `pdnode plan --prior` (docs/planner.md): what a
prefill/decode layout of SGLang would serve on a GPU, from aiconfigurator's kernel
database, before any GPU hour.

The one module that imports aiconfigurator (the optional `prior` extra). It is imported
inside the functions, so `import pdnode` neither needs nor pays for it (pandas, pyarrow,
scipy come with it). Everything returned is plain: times in seconds (aiconfigurator
reports ms), rates per second, strings. Its global state is left as found: the latency
correction scales it keeps as module constants are set for one call and restored, its
loggers are quietened for the call only, and the warnings filter it installs on import
is undone.

Errors: PriorUnavailable (not installed: exit 2), Unsupported (the model or GPU is not in
its database: exit 1, naming what is), Infeasible (one layout does not fit or is an
invalid split: that layout is rejected with the reason, the ranking goes on).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

BACKEND = "sglang"
MODE = "disagg"
INSTALL_HINT = "pip install 'pdnode[prior]' (or: .venv/bin/pip install aiconfigurator==0.12.0 aiconfigurator-core==0.12.0)"
# pdnode_gpu_model (as nvidia-smi prints it, src/pdnode/data/gpu-memory.json) -> the
# system aiconfigurator's database is collected on. Only GPUs that are the same part: an
# H200 NVL or an H100 PCIe has other clocks and links than the SXM boards measured.
GPU_SYSTEMS = {
    "NVIDIA H200": "h200_sxm",
    "NVIDIA H100 80GB HBM3": "h100_sxm",
    "NVIDIA B200": "b200_sxm",
    "NVIDIA GB200": "gb200",
    "NVIDIA A100-SXM4-80GB": "a100_sxm",
    "NVIDIA L40S": "l40s",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx_pro_6000_server",
}
# How many supported names a message lists before "... and N more".
SHOW = 6

_LOGGERS = ("aiconfigurator", "aiconfigurator_core")
# cli_estimate reads its correction scales from module constants (aiconfigurator/cli/api.py):
# one estimate at a time may change them.
_lock = threading.Lock()
# Estimates already made in this process, by every argument (a ranking asks the same layout
# again: its best pair after the walk; a calibrated ranking the measured layouts): an
# Estimate, or why it does not fit. The database does not change under a running process.
_memo: dict[tuple[Any, ...], Estimate | str] = {}


class PriorError(Exception):
    """Every error of this module: one line for the user."""


class PriorUnavailable(PriorError):
    """aiconfigurator cannot be imported (the `prior` extra is not installed)."""


class Unsupported(PriorError):
    """The model or GPU is not in aiconfigurator's database for SGLang disaggregation."""


class Infeasible(PriorError):
    """aiconfigurator refuses this one layout (out of memory, a split the model cannot take)."""


@dataclass(frozen=True)
class Layout:
    """A PD layout in pdnode's terms: instances of one size per role. decode_tp is the
    decode instance's GPU count (SGLang's tp_size), split into decode_attn_dp attention
    ranks; decode_ep its expert-parallel size. Prefill is plain TP (layouts.py)."""

    prefill_tp: int
    prefill_workers: int
    decode_tp: int
    decode_workers: int
    decode_attn_dp: int = 1
    decode_ep: int = 1
    prefill_ep: int = 1

    @property
    def gpus(self) -> int:
        return self.prefill_tp * self.prefill_workers + self.decode_tp * self.decode_workers


@dataclass(frozen=True)
class Estimate:
    """aiconfigurator's disaggregated estimate of one layout at one batch, in seconds."""

    ttft_s: float  # with its queueing factor and prefill correction scale; no KV hand-off
    tpot_s: float
    request_s: float  # seq/s: the smaller of the prefill and decode pools' rates (rate-matched)
    output_tok_s: float
    tok_s_per_gpu: float
    prefill_request_s_per_worker: float
    decode_request_s_per_worker: float
    gpus: int
    version: str  # the SGLang version of the database rows used

    def as_dict(self) -> dict[str, Any]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "request_throughput": self.request_s,
                "output_token_throughput": self.output_tok_s, "output_tok_s_per_gpu": self.tok_s_per_gpu,
                "prefill_request_s_per_worker": self.prefill_request_s_per_worker,
                "decode_request_s_per_worker": self.decode_request_s_per_worker, "gpus": self.gpus,
                "database_sglang": self.version}


# --- aiconfigurator itself ----------------------------------------------------------------------

@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Its WARNING lines ("memory status is not set", fallback rows) go to stderr through
    logging's last resort: raise its loggers to ERROR for the call, and keep its warnings
    filters (inference_session installs an ignore-FutureWarning for the whole process)."""
    saved = {name: logging.getLogger(name).level for name in _LOGGERS}
    filters = warnings.filters[:]
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        warnings.filters[:] = filters
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@functools.cache
def _modules() -> tuple[Any, Any, Any]:
    try:
        with _quiet():
            from aiconfigurator.cli import api
            from aiconfigurator_core.sdk import common, perf_database
    except ImportError as exc:
        raise PriorUnavailable(f"--prior needs aiconfigurator, which is not importable ({exc}): {INSTALL_HINT}") from None
    return api, common, perf_database


def available() -> bool:
    try:
        _modules()
    except PriorUnavailable:
        return False
    return True


def aic_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    _modules()
    try:
        return version("aiconfigurator")
    except PackageNotFoundError:
        return "unknown"


def short_list(names: list[str]) -> str:
    """The first few names and how many more: a one-line message stays one line."""
    shown = ", ".join(names[:SHOW])
    return shown + (f" ... and {len(names) - SHOW} more" if len(names) > SHOW else "")


@functools.cache
def _databases() -> dict[str, list[str]]:
    """system -> the SGLang versions its database holds."""
    _, _, pdb = _modules()
    with _quiet():
        found = pdb.get_supported_databases()
    return {system: list(by_backend[BACKEND]) for system, by_backend in found.items() if by_backend.get(BACKEND)}


def system_for_gpu(gpu_model: str) -> str:
    """The aiconfigurator system of a pdnode_gpu_model, or Unsupported naming those it knows."""
    system = GPU_SYSTEMS.get(gpu_model)
    if system is None or system not in _databases():
        known = sorted(g for g, s in GPU_SYSTEMS.items() if s in _databases())
        raise Unsupported(f"pdnode_gpu_model={gpu_model!r} is not in aiconfigurator's SGLang database; it has "
                          f"{len(known)} GPU(s): {short_list(known)}")
    return system


def database_versions(system: str) -> list[str]:
    """The SGLang versions of the system's database, oldest first."""
    versions = _databases().get(system)
    if not versions:
        raise Unsupported(f"aiconfigurator has no SGLang database for {system!r}; it has: {short_list(sorted(_databases()))}")
    return versions


@functools.cache
def default_version(system: str) -> str:
    """aiconfigurator's own choice (its "current" slot, what cli_estimate uses unpinned).
    Resolved once: unpinned, every estimate re-parses YAML to find it (1.5 s against 0.02 s)."""
    versions = database_versions(system)
    _, _, pdb = _modules()
    with _quiet():
        slots = pdb.get_version_slots(system, BACKEND) or {}
    return slots.get("current") or versions[-1]


@functools.cache
def supported_models(system: str, version: str | None = None) -> tuple[str, ...]:
    """HF ids its support matrix marks PASS, from measured (silicon) data, for SGLang
    disaggregation on the system at the version, and whose config.json it ships (any other
    it would fetch from the hub)."""
    version = version or default_version(system)
    _, common, _ = _modules()
    with _quiet():
        rows = common.get_support_matrix()
    return tuple(sorted({r["HuggingFaceID"] for r in rows
                         if r["System"] == system and r["Backend"] == BACKEND and r["Mode"] == MODE
                         and r["Version"] == version and r["Status"] == "PASS"
                         # its own rule (sdk/common.py _is_silicon_support_row): an empty Source is no proof
                         and ("Source" not in r or r["Source"] == "silicon")
                         and bundled_config(r["HuggingFaceID"]) is not None}))


def check_model(model: str, system: str, version: str | None = None) -> None:
    """Unsupported unless the support matrix lists the model: an id it does not bundle
    would make aiconfigurator fetch config.json from the hub, which pdnode never does."""
    models = supported_models(system, version)
    if model not in models:
        raise Unsupported(f"model {model!r} is not in aiconfigurator's SGLang {version or default_version(system)} "
                          f"disaggregated database for {system}; it has {len(models)}: {short_list(list(models))}")


def model_for_path(path: str, system: str, version: str | None = None) -> str | None:
    """The supported HF id whose name is the model directory's (case-insensitive):
    /models/Qwen3-30B-A3B-FP8 -> Qwen/Qwen3-30B-A3B-FP8; None without one."""
    base = path.rstrip("/").rsplit("/", 1)[-1].lower()
    found = [m for m in supported_models(system, version) if m.rsplit("/", 1)[-1].lower() == base]
    return found[0] if len(found) == 1 else None


@functools.cache
def bundled_config(model: str) -> dict[str, Any] | None:
    """The config.json aiconfigurator ships for the HF id (aiconfigurator_core/model_configs,
    <org>--<name>_config.json), or None."""
    from importlib import resources

    _modules()
    try:
        text = (resources.files("aiconfigurator_core") / "model_configs"
                / f"{model.replace('/', '--')}_config.json").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    try:
        cfg = json.loads(text)
    except ValueError:
        return None
    return cfg if isinstance(cfg, dict) else None


def kv_bytes_per_token(model: str) -> int | None:
    """KV cache bytes per prompt token of the bundled config (bf16 cache, as the plan counts)."""
    from ..plan.kv_path import kv_bytes_from_config

    return kv_bytes_from_config(bundled_config(model))


# --- one estimate -------------------------------------------------------------------------------

def aic_arguments(layout: Layout, moe: bool) -> dict[str, int]:
    """cli_estimate's parallel sizes for a layout. aiconfigurator counts a worker's GPUs as
    tp x attention_dp, so a decode instance of tp_size t with attention DP d is its tp t/d,
    attention_dp d; experts spread over the same t GPUs: moe_ep = ep_size, moe_tp = t / ep
    (SGLang 0.5.23 shards experts over tp_size / ep_size). Dense models take no MoE sizes."""
    out = {"prefill_tp_size": layout.prefill_tp, "prefill_attention_dp_size": 1,
           "prefill_num_workers": layout.prefill_workers,
           "decode_tp_size": layout.decode_tp // layout.decode_attn_dp,
           "decode_attention_dp_size": layout.decode_attn_dp, "decode_num_workers": layout.decode_workers}
    if moe:
        out.update(prefill_moe_ep_size=layout.prefill_ep, prefill_moe_tp_size=layout.prefill_tp // layout.prefill_ep,
                   decode_moe_ep_size=layout.decode_ep, decode_moe_tp_size=layout.decode_tp // layout.decode_ep)
    return out


@contextlib.contextmanager
def _scales(api: Any, prefill: float | None, decode: float | None) -> Iterator[None]:
    """cli_estimate takes aiconfigurator's latency correction scales from module constants
    (api.DEFAULT_*_LATENCY_CORRECTION_SCALE); a calibrated prior multiplies them, for this
    call only."""
    names = ("DEFAULT_PREFILL_LATENCY_CORRECTION_SCALE", "DEFAULT_DECODE_LATENCY_CORRECTION_SCALE")
    saved = tuple(getattr(api, n) for n in names)
    with _lock:
        try:
            for name, base, factor in zip(names, saved, (prefill, decode)):
                setattr(api, name, base * (1.0 if factor is None else factor))
            yield
        finally:
            for name, value in zip(names, saved):
                setattr(api, name, value)


def estimate(model: str, system: str, isl: int, osl: int, layout: Layout, prefill_batch: int, decode_batch: int, *,
             moe: bool, version: str | None = None, prefill_scale: float | None = None,
             decode_scale: float | None = None) -> Estimate:
    """aiconfigurator's estimate of the layout: prefill_batch prompts per prefill pass,
    decode_batch running requests per attention-DP rank. prefill_scale / decode_scale
    multiply its own latency correction scales (calibration: measured / prior)."""
    api, _, _ = _modules()
    version = version or default_version(system)
    key = (model, system, isl, osl, layout, prefill_batch, decode_batch, moe, version, prefill_scale, decode_scale)
    if key in _memo:
        found = _memo[key]
        if isinstance(found, str):
            raise Infeasible(found)
        return found
    try:
        _memo[key] = _estimate(api, model, system, isl, osl, layout, prefill_batch, decode_batch, moe, version,
                               prefill_scale, decode_scale)
    except Infeasible as exc:
        _memo[key] = str(exc)
        raise
    return _memo[key]


def _estimate(api: Any, model: str, system: str, isl: int, osl: int, layout: Layout, prefill_batch: int,
              decode_batch: int, moe: bool, version: str, prefill_scale: float | None,
              decode_scale: float | None) -> Estimate:
    if version not in database_versions(system):
        raise Unsupported(f"SGLang version {version!r} is not in aiconfigurator's {system} database; it has "
                          f"{short_list(database_versions(system))}")
    check_model(model, system, version)
    kwargs = aic_arguments(layout, moe)
    try:
        with _quiet(), _scales(api, prefill_scale, decode_scale):
            res = api.cli_estimate(model, system, mode=MODE, backend_name=BACKEND, backend_version=version,
                                   isl=isl, osl=osl, prefill_batch_size=prefill_batch,
                                   decode_batch_size=decode_batch, **kwargs)
    except (RuntimeError, ValueError, AssertionError, KeyError, ZeroDivisionError) as exc:
        # RuntimeError "OOM: the model ... does not fit"; ValueError a split the model's
        # shapes cannot take (an FP8 block, heads over TP)
        raise Infeasible(" ".join(str(exc).split())[:300] or type(exc).__name__) from None
    row = res.get()
    ms = 1e-3
    return Estimate(ttft_s=float(row["ttft"]) * ms, tpot_s=float(row["tpot"]) * ms, request_s=float(row["seq/s"]),
                    output_tok_s=float(row["tokens/s"]), tok_s_per_gpu=float(row["tokens/s/gpu"]),
                    prefill_request_s_per_worker=float(row["(p)seq/s/worker"]),
                    decode_request_s_per_worker=float(row["(d)seq/s/worker"]),
                    gpus=int(row["num_total_gpus"]), version=str(res.backend_version))


# --- the batch a layout runs best at ------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    """A layout at the batch sizes that serve the most within the limits."""

    prefill_batch: int  # prompts per prefill pass
    decode_batch: int  # running requests per decode attention-DP rank
    estimate: Estimate  # aiconfigurator's, at these batches
    ttft_s: float  # its TTFT plus the KV hand-off
    misses_ttft: bool
    misses_tpot: bool
    bottleneck: str  # "prefill" or "decode": the pool whose rate the layout serves at


def _rate_matching() -> tuple[float, float]:
    """What aiconfigurator derates each pool's rate by before taking the smaller
    (aiconfigurator/sdk/picking.py: pipeline bubbles 0.9, an unsaturated decode batch 0.92)."""
    _modules()
    from aiconfigurator.sdk import picking

    return (float(getattr(picking, "_RATE_MATCHING_PREFILL_DEGRADATION_FACTOR", 1.0)),
            float(getattr(picking, "_RATE_MATCHING_DECODE_DEGRADATION_FACTOR", 1.0)))


class Search:
    """The batches each layout serves best at, for one model, workload and calibration.

    aiconfigurator models a disaggregated layout as a prefill pass of the prefill batch and
    a decode step of the decode batch, independently (DisaggInferenceSession.run_disagg):
    TTFT and the prefill rate follow the prefill instances' shape and batch alone, TPOT and
    the decode rate the decode instances' shape and batch alone, and the layout serves the
    smaller rate. So each grid is walked once per instance shape (the other batch at its
    smallest; a shape seen in another layout is not asked again), and the chosen pair is
    estimated again as a whole: the numbers reported are cli_estimate's own."""

    def __init__(self, model: str, system: str, isl: int, osl: int, *, moe: bool, prefill_batches: tuple[int, ...],
                 decode_batches: tuple[int, ...], ttft_max: float | None = None, tpot_max: float | None = None,
                 version: str | None = None, prefill_scale: float | None = None,
                 decode_scale: float | None = None) -> None:
        self.model, self.system, self.isl, self.osl, self.moe = model, system, isl, osl, moe
        self.prefill_batches, self.decode_batches = prefill_batches, decode_batches
        self.ttft_max, self.tpot_max = ttft_max, tpot_max
        self.version = version or default_version(system)
        self.scales = (prefill_scale, decode_scale)
        self.calls = 0
        # (prefill tp, ep, batch) -> (TTFT, the rate of one prefill instance); None: does not fit
        self._prefill: dict[tuple[int, int, int], tuple[float, float] | None] = {}
        # (decode tp, attention DP, ep, batch per rank) -> (TPOT, the rate of one decode instance)
        self._decode: dict[tuple[int, int, int, int], tuple[float, float] | None] = {}

    def estimate(self, layout: Layout, prefill_batch: int, decode_batch: int) -> Estimate:
        self.calls += 1
        return estimate(self.model, self.system, self.isl, self.osl, layout, prefill_batch, decode_batch, moe=self.moe,
                        version=self.version, prefill_scale=self.scales[0], decode_scale=self.scales[1])

    def _walk(self, layout: Layout, first: Estimate | None) -> tuple[dict[int, tuple[float, float]],
                                                                    dict[int, tuple[float, float]]]:
        """Each role's grid for the layout's shapes: the prefill with the decode at its
        smallest batch, the decode with the prefill at its smallest. A batch that does not
        fit ends its walk (a larger one needs more memory still)."""
        p0, d0 = self.prefill_batches[0], self.decode_batches[0]
        pkey, dkey = (layout.prefill_tp, layout.prefill_ep), (layout.decode_tp, layout.decode_attn_dp, layout.decode_ep)

        def side(cache: dict, key: tuple, pb: int, db: int, pick: Any) -> tuple[float, float] | None:
            if key not in cache:
                try:
                    e = first if first is not None and (pb, db) == (p0, d0) else self.estimate(layout, pb, db)
                    cache[key] = pick(e)
                except Infeasible:
                    cache[key] = None
            return cache[key]

        prefill: dict[int, tuple[float, float]] = {}
        for pb in self.prefill_batches:
            got = side(self._prefill, (*pkey, pb), pb, d0, lambda e: (e.ttft_s, e.prefill_request_s_per_worker))
            if got is None:
                break
            prefill[pb] = got
        decode: dict[int, tuple[float, float]] = {}
        for db in self.decode_batches:
            got = side(self._decode, (*dkey, db), p0, db, lambda e: (e.tpot_s, e.decode_request_s_per_worker))
            if got is None:
                break
            decode[db] = got
        return prefill, decode

    def best(self, layout: Layout, handoff_s: float = 0.0) -> Choice:
        """The batches that give the most output tokens/s within --ttft-max (TTFT with the
        hand-off) and --tpot-max; when no pair meets them, the best pair, marked.
        Infeasible when the smallest batches do not fit: the layout itself does not."""
        p0, d0 = self.prefill_batches[0], self.decode_batches[0]
        pkey, dkey = (layout.prefill_tp, layout.prefill_ep, p0), (layout.decode_tp, layout.decode_attn_dp,
                                                                  layout.decode_ep, d0)
        known = self._prefill.get(pkey) is not None and self._decode.get(dkey) is not None
        first = None if known else self.estimate(layout, p0, d0)  # Infeasible: the layout is
        prefill, decode = self._walk(layout, first)
        fp, fd = _rate_matching()
        prate = {pb: rate * layout.prefill_workers * fp for pb, (_, rate) in prefill.items()}
        drate = {db: rate * layout.decode_workers * fd for db, (_, rate) in decode.items()}
        feedable = max(prate.values())
        # a decode batch beyond the first that the prefill cannot keep full adds TPOT, not throughput
        enough = [db for db in drate if drate[db] >= feedable]
        dbs = [db for db in drate if not enough or db <= enough[0]]

        def meets(pb: int, db: int) -> bool:
            return ((self.ttft_max is None or prefill[pb][0] + handoff_s <= self.ttft_max)
                    and (self.tpot_max is None or decode[db][0] <= self.tpot_max))

        pairs = [(pb, db) for pb in prefill for db in dbs]
        # ties (4 significant digits) go to the lower TTFT, then the lower TPOT: smaller batches
        pb, db = min([p for p in pairs if meets(*p)] or pairs,
                     key=lambda p: (-float(f"{min(prate[p[0]], drate[p[1]]):.4g}"), prefill[p[0]][0],
                                    decode[p[1]][0]))
        e = first if first is not None and (pb, db) == (p0, d0) else self.estimate(layout, pb, db)
        ttft = e.ttft_s + handoff_s
        return Choice(prefill_batch=pb, decode_batch=db, estimate=e, ttft_s=ttft,
                      misses_ttft=self.ttft_max is not None and ttft > self.ttft_max,
                      misses_tpot=self.tpot_max is not None and e.tpot_s > self.tpot_max,
                      bottleneck="prefill" if prate[pb] < drate[db] else "decode")
