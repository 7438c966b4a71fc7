"""Load Mooncake's transfer engine in the release venv as SGLang does, beside the venv's
torch when it has one, before any engine starts (run by the mooncake role; standard
library only):

    python - < mooncake_import_check.py

A Mooncake build for another CUDA or torch fails at import, or only after the model
loaded (Mooncake#1298, vllm#42511, dynamo#14461). Prints one JSON line
{"ok": true, "mooncake": ..., "torch": ..., "torch_cuda": ...}, or one line that says what
does not load, beside what, and the fix; exit 1.
"""

import importlib.metadata as metadata
import json
import re
import sys

# The Mooncake distributions pdnode installs: pdnode.core.rules.mooncake_select.PACKAGES (this runs
# before the release venv holds pdnode; tests/test_mooncake_import_check.py keeps them equal)
BUILDS = ("mooncake-transfer-engine", "mooncake-transfer-engine-cuda13", "mooncake-transfer-engine-non-cuda")
FIX = ("install the Mooncake build for the stack's CUDA (mooncake-transfer-engine for CUDA 12, "
       "mooncake-transfer-engine-cuda13 for CUDA 13: pdnode.core.rules.mooncake_select, the plan's pdnode_mooncake_version), "
       "then re-run")


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def fail(what: str) -> None:
    print(f"{what}. Fix: {FIX}.")
    sys.exit(1)


installed = []
for name in BUILDS:
    try:
        installed.append((name, metadata.version(name)))
    except metadata.PackageNotFoundError:
        pass
build = " ".join(f"{name} {version}" for name, version in installed) or "no Mooncake distribution"

torch_version = torch_cuda = None
try:
    import torch
except ModuleNotFoundError:
    torch = None  # the stand-in's release has no torch: Mooncake alone
except Exception as exc:  # noqa: BLE001 - any failure to load is the answer
    fail(f"torch does not load in {sys.prefix}: {first_line(exc)}")
if torch is not None:
    torch_version, torch_cuda = torch.__version__, getattr(torch.version, "cuda", None)

try:
    from mooncake.engine import TransferEngine

    TransferEngine()
except Exception as exc:  # noqa: BLE001 - any failure to load is the answer
    reason = first_line(exc)
    linked = re.search(r"lib(?:cudart|cublas|cuda|nvrtc)[\w-]*\.so\.(\d+)", reason)
    beside = f"beside torch {torch_version} (CUDA {torch_cuda or 'none'})" if torch_version else "(no torch in the venv)"
    needs = f", it needs CUDA {linked.group(1)}'s {linked.group(0)}" if linked else ""
    fail(f"{build} does not load {beside} in {sys.prefix}{needs}: {reason}")

print(json.dumps({"ok": True, "mooncake": build, "torch": torch_version, "torch_cuda": torch_cuda}))
