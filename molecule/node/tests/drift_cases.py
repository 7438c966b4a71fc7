"""The drift matrix's cases (molecule/node/tests/test_drift_matrix.py), generated from the
plan's managed paths: which paths each aspect's batch drifts, the command that drifts one,
and whether the drift shows on the host. Apart from the scenario so that tests/ proves them
without a container (tests/test_drift_cases.py): a generator that plants nothing, or a judge
that sees a drift where there is none, would make the matrix pass with nothing restored."""

from __future__ import annotations

import shlex

# The aspects in the order the batches run: presence last, since removing the admin key
# makes a new one (and restarts the router, whose record then changes).
ASPECTS = ("content", "mode", "owner", "group", "presence")
# Another owner and group for each (both exist on every Debian host: base-passwd).
OTHER_OWNER = {"root": "nobody"}
OTHER_GROUP = {"root": "nogroup"}


def cases(plan: dict) -> dict[str, list[dict]]:
    """aspect -> the managed paths whose drift of that aspect a re-run restores."""
    return {aspect: [e for e in plan["managed"] if aspect in e["restores"]] for aspect in ASPECTS}


def expected_restores(plan: dict, entry: dict) -> set[str]:
    """What a re-run must restore of ENTRY, from its kind (written here, not read from the
    plan's `restores`, so that a path dropped from a kind's cases fails instead of shrinking
    the matrix): every aspect, but a directory has no content, the admin key's content is
    made on the host, the layout record's content is what the next plan reads (a changed
    one is refused, not written over), and the install root is not removed (that is a
    reinstall)."""
    aspects = set(ASPECTS)
    if entry["kind"] in ("directory", "state") or entry["path"] == plan["install"]["admin_key_path"]:
        aspects.discard("content")
    if entry["path"] == plan["install"]["root"]:
        aspects.discard("presence")
    return aspects


def drift_command(aspect: str, entry: dict) -> str:
    path = shlex.quote(entry["path"])
    if aspect == "content":
        return f"printf '# changed by hand\\n' >> {path}"
    if aspect == "mode":  # others may read it (or no longer may): the drift a secret fears most
        return f"chmod {int(entry['mode'], 8) ^ 0o004:04o} {path}"
    if aspect == "owner":
        return f"chown {OTHER_OWNER.get(entry['owner'], 'root')} {path}"
    if aspect == "group":
        return f"chgrp {OTHER_GROUP.get(entry['group'], 'root')} {path}"
    return f"rm -rf {path}"


def drifted(aspect: str, entry: dict, before: dict, now: dict | None) -> bool:
    """Whether the planted drift shows on the host (a case that changed nothing proves nothing)."""
    if aspect == "presence":
        return now is None
    if aspect == "content":
        return now is not None and now.get("sha256") != before["sha256"]
    return now is not None and now[aspect] != entry[aspect]
