"""`pdnode check` asks SGLang itself about every engine's ServerArgs (controller only).

The judge is the installed SGLang's own validation, run by `pdnode.node.launcher --check`
(argparse, resolve_once, check_server_args: what `sglang.launch_server` runs) in the
environment scripts/sglang-validator builds, or the Python $PDNODE_SGLANG_VALIDATOR
names. pdnode's own rules stay for what one SGLang process cannot see (rules across
instances and hosts, the host's GPUs and ports).

What differs from the host, and why:
- model_path: the model lives on the GPU host. pdnode_model_controller_path (a copy of
  its config.json) is used where set; otherwise a tiny model of the same kind
  (data/models/), so rules that read the model's shape see one of that family.
- disaggregation_ib_device: SGLang looks the devices up in /sys/class/infiniband of the
  machine it runs on; the deploy's on-host check judges that part.
Verdicts are cached by the hash of what was judged and of the judge (validator, its
stamp, the launcher, the tiny models): a re-check of an unchanged description starts no
SGLang at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..resources import user_cache_dir

PACKAGE = Path(__file__).resolve().parents[2]
MODELS = PACKAGE / "data" / "models"
TINY_MODEL = {"moe_mla": "deepseek-v3-tiny", "moe": "deepseek-v3-tiny", "dense": "qwen2-tiny"}
HOST_DEPENDENT = ("disaggregation_ib_device",)
TIMEOUT_S = 900  # one SGLang import: ~10 s idle, minutes on a loaded machine
# A refusal that comes from the machine the validator runs on (no CUDA, no GPU generation)
# says nothing about the GPU host: such a verdict is reported as "could not judge here".
_PLATFORM_REASON = re.compile(r"non-CUDA platform|\bSM ?\d{2,3}\b|\b(Hopper|Blackwell|Ampere|Ada)\b|compute "
                              r"capability|CUDA is not available|no (CUDA )?GPU|on CPU\b", re.IGNORECASE)
_VERDICT = re.compile(r"^(OK|REJECTED|CANNOT CHECK): (?P<file>[^:]+\.json)(?:: | )(?P<why>.*)$")


@dataclass(frozen=True)
class Verdict:
    service: str  # service id, e.g. decode-0
    accepted: bool
    reason: str  # SGLang's own words (REJECTED), or why it could not judge


def cache_dir() -> Path:
    return user_cache_dir()


def find_validator() -> Path | None:
    """The Python whose SGLang judges: $PDNODE_SGLANG_VALIDATOR, else the environment
    scripts/sglang-validator built; None when neither exists or the variable is "off"."""
    named = os.environ.get("PDNODE_SGLANG_VALIDATOR")
    if named == "off":
        return None
    if named:
        return Path(named)
    python = cache_dir() / "sglang-validator" / "bin" / "python"
    return python if python.exists() else None


def _judge_identity(python: Path) -> str:
    """Everything a verdict depends on besides the ServerArgs themselves."""
    h = hashlib.sha256(str(python).encode())
    stamp = python.parent.parent / ".pdnode-stamp"
    for part in (stamp, PACKAGE / "node" / "launcher.py", *sorted(MODELS.rglob("config.json"))):
        try:
            h.update(part.read_bytes())
        except OSError:
            h.update(b"-")
    return h.hexdigest()


def judged_args(service: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The ServerArgs as SGLang on this machine can judge them (see the module doc)."""
    args = {k: v for k, v in service["args"].items() if k not in HOST_DEPENDENT}
    controller = settings.get("pdnode_model_controller_path")
    if controller and (Path(controller) / "config.json").is_file():
        args["model_path"] = str(Path(controller).resolve())
    else:
        args["model_path"] = str(MODELS / TINY_MODEL.get(settings.get("pdnode_model_kind") or "moe", "deepseek-v3-tiny"))
    return args


def _run_launcher(python: Path, cases: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """{name: args} -> {name: (OK|REJECTED|CANNOT CHECK, reason)}, one SGLang import."""
    with tempfile.TemporaryDirectory(prefix="pdnode-check-") as tmp:
        paths = []
        for name, args in cases.items():
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(args, indent=2))
            paths.append(str(path))
        env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
        try:
            r = subprocess.run([str(python), "-m", "pdnode.node.launcher", "--check", *paths], capture_output=True,
                               text=True, env=env, timeout=TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {name: ("CANNOT CHECK", f"the validator did not run: {exc}") for name in cases}
    found: dict[str, tuple[str, str]] = {}
    for line in r.stdout.splitlines():
        m = _VERDICT.match(line)
        if m and m.group("file")[:-5] in cases:
            found[m.group("file")[:-5]] = (m.group(1), m.group("why").strip())
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    for name in cases:
        found.setdefault(name, ("CANNOT CHECK", f"no verdict from the validator (exit {r.returncode}: {tail})"))
    return found


def judge(services: list[dict[str, Any]], settings: dict[str, Any],
          python: Path) -> list[Verdict]:
    """SGLang's verdict on every engine service; cached verdicts are not asked again."""
    identity = _judge_identity(python)
    store = cache_dir() / "check-verdicts"
    cases, keys, verdicts = {}, {}, {}
    for svc in services:
        args = judged_args(svc, settings)
        key = hashlib.sha256((identity + json.dumps(args, sort_keys=True)).encode()).hexdigest()
        try:
            cached = json.loads((store / f"{key}.json").read_text())
            verdicts[svc["id"]] = Verdict(svc["id"], cached["accepted"], cached["reason"])
            continue
        except (OSError, ValueError, KeyError, TypeError):
            pass
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", svc["id"])
        cases[name], keys[name] = args, (svc["id"], key)
    if cases:
        if sys.stderr.isatty():
            print(f"pdnode: asking SGLang about {len(cases)} ServerArgs (one import, ~10 s)...", file=sys.stderr)
        for name, (status, reason) in _run_launcher(python, cases).items():
            sid, key = keys[name]
            verdict = Verdict(sid, status == "OK", reason if status != "OK" else "")
            verdicts[sid] = verdict
            if status == "CANNOT CHECK":
                verdicts[sid] = Verdict(sid, False, f"CANNOT CHECK: {reason}")
                continue
            store.mkdir(parents=True, exist_ok=True)
            tmp = store / f".{key}.{os.getpid()}"
            tmp.write_text(json.dumps({"accepted": verdict.accepted, "reason": verdict.reason}))
            tmp.replace(store / f"{key}.json")
    return [verdicts[svc["id"]] for svc in services]


def validator_version(python: Path) -> str | None:
    """The sglang release installed beside ``python`` (its dist-info), without running it."""
    for site in sorted((python.parent.parent / "lib").glob("python3*/site-packages")):
        for meta in site.glob("sglang-*.dist-info"):
            return meta.name[len("sglang-"):-len(".dist-info")]
    return None


def instance_field(service: dict[str, Any], settings: dict[str, Any], reason: str) -> tuple[str, str | None]:
    """Where the operator changes it: the instance entry of ``service`` and, when SGLang's
    reason names a ServerArgs field the instance sets in its extra_args, that key."""
    role = service["role"]
    instances = settings.get(f"pdnode_{role}_instances") or []
    index = next((i for i, inst in enumerate(instances)
                  if str(inst.get("name") if isinstance(inst, dict) and inst.get("name") is not None else i)
                  == str(service["name"])), None)
    where = f"pdnode_{role}_instances" + (f"[{index}]" if index is not None else "")
    extra = instances[index].get("extra_args") if index is not None and isinstance(instances[index], dict) else None
    for key in sorted(extra or {}, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9_]){re.escape(key)}(?![A-Za-z0-9_])|--{re.escape(key.replace('_', '-'))}",
                     reason):
            return f"{where}.extra_args.{key}", key
    return where, None


def depends_on_the_machine(reason: str) -> bool:
    """True when SGLang's refusal names the platform it ran on rather than the arguments."""
    return bool(_PLATFORM_REASON.search(reason))
