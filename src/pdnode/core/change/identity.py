"""What the node runs, and the new layout's instances named after it (issue 45).

An instance is what it is: its role, the GPUs it runs on (host and index) and its own
keys (sizes, memory fraction, extra arguments), not the place it stands in its list. The
deploy records the layout it converged on in a root-only file on every host of the layout
(RECORD_FILE in the plan's records directory: ``record``); the next plan reads it back
(playbooks/tasks/plan.yml reads it, the pdnode_plan filter hands it here) and:

- an unnamed instance whose role, GPUs and keys are those of a running one takes its name
  and its ports: its unit, its files and its place in the router stay, and it keeps running
  through the change, whatever its index now (``kept``);
- one whose role and GPUs are a running one's but whose keys differ takes its name and
  ports too: it restarts in place (``restarts``);
- any other unnamed instance gets its index as its name, unless an instance that stays
  holds it (then the lowest number no instance, running or new, holds). Where it takes
  the name of a running instance that does not stay, that unit stops where it ran and
  starts where the new one runs (a move; layout_change orders the two);
- a named instance (``name:``) keeps its name: the operator said which is which.

Without a record (a new node, a node deployed before records, `pdnode render` offline)
instances are named by their index, as before. The change itself (which instance starts,
restarts, stops, in which order) is pdnode.core.change.layout_change's, from the record
and the new layout as ``layout_change.Instance``s (``change``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..rules.instances import Instance as Entry
from . import layout_change as lc

SCHEMA = "pdnode.layout/1"
RECORD_FILE = "layout.json"
PORT_KEYS = ("port", "bootstrap_port", "nccl_port", "dist_init_port")
# What every engine of a layout runs besides its own keys: a change of either restarts
# every engine (a new release: the interpreter of its venv; a new model commit).
RUNS_KEYS = ("python", "model_commit")
# A process's argv[0] that names an interpreter (a release's venv/bin/python); anything else
# (a title the process set itself) says nothing of its release.
_INTERPRETER = re.compile(r"/\S*/bin/python[0-9.]*")
# What an instance's entry says that is not what it is: where it stands, its name, its ports.
_NOT_SHAPE = frozenset({"role", "index", "name", "named", "adopted", "gpus", "hosts", "reported", *PORT_KEYS})


class RecordError(Exception):
    """A record that cannot be read, or hosts whose records disagree: where, what, the fix."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        super().__init__(f"{where}: {problem}; fix: {fix}")
        self.where, self.problem, self.fix = where, problem, fix


@dataclass(frozen=True)
class Running:
    """One engine instance the node runs, as the deploy recorded it."""

    id: str
    role: str
    name: str
    gpus: tuple[tuple[str, int], ...]  # (host, GPU) pairs
    shape: str
    ports: dict[str, int]  # the entry's ports (PORT_KEYS it has)
    reserved: tuple[int, ...]  # every port it binds (the DP-attention ranges included)
    worker: dict[str, Any]  # its entry in the router's worker list (the plan's cluster engine)
    unit: str
    # What the deploy started it with beyond its keys: RUNS_KEYS (the release's interpreter,
    # the model's commit); None where the record predates them or the value was unknown.
    runs: dict[str, str | None] = field(default_factory=dict)


def shape(entry: Entry) -> str:
    """An entry's own keys, canonical: what it runs, without where, its name or ports."""
    return json.dumps({f.name: getattr(entry, f.name) for f in fields(entry) if f.name not in _NOT_SHAPE},
                      sort_keys=True, default=str)


def where(entry: Entry) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((h, g) for h in entry.hosts for g in entry.gpus))


def record(engines: Iterable[Entry], workers: Mapping[str, dict[str, Any]],
           reserved: Mapping[str, Iterable[int]], runs: Mapping[str, str | None],
           before: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record of a layout (every host's engines): what the next plan reads back.
    RUNS: what they all run beyond their keys (RUNS_KEYS). BEFORE: while a change's steps
    run, the recorded engines it changes from (``from``); the deploy writes the record
    without it once they are done (``converged``)."""
    out = {}
    for e in engines:
        out[e.id] = {"role": e.role, "name": e.name, "gpus": [list(p) for p in where(e)], "shape": shape(e),
                     "ports": {k: getattr(e, k) for k in PORT_KEYS if getattr(e, k) is not None},
                     "reserved": sorted(set(reserved.get(e.id, ()))), "worker": workers[e.id],
                     "unit": workers[e.id]["unit"], "runs": {k: runs.get(k) for k in RUNS_KEYS}}
    doc: dict[str, Any] = {"schema": SCHEMA, "engines": out}
    if before is not None:
        doc["from"] = dict(before)
    return doc


def converged(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The record once its change's steps are done: the same, without ``from``."""
    return {k: v for k, v in doc.items() if k != "from"}


@dataclass(frozen=True)
class Record:
    """What the hosts recorded: the layout the last deploy converged on, or was changing to
    (``engines``); while that deploy's steps had not all run (it was interrupted), the
    layout it was changing from (``before``). ``doc``: the record as written."""

    engines: dict[str, Running]
    before: dict[str, Running] | None
    doc: dict[str, Any]

    @property
    def running(self) -> dict[str, Running]:
        """What the next change starts from: after an unfinished change, the layout it
        started from (its steps are taken again, in their order), else the recorded one."""
        return self.before if self.before is not None else self.engines

    @property
    def running_doc(self) -> dict[str, Any]:
        """``running``'s engines as written: the ``from`` of a change starting from it."""
        return self.doc["from"] if self.before is not None else self.doc["engines"]

    @property
    def units(self) -> set[str]:
        """Every engine unit the record names (both layouts of an unfinished change)."""
        return {r.unit for r in (*self.engines.values(), *(self.before or {}).values())}


def _engines(entries: Mapping[str, Any]) -> dict[str, Running]:
    return {iid: Running(iid, e["role"], e["name"], tuple((str(h), int(g)) for h, g in e["gpus"]), e["shape"],
                         {k: int(p) for k, p in e["ports"].items()}, tuple(int(p) for p in e["reserved"]),
                         dict(e["worker"]), e["unit"],
                         {k: (None if v is None else str(v)) for k, v in (e.get("runs") or {}).items() if k in RUNS_KEYS})
            for iid, e in entries.items()}


def _parse(host: str, text: str) -> Record:
    try:
        doc = json.loads(text)
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"schema {doc.get('schema')!r}, not {SCHEMA}")
        before = doc.get("from")
        return Record(_engines(doc["engines"]), None if before is None else _engines(before), doc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RecordError(f"{host}:{RECORD_FILE}", f"the record of what the node runs is unreadable ({exc})",
                          "remove it (the deploy then names instances by their index)") from None


def read(found: Mapping[str, str | None]) -> Record | None:
    """host -> its record's text (None: it has none) -> what the hosts recorded (None: no
    host has a record). Hosts that recorded different layouts: an earlier deploy stopped
    between them; refused rather than guessed. Hosts of one layout where some finished its
    change and some did not (``from``): the change is unfinished."""
    parsed = {h: _parse(h, text) for h, text in sorted(found.items()) if text}
    if not parsed:
        return None
    hosts = list(parsed)
    first = parsed[hosts[0]]
    befores = {json.dumps(r.doc["from"], sort_keys=True): r for r in parsed.values() if r.before is not None}
    for h in hosts[1:]:
        if parsed[h].doc["engines"] != first.doc["engines"] or len(befores) > 1:
            raise RecordError(
                f"{h}:{RECORD_FILE}", f"differs from {hosts[0]}'s: the hosts recorded different layouts (an earlier "
                "deploy stopped between them)", f"deploy the layout they last ran to every host of it, or remove "
                f"{RECORD_FILE} from the one that is behind")
    return next(iter(befores.values()), first)


def adopt(engines: list[Entry], running: Mapping[str, Running] | None) -> list[str]:
    """Name the new layout's unnamed instances after the running ones they are (the module
    doc); give the adopted ones their ports where the inventory gives none. Returns one
    line per instance that was renamed by it, for the plan's notes."""
    if not running:
        return []
    notes = []
    for role in ("prefill", "decode"):
        news = [e for e in engines if e.role == role]
        olds = [r for r in running.values() if r.role == role]
        claimed = {e.name for e in news if e.named}  # the operator's names stay theirs
        free = [o for o in olds if o.name not in claimed]
        unnamed = [e for e in news if not e.named]
        for same_keys in (True, False):
            for e in unnamed:
                if e.adopted:
                    continue
                o = next((o for o in free if o.gpus == where(e) and (not same_keys or o.shape == shape(e))), None)
                if o is None:
                    continue
                free.remove(o)
                was = e.id
                e.name = o.name
                e.adopted = True
                for k, p in o.ports.items():
                    if getattr(e, k, None) is None:
                        setattr(e, k, p)
                how = "keeps running" if same_keys else "restarts in place (its keys changed)"
                if e.id != was:
                    notes.append(f"{e.field} ({was} by its index) is {e.id}, which runs on the same GPUs: it {how} "
                                 f"(give it name: \"{e.name}\" so that commands run without the node, such as "
                                 "`pdnode render`, name it so too)")
        # The names the new layout holds: the kept ones' and the operator's. A running
        # instance that is neither stops or moves; the new instance at its index may take
        # its name (its unit then stops there and starts here: layout_change's move).
        held = {e.name for e in news if e.named or e.adopted}
        running_names = {r.name for r in olds}
        for e in unnamed:
            if e.adopted:
                continue
            if e.name in held:
                was = e.id
                e.name = str(next(n for n in range(len(held) + len(running_names) + len(news) + 1)
                                  if str(n) not in held and str(n) not in running_names))
                notes.append(f"{e.field} is {e.id}, not {was}: {was} is the name of an instance that stays")
            held.add(e.name)
    return notes


def avoid_ports(running: Mapping[str, Running] | None, engines: Iterable[Entry]) -> set[int]:
    """The ports of running instances that stop for good (no new instance takes their
    name): new instances are allocated others, so that they can start before those stop
    (surge). A new instance that takes a running one's name starts only after that one
    stopped, and may take its ports again (a layout's ports stay where its names stay)."""
    names = {e.id for e in engines}
    return {p for r in (running or {}).values() if r.id not in names for p in r.reserved}


def runs_changed(running: Mapping[str, Running] | None, engines: Iterable[Entry], runs: Mapping[str, str | None],
                 processes: Mapping[str, Mapping[str, str | None]]) -> dict[str, str]:
    """The instances that stay (same id) but restart for what they run beyond their keys
    (RUNS_KEYS: a new release, a new model commit): id -> why, in a few words. What runs
    now is what the unit's process runs (PROCESSES: unit -> the layout_read module's
    python and model_commit), else the record's ``runs``; an unknown value on either side
    is no change (a unit that is not running has nothing to lose)."""
    out = {}
    for e in engines:
        r = (running or {}).get(e.id)
        if r is None:
            continue
        live = processes.get(r.unit)  # None: not read (offline, or another host's unit)
        now = {k: (live if live is not None else r.runs).get(k) for k in RUNS_KEYS}
        if live is not None and live.get("python") and not _INTERPRETER.fullmatch(str(live["python"])):
            now["python"] = r.runs.get("python")  # a process that retitled itself: its argv[0] is no path
        if now["python"] and runs.get("python") and now["python"] != runs["python"]:
            out[e.id] = "a new release"
        elif now["model_commit"] and runs.get("model_commit") and now["model_commit"] != runs["model_commit"]:
            out[e.id] = f"model commit {now['model_commit'][:12]} -> {str(runs['model_commit'])[:12]}"
    return out


def change(running: Mapping[str, Running] | None, engines: Iterable[Entry],
           restarting: Mapping[str, str] | None = None) -> tuple[lc.Matching, lc.Plan] | None:
    """The change from the running layout to ENGINES (after ``adopt``), or None without a
    record. Ids carry identity now: both sides are matched by id (layout_change's named).
    RESTARTING (``runs_changed``): instances that restart although their keys are the same."""
    if running is None:
        return None
    old = [lc.Instance(r.id, r.role, r.gpus, r.shape, named=True) for r in running.values()]
    new = [lc.Instance(e.id, e.role, where(e), shape(e) + ("\n" + restarting[e.id] if e.id in (restarting or {}) else ""),
                       named=True) for e in engines]
    return lc.plan_change(old, new)


def node_answer(plan: Mapping[str, Any], read: Mapping[str, Any] | None,
                router: Mapping[str, Any] | None) -> dict[str, Any]:
    """One host's answer to `pdnode diff INVENTORY` and `pdnode status INVENTORY`
    (playbooks/read.yml): the change its plan computed from the record, its engine units'
    states (the layout_read module's), and on the router's host the router's worker list
    (pdnode.node.drain reconcile --check's last line; None when it did not answer)."""
    change = plan.get("change") or {}
    listed = None
    lines = str((router or {}).get("stdout") or "").strip().splitlines()
    if lines and (router or {}).get("rc") == 0:
        try:
            listed = json.loads(lines[-1]).get("listed")
        except ValueError:
            listed = None
    keys = ("by", "notes", "steps", "windows", "side_by_side", "record", "strangers", "refusal")
    return {"host": plan["host"], "change": {k: change.get(k) for k in keys},
            "units": dict((read or {}).get("units") or {}), "router": listed, "router_host": "router" in plan["services"]}
