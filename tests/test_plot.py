"""`pdnode plan --plot` and `pdnode bench --plot`: the files are real PNG/SVG pictures, the
plan's shows every ranked layout with its KV path and the chosen one, the bench's has one
point per request, and a missing matplotlib or a wrong suffix is one line, not a traceback.
The bench picture of a real run (the real client through the real router) is drawn in
tests/test_bench.py's integration test."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_bench import args as bench_args
from test_bench import plan_dict, record
from test_planner import DEMO, measurement_args

from pdnode.commands import bench, bench_client, bench_report, plot
from pdnode.commands.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SVG = "{http://www.w3.org/2000/svg}"
# A python where `import matplotlib` fails, as on a machine without the plot extra.
NO_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None\nfrom pdnode.commands.cli import main\nsys.exit(main(sys.argv[1:]))"


@pytest.fixture
def runs(tmp_path: Path) -> list[str]:
    return measurement_args(tmp_path)


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()  # a parse error fails the test: not an SVG document  # noqa: S314 (the picture this test wrote)
    assert root.tag == f"{SVG}svg"
    return [" ".join("".join(t.itertext()).split()) for t in root.iter(f"{SVG}text")]


def requests(n_ok: int, n_failed: int) -> list[dict]:
    rows = [{"start_s": i * 0.25, "ttft_s": 0.02 + i / 1000, "e2e_s": 0.3 + i / 100, "ok": True} for i in range(n_ok)]
    rows += [{"start_s": 0.1 + i, "ttft_s": None, "e2e_s": None, "ok": False} for i in range(n_failed)]
    return rows


def bench_report_with(rows: list[dict]) -> dict:
    completed = sum(r["ok"] for r in rows)
    plan = plan_dict([{"gpus": [0, 1, 2, 3], "tp_size": 4}],
                     [{"gpus": [4, 5, 6, 7], "tp_size": 4, "attn_dp_size": 4, "ep_size": 4}])
    return bench_report.build_report(
        host="gpu01", client={"name": "sglang.bench_serving", "version": "0.5.23"}, plan=plan,
        workload=bench.workload(bench_args(requests=str(len(rows)))),
        record=record(completed=completed, errors=[""] * completed + ["x\nBad Request"] * (len(rows) - completed)),
        before=None, after=None, requests=rows)


# --- the plan -------------------------------------------------------------------------------
def test_plan_picture_lists_every_ranked_layout_with_its_kv_path_and_marks_the_chosen(
        runs: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), *runs, "--json"]) == 0
    ranking = json.loads(capsys.readouterr().out)
    ranked = [c for c in ranking["candidates"] if c["deployable"]][:5]
    assert {c["kv_path"] for c in ranked} == {"nvlink"}  # the demo: one host, NVLink between its GPUs
    svg = tmp_path / "plan.svg"
    assert main(["plan", str(DEMO), *runs, "--top", "5", "--plot", str(svg)]) == 0
    assert f"wrote {svg}" in capsys.readouterr().out
    texts = svg_texts(svg)
    for rank, cand in enumerate(ranked, start=1):
        label = " ".join(cand["layout"].split())
        row = next((t for t in texts if t.startswith(f"{rank} {label} [NVLink]")), None)
        assert row is not None, (label, texts)
        assert row.endswith("(chosen)") == (cand["layout"] == ranking["best"])
    assert sum(t.endswith("(chosen)") for t in texts) == 1
    assert not any(t.startswith("6 ") for t in texts)  # --top 5, as the table
    assert sum(t.startswith("c") and "[no hand-off]" in t for t in texts) == 3  # colocated, for comparison
    png = tmp_path / "plan.PNG"
    assert main(["plan", str(DEMO), *runs, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_plan_picture_points_are_the_predictions() -> None:
    points = [{"rank": 1, "label": "1P1D a", "path": "rdma", "request_s": 10.0, "ttft_s": 0.2, "best": True,
               "misses": False, "colocated": False},
              {"rank": 2, "label": "2P1D b", "path": "tcp", "request_s": 8.0, "ttft_s": 0.5, "best": False,
               "misses": True, "colocated": False},
              {"rank": 3, "label": "1P1D c", "path": "tcp", "request_s": 5.0, "ttft_s": float("inf"), "best": False,
               "misses": False, "colocated": False}]
    fig = plot.plan_figure(points, "t", ttft_max_s=0.3)
    ax = fig.axes[0]
    drawn = sorted(tuple(map(float, off)) for c in ax.collections for off in c.get_offsets())
    assert drawn == [(200.0, 10.0), (500.0, 8.0)]  # TTFT in ms against req/s; an unbounded TTFT is listed only
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"KV over RDMA", "KV over TCP", "chosen", "--ttft-max"} <= legend
    side = [t.get_text() for t in fig.axes[1].texts]
    assert any(t.startswith("  3  1P1D c  [TCP]") and "TTFT unbounded" in t for t in side), side
    plot.pyplot().close(fig)


# --- the bench ------------------------------------------------------------------------------
def test_bench_picture_has_one_point_per_request(tmp_path: Path) -> None:
    rep = bench_report_with(requests(10, 2))
    assert rep["results"]["completed"] == 10 and rep["results"]["failed"] == 2
    fig = plot.bench_figure(rep)
    over_time = fig.axes[0]
    counts = {c.get_label(): len(c.get_offsets()) for c in over_time.collections}
    assert counts == {"E2E (10)": 10, "TTFT (10)": 10, "failed (2)": 2}
    # TTFT and end-to-end latency, in ms, at each request's start
    ttft = next(c for c in over_time.collections if c.get_label().startswith("TTFT"))
    assert [tuple(map(float, p)) for p in ttft.get_offsets()][:2] == [(0.0, 20.0), (0.25, 21.0)]
    cdf = {line.get_label(): len(line.get_xdata()) for line in fig.axes[1].lines if not line.get_label().startswith("_")}
    assert cdf == {"E2E": 10, "TTFT": 10}
    assert "1P1D (prefill-0 TP 4, decode-0 TP 4 attn-DP 4 EP 4)" in fig._suptitle.get_text()
    assert "12 requests (10 completed, 2 failed)" in fig._suptitle.get_text()
    plot.pyplot().close(fig)
    svg, png = tmp_path / "bench.svg", tmp_path / "bench.png"
    bench.write_plot(rep, str(svg))
    bench.write_plot(rep, str(png))
    assert png.read_bytes()[:8] == PNG_MAGIC
    texts = svg_texts(svg)
    assert "E2E (10)" in texts and "failed (2)" in texts
    # one marker per request in the SVG as well (each a <use> in its series' group)
    groups = {g.get("id"): len(list(g.iter(f"{SVG}use"))) for g in ET.parse(svg).getroot().iter(f"{SVG}g")  # noqa: S314 (the picture this test wrote)
              if g.get("id", "").startswith("requests-")}
    assert groups == {"requests-e2e": 10, "requests-ttft": 10, "requests-failed": 2}


def test_a_report_without_per_request_records_is_refused_with_one_line() -> None:
    rep = bench_report_with(requests(3, 0))
    rep["requests"] = None  # a report from before the records, or where the client wrote none
    with pytest.raises(plot.PlotError, match="no per-request records") as exc:
        plot.bench_figure(rep)
    assert exc.value.code == 1 and "\n" not in str(exc.value)


def test_the_per_request_records_are_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "r.json"
    good.write_text(json.dumps(requests(2, 1)))
    rows, why = bench_report.parse_request_records(good)
    assert why is None and [r["ok"] for r in rows] == [True, True, False]
    assert bench_report.parse_request_records(tmp_path / "missing.json") == (None, "the client wrote none")
    for bad in ([{"start_s": 0, "ok": True, "ttft_s": None, "e2e_s": 1.0}], {"a": 1}, [{"start_s": "0"}]):
        good.write_text(json.dumps(bad))
        assert bench_report.parse_request_records(good)[0] is None
    good.write_text("{")
    assert bench_report.parse_request_records(good)[1].startswith("not JSON")
    # a count that differs from what was sent is said
    rep = bench_report_with(requests(3, 0))
    rep2 = bench_report.build_report(host="h", client={}, plan=plan_dict([], []), workload=rep["workload"] | {
        "requests": 4}, record=record(completed=3, errors=[""] * 3), before=None, after=None,
        requests=requests(3, 0))
    assert "the client timed 3 requests, 4 were sent" in rep2["notes"]


def test_the_client_wrapper_keeps_what_the_client_measured() -> None:
    # calculate_metrics' outputs: RequestFuncOutput fields (perf_counter seconds)
    outs = [SimpleNamespace(start_time=100.5, ttft=0.05, latency=0.4, success=True),
            SimpleNamespace(start_time=100.0, ttft=0.0, latency=0.0, success=False),
            SimpleNamespace(start_time=101.25, ttft=0.0625, latency=0.5, success=True)]
    assert bench_client._records(outs) == [
        {"start_s": 0.5, "ttft_s": 0.05, "e2e_s": 0.4, "ok": True},
        {"start_s": 0.0, "ttft_s": None, "e2e_s": None, "ok": False},
        {"start_s": 1.25, "ttft_s": 0.0625, "e2e_s": 0.5, "ok": True}]


# --- refusals -----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["plan", "bench"])
@pytest.mark.parametrize("name, words", [("x.jpg", "'.jpg' is not a picture format"),
                                         ("x", "'(none)' is not a picture format"),
                                         ("nodir/x.png", "its directory does not exist")])
def test_a_bad_plot_file_is_one_line_exit_1_before_any_work(command: str, name: str, words: str, runs: list[str],
                                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / name
    extra = runs if command == "plan" else ["--base-url", "http://127.0.0.1:9"]  # bench: nothing listens there
    assert main([command, str(DEMO), *extra, "--plot", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert not target.exists()


@pytest.mark.parametrize("command", ["plan", "bench"])
def test_without_matplotlib_plot_is_one_line_exit_2_and_the_rest_works(command: str, runs: list[str],
                                                                        tmp_path: Path) -> None:
    extra = runs if command == "plan" else ["--base-url", "http://127.0.0.1:9"]
    out = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, command, str(DEMO), *extra,
                          "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "needs matplotlib" in out.stderr and "pip install 'pdnode[plot]'" in out.stderr
    assert not (tmp_path / "p.png").exists()
    if command == "plan":  # the same command without --plot needs no matplotlib
        out = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, "plan", str(DEMO), *runs],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "best deployable" in out.stdout, out.stderr


def test_matplotlib_is_imported_only_for_a_picture(runs: list[str]) -> None:
    code = ("import sys; from pdnode.commands.cli import main\n"
            f"main(['plan', {str(DEMO)!r}, *{runs!r}])\n"
            "for argv in (['bench', '--help'], ['plan', '--help'], ['--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "False", out.stderr
