"""The per-pair probe (pdnode.node.pair_probe; docs/field-failures.md row 4) against a
stand-in node: a served pair writes 1, a pair broken as sglang#13054 breaks it (one failed
Mooncake write blacklists the decode's session while both engines answer /health) writes 0
and names the pair, and the metrics file is what Prometheus's own parser (promtool) reads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdnode.node import pair_probe

from .node import standin_node

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "monitoring"))
from promplans import promtool  # noqa: E402


def _spec(tmp_path, node, **over) -> str:
    spec = {"engines": [{"id": "prefill-0", "role": "prefill", "url": node.prefill_url,
                         "bootstrap_port": node.ports["bootstrap"]},
                        {"id": "decode-0", "role": "decode", "url": node.decode_url}],
            "api_key_file": None, "timeout_s": 20, "out": str(tmp_path / "pairs.prom"), **over}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def _run(spec: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdnode.node.pair_probe", "--spec", spec], capture_output=True,
                          text=True, timeout=120)


def _success(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("pdnode_pair_probe_success{"):
            labels, value = line[len("pdnode_pair_probe_success{"):].split("} ")
            got = dict(kv.split("=", 1) for kv in labels.split(","))
            out[(got["prefill"].strip('"'), got["decode"].strip('"'))] = float(value)
    return out


@pytest.mark.integration
def test_a_served_pair_is_1_and_a_blacklisted_pair_is_0_naming_it(tmp_path):
    with standin_node(tmp_path / "node", env={"SGLANG_ENABLE_FAILED_SESSION_PROBE": "false"}) as node:
        spec = _spec(tmp_path, node)
        r = _run(spec)
        assert r.returncode == 0, r.stderr
        text = (tmp_path / "pairs.prom").read_text()
        assert _success(text) == {("prefill-0", "decode-0"): 1.0}
        assert 'pdnode_pair_probe_skipped{prefill="prefill-0",decode="decode-0"} 0' in text
        assert r.stdout.strip() == "1 of 1 pairs served"
        # Prometheus's parser takes the file as it lands
        lint = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr
        # sglang#13054: one failed write, then the transport is fine but the session stays blacklisted
        node.set_faults("prefill", ["transfer_fail"])
        node.pd_request("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}})
        node.set_faults("prefill", [])
        assert node.get(node.decode_url + "/health", auth=False).status == 200
        r = _run(spec)
        assert r.returncode == 1, r.stdout + r.stderr
        assert _success((tmp_path / "pairs.prom").read_text()) == {("prefill-0", "decode-0"): 0.0}
        (line,) = r.stderr.splitlines()
        assert line.startswith("pair prefill-0 + decode-0 failed in ") and "HTTP 500" in line, line
        # a decode that is down (a restart, a crash) is not the pair's failure: not probed, said so
        node.procs["decode"].kill()
        node.procs["decode"].wait(timeout=30)
        r = _run(spec)
        assert r.returncode == 0, r.stdout + r.stderr
        text = (tmp_path / "pairs.prom").read_text()
        assert _success(text) == {} and 'pdnode_pair_probe_skipped{prefill="prefill-0",decode="decode-0"} 1' in text
        assert r.stdout.strip() == "0 of 1 pairs served, 1 not probed"
        (line,) = r.stderr.splitlines()
        assert line.startswith("pair prefill-0 + decode-0 not probed: decode-0 /health: ConnectionRefusedError"), line


def test_every_prefill_meets_every_decode_with_its_bootstrap_host():
    engines = [{"id": "prefill-0", "role": "prefill", "url": "http://10.0.0.1:30001/", "bootstrap_port": 8998},
               {"id": "prefill-1", "role": "prefill", "url": "http://[fd00::2]:30002", "bootstrap_port": 8999},
               {"id": "decode-0", "role": "decode", "url": "http://10.0.0.3:30003"},
               {"id": "decode-1", "role": "decode", "url": "http://10.0.0.3:30004"}]
    pairs = pair_probe.pairs_of(engines)
    assert [(p.prefill, p.decode, p.bootstrap_host, p.bootstrap_port) for p in pairs] == [
        ("prefill-0", "decode-0", "10.0.0.1", 8998), ("prefill-0", "decode-1", "10.0.0.1", 8998),
        ("prefill-1", "decode-0", "fd00::2", 8999), ("prefill-1", "decode-1", "fd00::2", 8999)]
    assert pairs[0].prefill_url == "http://10.0.0.1:30001"


OK = (200, b'{"text": "yes", "meta_info": {}}', "")


@pytest.mark.parametrize(("prefill", "decode", "why"), [
    (OK, OK, ""),
    (OK, (200, b'[{"text": "yes"}]', ""), ""),
    ((0, b"", "ConnectionRefusedError: refused"), OK, "prefill: no answer (ConnectionRefusedError: refused)"),
    ((500, b'{"error": "boom"}', ""), OK, 'prefill: HTTP 500: {"error": "boom"}'),
    (OK, (0, b"", "TimeoutError: timed out"), "decode: no answer (TimeoutError: timed out)"),
    (OK, (503, b"busy", ""), "decode: HTTP 503: busy"),
    (OK, (200, b"<html>", ""), "decode: HTTP 200 but not JSON: <html>"),
    (OK, (200, b"[]", ""), "decode: HTTP 200 but not a JSON object: []"),
    (OK, (200, b'{"error": {"message": "KV lost"}}', ""), 'decode: HTTP 200 carrying an error: {"message": "KV lost"}'),
    ((200, b'{"error": "bootstrap failed"}', ""), OK, 'prefill: HTTP 200 carrying an error: "bootstrap failed"'),
    (OK, (200, b'{"text": ""}', ""), 'decode: HTTP 200 without generated text: {"text": ""}'),
])
def test_each_answer_is_judged(prefill, decode, why):
    assert pair_probe.judge(prefill, decode) == why


def test_labels_are_escaped_and_the_file_replaced_whole(tmp_path):
    p = pair_probe.Pair('pre"fill', "de\\code", "u", "v", "h", 1, ok=True, seconds=0.25)
    text = pair_probe.metrics_text([p], 1.5)
    # a skipped pair has no success and no duration: only the probed ones are judged
    skipped = pair_probe.Pair("p", "d", "u", "v", "h", 1, skipped="d /health HTTP 503")
    samples = [ln for ln in pair_probe.metrics_text([skipped], 1.5).splitlines() if not ln.startswith("#")]
    assert [ln.split("{")[0].split(" ")[0] for ln in samples] == ["pdnode_pair_probe_skipped",
                                                    "pdnode_pair_probe_last_run_timestamp_seconds"], samples
    assert 'pdnode_pair_probe_success{prefill="pre\\"fill",decode="de\\\\code"} 1' in text
    out = tmp_path / "pairs.prom"
    out.write_text("old")
    pair_probe.write_atomically(str(out), text)
    assert out.read_text() == text and oct(out.stat().st_mode & 0o777) == "0o644"
    assert [f.name for f in tmp_path.iterdir()] == ["pairs.prom"]  # no temporary file left


@pytest.mark.parametrize(("over", "says"), [
    ({"engines": "x"}, "needs a list 'engines'"),
    ({"engines": []}, "the engines make no prefill-decode pair"),
    ({"engines": [{"id": "p", "role": "prefill", "url": "http://a:1"}]}, "an engine lacks 'bootstrap_port'"),
    ({"engines": [{"id": "decode-0", "role": "decode", "url": "file:///etc/passwd"}]},
     "decode-0's url 'file:///etc/passwd' must start with http:// or https://"),
    ({"timeout_s": 0}, "timeout_s 0 must be a number of seconds above 0"),
    ({"out": "rel.prom"}, "out 'rel.prom' must be an absolute path"),
    ({"api_key_file": "/nonexistent/key"}, "cannot read the API key file /nonexistent/key: No such file"),
])
def test_a_bad_spec_is_one_line_and_exit_2(tmp_path, over, says):
    engines = [{"id": "prefill-0", "role": "prefill", "url": "http://127.0.0.1:9", "bootstrap_port": 8998},
               {"id": "decode-0", "role": "decode", "url": "http://127.0.0.1:9"}]
    spec = {"engines": engines, "api_key_file": None, "timeout_s": 5, "out": str(tmp_path / "p.prom"), **over}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    r = _run(str(path))
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("pair probe: ") and says in line, line
