"""The model role's view of the plan: what to run on the host, with what spec.

``view(plan)`` -> ``plan["roles"]["model"]``: disabled without a pdnode_model_source (and
on a host of a layout that runs the router alone); for an hf:// source the locked commit's
manifest, where it goes, the endpoint and the token's controller and host paths (the role
copies it 0600 for the download only); for local:// the directory to validate where it
is. The host program is pdnode.node.model_fetch, run by the release venv's Python (which
pins huggingface_hub), with the spec on stdin.

A layout spanning hosts downloads once: its first engine host (the seed) fetches from the
endpoint, then serves the verified commit (``share``: a transient unit as the service
user, on its layout address, for the peers only: the firewall admits them alone); the
other engine hosts fetch from it (``peer``) and verify the same way.
"""

from __future__ import annotations

import posixpath
from typing import Any

# Bounded work per file: tries, and the longest wait for the next bytes of a read.
RETRIES = 3
STALL_TIMEOUT_S = 60
# The seed's share stops with the run; this bounds it should the run die first.
SHARE_MAX_S = 6 * 3600


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def view(plan: dict[str, Any]) -> dict[str, Any]:
    model, install = plan.get("model") or {}, plan["install"]
    off = {"enabled": False}
    if not model:
        return off
    argv = [install["python"], "-m", "pdnode.node.model_fetch", "-"]
    path = model["path"]
    base = {"enabled": True, "scheme": model["scheme"], "argv": argv, "token": None, "peer": False, "share": None,
            "state_file": None}
    if model["scheme"] == "local":
        return {**base, "spec": {"scheme": "local", "path": path}}
    share = model.get("share")
    if "lock" not in model or (share and not share["engine_host"]):
        return off  # refused by the plan already (no lock), or a host with the router alone
    store = posixpath.join(posixpath.dirname(path), ".pdnode-models")
    home = posixpath.join(store, model["lock"]["repo"].replace("/", "--"))
    spec = {"scheme": "hf", "lock": model["lock"], "path": path, "store": store, "endpoint": model.get("endpoint"),
            "token_file": None, "group": install["user"], "retries": RETRIES, "stall_timeout_s": STALL_TIMEOUT_S,
            "reserve_bytes": int(float(plan["settings"]["pdnode_model_reserve_gb"]) * 1e9)}
    # which commit serves ({current, previous}), and each commit's stamp beside it
    # (COMMIT.stamp.json: its lock): what an upgrade's way back reads
    out = {**base, "spec": spec, "state_file": posixpath.join(home, "state.json")}
    if model.get("token_file"):
        out["token"] = {"src": model["token_file"], "dest": posixpath.join(install["root"], ".model-token")}
        spec["token_file"] = out["token"]["dest"]
    if share and plan["host"] != share["seed"]:
        # (the endpoint stays for a run that fetches alone: an upgrade, one host at a time)
        spec["peer"] = f"http://{_url_host(share['address'])}:{share['port']}"
        return {**out, "peer": True}
    if share:
        unit = f"{install['prefix']}-model-share.service"
        commit_dir = posixpath.join(home, model["lock"]["commit"])
        out["share"] = {
            "unit": unit,
            # a user of its own for the run, in the service user's group (which reads the files):
            # on a new host that user does not exist yet, only its group (the role makes it)
            "start": ["systemd-run", f"--unit={unit}", "--collect", "--property=DynamicUser=yes",
                      f"--property=SupplementaryGroups={install['user']}",
                      f"--property=RuntimeMaxSec={SHARE_MAX_S}", install["python"], "-m", "pdnode.node.model_fetch",
                      "--serve", share["address"], str(share["port"]), commit_dir],
            "stop": ["systemctl", "stop", unit]}
    return out
