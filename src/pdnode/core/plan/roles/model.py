"""The model role's view of the plan: what to run on the host, with what spec.

``view(plan)`` -> ``plan["roles"]["model"]``: disabled without a pdnode_model_source; for an
hf:// source the locked commit's manifest, where it goes, the endpoint and the token's
controller and host paths (the role copies it 0600 for the download only); for local://
the directory to validate where it is. The host program is pdnode.node.model_fetch, run
by the release venv's Python (which pins huggingface_hub), with the spec on stdin.
"""

from __future__ import annotations

import posixpath
from typing import Any

# Bounded work per file: tries, and the longest wait for the next bytes of a read.
RETRIES = 3
STALL_TIMEOUT_S = 60


def view(plan: dict[str, Any]) -> dict[str, Any]:
    model, install = plan.get("model") or {}, plan["install"]
    if not model:
        return {"enabled": False}
    argv = [install["python"], "-m", "pdnode.node.model_fetch", "-"]
    path = model["path"]
    if model["scheme"] == "local":
        return {"enabled": True, "scheme": "local", "argv": argv, "token": None, "group": install["user"],
                "spec": {"scheme": "local", "path": path}}
    if "lock" not in model:  # the plan refused it already (model-lock-missing / -stale)
        return {"enabled": False}
    token = None
    if model.get("token_file"):
        token = {"src": model["token_file"], "dest": posixpath.join(install["root"], ".model-token")}
    spec = {"scheme": "hf", "lock": model["lock"], "path": path,
            "store": posixpath.join(posixpath.dirname(path), ".pdnode-models"),
            "endpoint": model.get("endpoint"), "token_file": token["dest"] if token else None,
            "group": install["user"], "retries": RETRIES, "stall_timeout_s": STALL_TIMEOUT_S}
    return {"enabled": True, "scheme": "hf", "argv": argv, "token": token, "group": install["user"], "spec": spec}
