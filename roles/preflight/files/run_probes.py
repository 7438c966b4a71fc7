#!/usr/bin/env python3
"""Run the preflight's read-only probe commands and return their raw output.

Argument: a JSON object {name: shell command}. Prints one JSON object
{name: {"rc": int, "stdout": str, "stderr": str}}. Nothing is parsed or judged here
(that is pdnode.core.host.facts / pdnode.core.host.preflight on the controller); this only saves one
module round trip per probe and bounds each command's time (nvidia-smi can hang on a
GPU that fell off the bus): a probe that times out gets rc 124 and says so in stderr.
"""
import json
import subprocess
import sys

TIMEOUT_S = 60


def main() -> None:
    probes = json.loads(sys.argv[1])
    out = {}
    for name, cmd in probes.items():
        try:
            p = subprocess.run(["/bin/bash", "-c", cmd], capture_output=True, text=True,
                               errors="replace", timeout=TIMEOUT_S, check=False)
            out[name] = {"rc": p.returncode, "stdout": p.stdout.rstrip("\n"), "stderr": p.stderr.rstrip("\n")}
        except subprocess.TimeoutExpired as exc:
            out[name] = {"rc": 124, "stdout": (exc.stdout or b"").decode(errors="replace") if isinstance(
                exc.stdout, bytes) else (exc.stdout or ""), "stderr": f"timed out after {TIMEOUT_S} s: {cmd}"}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
