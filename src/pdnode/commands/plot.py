"""Pictures for people: `pdnode plan --plot FILE` and `pdnode bench --plot FILE`.

matplotlib is an optional dependency (the `plot` extra): it is imported only when a
picture is asked for, with the Agg backend (no display), so the other commands neither
need it nor pay for its import. The file's suffix picks the format: .png or .svg. SVG
keeps text as text (svg.fonttype none), so a picture's labels can be searched and tested.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FORMATS = (".png", ".svg")
INSTALL_HINT = "pip install 'pdnode[plot]' (or: .venv/bin/pip install matplotlib)"
# How the plan's KV paths (pdnode.core.plan.kv_path) are named in a picture, and their colours.
PATH_NAMES = {"nvlink": "NVLink", "rdma": "RDMA", "tcp": "TCP", "nixl": "NIXL"}
PATH_COLOURS = {"nvlink": "tab:green", "rdma": "tab:blue", "tcp": "tab:red", "nixl": "tab:purple"}


class PlotError(Exception):
    """One line for the user; .code is the exit code (1 bad input, 2 cannot run)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def check_target(path: str) -> str:
    """The format of --plot PATH ('png' or 'svg'), or PlotError (exit 1) naming the fix.
    Checked before any work, as is matplotlib (`pyplot()`), so that a long benchmark
    does not end in a refusal."""
    target = Path(path)
    if target.suffix.lower() not in FORMATS:
        raise PlotError(f"--plot {path}: the suffix {target.suffix or '(none)'!r} is not a picture format pdnode "
                        f"writes; give a file ending in .png or .svg", 1)
    if not target.resolve().parent.is_dir():
        raise PlotError(f"--plot {path}: its directory does not exist; create it or give another path", 1)
    return target.suffix.lower().lstrip(".")


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or PlotError (exit 2) saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}", 2) from None
    plt.rcParams["svg.fonttype"] = "none"  # text stays text in SVG
    plt.rcParams["svg.hashsalt"] = "pdnode"  # the same picture gives the same file
    return plt


def save(fig: Any, path: str) -> None:
    """Writes the figure (format by suffix); OSError names the file."""
    fmt = check_target(path)
    try:
        fig.savefig(path, format=fmt, dpi=120, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else {})
    finally:
        pyplot().close(fig)


def path_name(path: str | None) -> str:
    return PATH_NAMES.get(path or "", path or "no hand-off")


# --- the plan ---------------------------------------------------------------------------------
def plan_figure(points: Sequence[Mapping[str, Any]], title: str, ttft_max_s: float | None = None,
                measured: Sequence[Mapping[str, Any]] = ()) -> Any:
    """Layouts ranked: request throughput against mean TTFT, each point numbered by its
    rank and listed beside the chart with its layout, KV path and numbers; the chosen
    one a star. A point: {rank, label, path, request_s, ttft_s, best, misses, colocated}.
    ``measured``: bench runs of the deployed layout ({label, request_s, ttft_s}), drawn as
    black diamonds beside the predictions (the prior's calibrated mode)."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    fig, (ax, side) = plt.subplots(1, 2, figsize=(15, 6.5), gridspec_kw={"width_ratios": [1.15, 1]})
    side.axis("off")
    legend: dict[str, Any] = {}
    at: dict[tuple[float, float], list[str]] = {}  # layouts predicted alike share a point: one tag lists them
    lines = []
    for pt in points:
        tag = str(pt["rank"])
        colour = "0.55" if pt["colocated"] else PATH_COLOURS.get(pt["path"] or "", "tab:gray")
        if math.isfinite(pt["ttft_s"]) and math.isfinite(pt["request_s"]):
            x, y = pt["ttft_s"] * 1000, pt["request_s"]
            at.setdefault((float(f"{x:.4g}"), float(f"{y:.4g}")), []).append(tag)
            if pt["best"]:
                ax.scatter([x], [y], s=300, marker="*", color=colour, edgecolors="black", zorder=4)
                legend["chosen"] = Line2D([], [], marker="*", markersize=14, color="0.4", markeredgecolor="black",
                                          linestyle="none", label="chosen")
            elif pt["colocated"]:
                ax.scatter([x], [y], s=50, marker="x", color=colour, zorder=2)
                legend["colocated"] = Line2D([], [], marker="x", color=colour, linestyle="none",
                                             label="colocated (comparison)")
            else:
                ax.scatter([x], [y], s=60, marker="o", zorder=3, edgecolors=colour,
                           facecolors="none" if pt["misses"] else colour)
                if pt["misses"]:
                    legend["misses"] = Line2D([], [], marker="o", markerfacecolor="none", color="0.4",
                                              linestyle="none", label="misses --ttft-max/--itl-max")
            if not pt["colocated"]:
                legend.setdefault(f"path {pt['path']}", Line2D([], [], marker="o", color=colour, linestyle="none",
                                                                label=f"KV over {path_name(pt['path'])}"))
        ttft = f"{pt['ttft_s'] * 1000:,.1f} ms" if math.isfinite(pt["ttft_s"]) else "unbounded"
        note = " (chosen)" if pt["best"] else " (misses the limits)" if pt["misses"] else ""
        lines.append((f"{tag:>3}  {pt['label']}  [{path_name(pt['path'])}]"
                      f"  {pt['request_s']:.2f} req/s, TTFT {ttft}{note}", pt["best"]))
    for i, ((x, y), tags) in enumerate(sorted(at.items())):  # neighbours' tags alternate above and below
        ax.annotate(", ".join(tags), (x, y), textcoords="offset points", xytext=(7, 5 if i % 2 == 0 else -14),
                    fontsize=9)
    for i, run in enumerate(measured):
        ax.scatter([run["ttft_s"] * 1000], [run["request_s"]], s=70, marker="D", color="black", zorder=5)
        ax.annotate(f"m{i + 1}", (run["ttft_s"] * 1000, run["request_s"]), textcoords="offset points",
                    xytext=(7, -14), fontsize=9)
        legend["measured"] = Line2D([], [], marker="D", color="black", linestyle="none", label="measured (bench)")
        lines.append((f" m{i + 1}  {run['label']}  measured {run['request_s']:.2f} req/s, "
                      f"TTFT {run['ttft_s'] * 1000:,.1f} ms", False))
    if ttft_max_s is not None:
        ax.axvline(ttft_max_s * 1000, color="tab:red", alpha=0.5, linestyle="--")
        legend["limit"] = Line2D([], [], color="tab:red", alpha=0.5, linestyle="--", label="--ttft-max")
    ax.set_xlabel("mean TTFT (ms)")
    ax.set_ylabel("request throughput (req/s)")
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(handles=sorted(legend.values(), key=lambda h: h.get_label()), loc="best", fontsize=9)
    side.text(0, 1, "rank  layout  [KV path]  predicted", fontsize=9, family="monospace", weight="bold",
              va="top", transform=side.transAxes)
    step = min(0.05, 0.95 / max(len(lines), 1))
    for i, (line, best) in enumerate(lines):
        side.text(0, 0.95 - i * step, line, fontsize=8, family="monospace", va="top", transform=side.transAxes,
                  weight="bold" if best else "normal")
    fig.suptitle(title, fontsize=11)
    return fig


# --- the bench --------------------------------------------------------------------------------
def bench_figure(report: Mapping[str, Any]) -> Any:
    """Latency over the run (each request's TTFT and end-to-end latency at the time it
    started; a failed request a cross) and their distribution (CDF, p50 and p99 marked).
    Needs the report's per-request records (`requests`, pdnode bench since --plot)."""
    rows = report.get("requests")
    if not isinstance(rows, list) or not rows:
        raise PlotError("the bench report has no per-request records to draw (`requests`); run pdnode bench "
                        "again", 1)
    plt = pyplot()
    ok = [r for r in rows if r["ok"]]
    failed = [r for r in rows if not r["ok"]]
    fig, (over_time, dist) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1.6, 1]})
    series = (("E2E", "e2e_s", "tab:blue"), ("TTFT", "ttft_s", "tab:orange"))
    for name, key, colour in series:
        over_time.scatter([r["start_s"] for r in ok], [r[key] * 1000 for r in ok], s=12, color=colour,
                          label=f"{name} ({len(ok)})", zorder=3, gid=f"requests-{key[:-2]}")
    if failed:
        over_time.scatter([r["start_s"] for r in failed], [0.0] * len(failed), s=40, marker="x", color="tab:red",
                          label=f"failed ({len(failed)})", zorder=4, gid="requests-failed")
    over_time.set_xlabel("request start (s after the first)")
    over_time.set_ylabel("latency (ms)")
    over_time.set_title("each request's latency over the run", fontsize=10)
    over_time.grid(True, alpha=0.3)
    over_time.legend(fontsize=9)
    for name, key, colour in series:
        values = sorted(r[key] * 1000 for r in ok)
        if not values:
            continue
        n = len(values)
        dist.step(values, [(i + 1) / n for i in range(n)], where="post", color=colour, label=name)
        for q in (0.5, 0.99):
            v = values[min(n - 1, max(0, math.ceil(q * n) - 1))]
            dist.axvline(v, color=colour, alpha=0.35, linestyle="--")
            dist.annotate(f"p{int(q * 100)} {v:,.1f}", (v, q), textcoords="offset points", xytext=(4, -10),
                          fontsize=8, color=colour)
    dist.set_xlabel("latency (ms)")
    dist.set_ylabel("fraction of completed requests")
    dist.set_ylim(0, 1.02)
    dist.set_title("distribution (CDF)", fontsize=10)
    dist.grid(True, alpha=0.3)
    dist.legend(fontsize=9, loc="lower right")
    fig.suptitle(bench_title(report), fontsize=11)
    return fig


def bench_title(report: Mapping[str, Any]) -> str:
    from .bench_report import shape_text

    w, res, lay = report["workload"], report["results"], report.get("layout") or {}
    prefill, decode = lay.get("prefill") or [], lay.get("decode") or []
    layout = f"{len(prefill)}P{len(decode)}D (" + ", ".join(f"{i['id']} {shape_text(i)}" for i in prefill + decode) + ")"
    load = f"concurrency {w['concurrency']}" if w.get("concurrency") else f"rate {w.get('rate')} req/s"
    return (f"pdnode bench {report.get('host')}: {layout}\n{w['requests']} requests ({res['completed']} completed, "
            f"{res['failed']} failed), {load}, input {w['input_len']} / output {w['output_len']} tokens")
