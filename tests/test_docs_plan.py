"""Every unit, port, path and command written in the docs is true to a plan.

An operator page that names `sglang-pd-prefill` after the units became
`sglang-pd-prefill-0.service` sends the operator to a unit that does not exist. Each
page of README.md, docs/**/*.md and roles/*/README.md is read against the plans of the inventories it
names (`inventories/<name>`; a page that names none: the reference inventory,
inventories/gpu01), every host of each:

- units: every `*.service`/`*.target`, every argument of `systemctl VERB` and of
  `journalctl -u`, and every word that starts with a plan's unit prefix (`sglang-pd-...`,
  prose included) must be a unit of one of those plans, or one the roles install
  (named literally in roles/, playbooks/, templates/ or src/pdnode/);
- ports: every `host:PORT` in code and every `port N` must be a port of those plans, of
  their Prometheus targets, or one the monitoring role binds;
- paths: every `/etc/...`, `/var/lib/...`, `/opt/...` must be a plan's path (or lie
  under one, or contain one), or appear literally in the repository's code;
- commands: every `pdnode ...` command line is parsed by the CLI's own parser, and its
  `--host`/`--role` must exist in the inventory it names; every `ansible-playbook ...`
  names only tags the playbooks have, hosts the inventory has, and (restart.yml) an
  instance of its plan.

docs/runbooks/gpu01/ holds the reference inventory's per-host runbooks, rendered by
`pdnode runbooks inventories/gpu01 --out docs/runbooks`; the first test keeps it current.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml
from pdnode.core.plan import monitoring
from pdnode.commands import runbooks
from pdnode.commands.cli import build_parser
from pdnode.core.inventory.read import inventory_hosts, inventory_variables, load_inventory
from pdnode.core.plan.build import PlanError, build_plan

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "roles").glob("*/README.md"))]
REFERENCE = "gpu01"
RENDERED = ROOT / "docs" / "runbooks" / REFERENCE
REGENERATE = f".venv/bin/pdnode runbooks inventories/{REFERENCE} --out docs/runbooks"
CODE_DIRS = ("roles", "playbooks", "templates", "src/pdnode", "plugins")

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
UNIT = re.compile(r"(?<![\w/.@-])([A-Za-z0-9][\w.@-]*\.(?:service|target|timer))\b")
SYSTEMCTL_VERBS = {"start", "stop", "restart", "status", "show", "is-active", "is-failed", "reload", "kill",
                   "enable", "disable", "cat", "reset-failed"}
# an address and its port: an IP, localhost, [IPv6], a URL's host, `ss`'s `sport = :N`
HOST_PORT = re.compile(r"(?:\b\d{1,3}(?:\.\d{1,3}){3}|\blocalhost|\]|://[\w.-]+|\bsport = ):(\d{2,5})\b")
PORT_WORD = re.compile(r"\bports? (\d{3,5})\b")
SYS_PATH = re.compile(r"(?<![\w./-])(/(?:etc|var/lib|opt)/[\w./@+-]*)")
INVENTORY = re.compile(r"(?<![\w./-])inventories/([\w.-]+)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- the reference runbooks ------------------------------------------------------------------
def test_reference_runbooks_are_current(monkeypatch):
    monkeypatch.chdir(ROOT)  # the pages name the inventory as the command was given
    want = runbooks._render_host(f"inventories/{REFERENCE}", REFERENCE)
    have = {str(p.relative_to(RENDERED)): p.read_text() for p in RENDERED.rglob("*") if p.is_file()}
    stale = sorted(set(want) ^ set(have) | {k for k in want.keys() & have.keys() if want[k] != have[k]})
    assert not stale, f"docs/runbooks/{REFERENCE}/ is stale ({', '.join(stale)}); regenerate: {REGENERATE}"


# --- what the plans and the repository know ------------------------------------------------
class Facts:
    def __init__(self) -> None:
        self.units: set[str] = set()
        self.prefixes: set[str] = set()
        self.ports: set[int] = set()
        self.paths: set[str] = set()  # exactly these files and directories (and their parents)
        self.open_dirs: set[str] = set()  # directories whose content varies (releases, bundles)
        self.hosts: set[str] = set()
        self.service_ids: set[str] = set()


@cache
def inventory_facts(name: str) -> Facts:
    path = ROOT / "inventories" / name
    facts = Facts()
    peers = inventory_variables(path)
    for host in inventory_hosts(path):
        hv = load_inventory(path, host)
        facts.hosts.add(host)
        try:
            plan = build_plan(hv.variables, hv.host, peers).as_dict()
        except PlanError:
            continue  # a host that holds no layout (inventories/h200-single: the preflight only)
        install = plan["install"]
        prefix = install["prefix"]
        facts.prefixes.add(prefix)
        # the units the roles name after the plan's prefix (each literal in its role or playbook)
        facts.units |= {install["target"], f"{prefix}-firewall.service", f"{prefix}-upgrade-probe.service"}
        for sid, svc in plan["services"].items():
            facts.units.add(svc["unit"])
            facts.service_ids.add(sid)
            facts.paths |= {svc["config"], svc["env_file"], f"/etc/systemd/system/{svc['unit']}"}
        probe = monitoring.pair_probe(plan)
        if probe:  # the per-pair probe beside the router: its units, spec and metrics file
            facts.units |= {probe["service"], probe["timer"]}
            facts.paths |= {probe["spec_file"], probe["spec"]["out"], probe["textfile_dir"],
                            *(f"/etc/systemd/system/{probe[k]}" for k in ("service", "timer"))}
        facts.ports |= {int(p) for p in plan["ports"].values()}
        for job in monitoring.scrape_config(plan)["scrape_configs"]:
            for static in job["static_configs"]:
                facts.ports |= {int(t.rsplit(":", 1)[1]) for t in static["targets"]}
        facts.paths |= {v for k, v in install.items() if isinstance(v, str) and v.startswith("/")}
        facts.open_dirs |= {install["root"], install["venv"]}
        facts.paths |= {f"/etc/{prefix}-firewall.nft", f"/var/lib/pdnode/releases/{prefix}.json",
                        f"/var/lib/pdnode/applied/{prefix}", f"/etc/systemd/system/{install['target']}"}
    return facts


@cache
def repo_code() -> str:
    texts = []
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".yml", ".yaml", ".j2", ".json", ".sh", "") and "__pycache__" not in p.parts:
                with contextlib.suppress(UnicodeDecodeError):
                    texts.append(p.read_text())
    return "\n".join(texts)


@cache
def repo_units() -> frozenset[str]:
    """Units named literally (no template expression in the name) in the repository's code."""
    return frozenset(m.group(1) for m in UNIT.finditer(repo_code()) if not m.group(1).startswith("-"))


@cache
def monitoring_ports() -> frozenset[int]:
    """Ports roles/monitoring binds or talks to (Prometheus, the exporters, DCGM's host engine)."""
    text = "".join((ROOT / "roles" / "monitoring" / d / "main.yml").read_text() for d in ("defaults", "vars"))
    return frozenset(int(p) for p in re.findall(r":(\d{4,5})\b", text))


def _tags(node: object) -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "tags":
                out |= set(v if isinstance(v, list) else [v])
            else:
                out |= _tags(v)
    elif isinstance(node, list):
        for v in node:
            out |= _tags(v)
    return out


@cache
def playbook_tags() -> frozenset[str]:
    files = [ROOT / "site.yml", *(ROOT / "playbooks").rglob("*.yml"), *(ROOT / "roles").glob("*/tasks/*.yml")]
    tags = {"always", "never", "all", "tagged", "untagged"}
    for f in files:
        tags |= {str(t) for t in _tags(yaml.safe_load(f.read_text()))}
    return frozenset(tags)


# --- reading a page ------------------------------------------------------------------------
def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line, code) for every fenced block line and every inline code span."""
    out = []
    for m in FENCE.finditer(text):
        start = line_of(text, m.start(1))
        out += [(start + i, line) for i, line in enumerate(m.group(1).splitlines())]
    outside = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out += [(line_of(outside, m.start()), m.group(1)) for m in SPAN.finditer(outside)]
    return out


def all_lines(text: str) -> list[tuple[int, str]]:
    return list(enumerate(text.splitlines(), 1))


def page_inventories(doc: Path, text: str) -> list[str]:
    named = sorted({n.rstrip(".") for n in INVENTORY.findall(text)
                    if (ROOT / "inventories" / n.rstrip(".") / "hosts.yml").exists()})
    return named or [REFERENCE]


def page_facts(names: list[str]) -> Facts:
    out = Facts()
    for n in names:
        f = inventory_facts(n)
        out.units |= f.units
        out.prefixes |= f.prefixes
        out.ports |= f.ports
        out.paths |= f.paths
        out.open_dirs |= f.open_dirs
        out.hosts |= f.hosts
        out.service_ids |= f.service_ids
    return out


def commands_of(line: str) -> list[list[str]]:
    """The words of each command of a shell line (`|`, `;`, `&&` split; comments dropped)."""
    line = line.split(" #", 1)[0]
    out = []
    for part in re.split(r"\|\||[|;]|&&|\$\(", line):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        while words[:1] == ["sudo"]:
            words = words[1:]
        if words:
            out.append(words)
    return out


def unit_arguments(words: list[str]) -> list[str]:
    """The units `systemctl VERB ...` and `journalctl -u ...` name (a bare name is a .service)."""
    out = []
    if words[0] == "systemctl" and len(words) > 1 and words[1] in SYSTEMCTL_VERBS:
        skip = False
        for w in words[2:]:
            if skip:
                skip = False
            elif w in ("-p", "--property", "-n", "--lines"):
                skip = True
            elif not w.startswith("-"):
                out.append(w)
    if words[0] == "journalctl":
        for flag, value in zip(words, words[1:]):
            if flag in ("-u", "--unit", "-fu"):
                out.append(value)
    return [w if w.endswith((".service", ".target", ".timer")) or "*" in w else w + ".service" for w in out]


PLACEHOLDER = re.compile(r"[<>{}$*]|\bUNIT\b|\bINVENTORY\b|\.\.\.")


def unit_known(unit: str, facts: Facts) -> bool:
    if PLACEHOLDER.search(unit.replace("*", "")) or unit.upper() == unit:
        return True  # a placeholder (UNIT, <prefix>-..., $unit), not a name
    if "*" in unit:
        return any(fnmatch.fnmatch(u, unit) for u in facts.units | repo_units())
    return unit in facts.units or unit in repo_units()


def prose_units(text: str, facts: Facts) -> list[tuple[int, str]]:
    """(line, word) for every word, prose included, that starts with a plan's unit prefix
    and is no unit of the plans (the stale `sglang-pd-prefill`); a path or a file named
    after the prefix (`/etc/sglang-pd/`, `sglang-pd.json`) is not a unit."""
    out = []
    for prefix in facts.prefixes:
        word = re.compile(rf"(?<![\w/.@-]){re.escape(prefix)}(?:-[a-z0-9]+)*(?:\.service|\.target)?(?![\w/@-])")
        for line, content in all_lines(text):
            for m in word.finditer(content):
                name, tail = m.group(0), content[m.end():]
                if not name.endswith((".service", ".target", ".timer")) and re.match(r"\.(?:json|nft|env|conf)\b", tail):
                    continue  # a file named after the prefix, checked as a path
                unit = name if name.endswith((".service", ".target", ".timer")) else name + ".service"
                if name == prefix:
                    if tail[:1] in ("/", "_"):
                        continue  # a directory or table named after the prefix
                    unit = prefix + ".target"  # the prefix alone names the target
                if not unit_known(unit, facts):
                    out.append((line, name))
    return out


# --- the checks ----------------------------------------------------------------------------
@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_units_exist_in_the_plan(doc):
    text = doc.read_text()
    facts = page_facts(page_inventories(doc, text))
    bad = []
    for line, code in code_lines(text):
        named = {m.group(1) for m in UNIT.finditer(code)}
        for words in commands_of(code):
            named |= set(unit_arguments(words))
        bad += [f"{rel(doc)}:{line}: unit {u}" for u in sorted(named) if not unit_known(u, facts)]
    bad += [f"{rel(doc)}:{line}: unit {name}" for line, name in prose_units(text, facts)]
    assert not bad, "units no plan of " + ", ".join(page_inventories(doc, text)) + " has:\n" + "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_ports_exist_in_the_plan(doc):
    text = doc.read_text()
    facts = page_facts(page_inventories(doc, text))
    known = facts.ports | monitoring_ports()
    bad = []
    for line, code in code_lines(text):
        for m in HOST_PORT.finditer(code):
            if int(m.group(1)) not in known:
                bad.append(f"{rel(doc)}:{line}: port {m.group(1)} in `{code.strip()[:80]}`")
    for line, content in all_lines(text):
        for m in PORT_WORD.finditer(content):
            if int(m.group(1)) not in known:
                bad.append(f"{rel(doc)}:{line}: port {m.group(1)}")
    assert not bad, "ports no plan of " + ", ".join(page_inventories(doc, text)) + " has:\n" + "\n".join(bad)


def node_path(path: str, facts: Facts) -> bool:
    """A path of the node's own (named after a plan's prefix or pdnode, or under a plan's
    directory), which a plan or a role must know; the OS's own paths are not checked."""
    return ("pdnode" in path or any(p in path for p in facts.prefixes)
            or any(path.startswith(d.rstrip("/") + "/") for d in facts.open_dirs))


def path_known(path: str, facts: Facts) -> bool:
    path = PLACEHOLDER.split(path, maxsplit=1)[0].rstrip(".,:;)")
    if path.count("/") < 2:
        return True  # `/etc/` alone
    drop_in = re.fullmatch(r"/etc/systemd/system/([\w.@-]+\.(?:service|target))\.d/[\w.-]*", path)
    if drop_in:
        return unit_known(drop_in.group(1), facts)
    if path.rstrip("/") in {p.rstrip("/") for p in facts.paths}:
        return True
    if any(p.startswith(path.rstrip("/") + "/") for p in facts.paths):
        return True  # a directory of the plan's files
    if any(path.startswith(d.rstrip("/") + "/") for d in facts.open_dirs):
        return True  # in a release virtualenv or the install root
    return path.rstrip("/") in repo_code()


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_host_paths_exist_in_the_plan_or_the_roles(doc):
    text = doc.read_text()
    facts = page_facts(page_inventories(doc, text))
    bad = [f"{rel(doc)}:{line}: {m.group(1)}" for line, code in code_lines(text)
           for m in SYS_PATH.finditer(code) if node_path(m.group(1), facts) and not path_known(m.group(1), facts)]
    assert not bad, "paths neither a plan of " + ", ".join(page_inventories(doc, text)) + \
        " nor the repository's code has:\n" + "\n".join(bad)


def pdnode_words(words: list[str]) -> list[str] | None:
    for i, w in enumerate(words):
        if w in ("pdnode", ".venv/bin/pdnode") or w.endswith("/bin/pdnode"):
            return words[i + 1:]
    return None


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_pdnode_command_lines_parse_and_name_what_exists(doc):
    """Each `pdnode ...` line goes through the CLI's own argparse parser (a wrong option
    fails there), and its --host / --role name a host / service of the inventory it names."""
    text = doc.read_text()
    bad = []
    for line, code in code_lines(text):
        for words in commands_of(re.sub(r"<[^<>]+>", "PLACEHOLDER", code)):
            args = pdnode_words(words)
            if not args or len(args) == 1 or not re.fullmatch(r"[a-z][\w-]*", args[0]):
                continue  # `pdnode check` alone names the command (tests/test_docs.py checks it exists)
            if any(a.startswith("[") or a.endswith(":") for a in args):
                continue  # a usage synopsis (`[--host H]`), or a program's output (`pdnode bench NAME: ...`)
            args = [a for a in args if a != "\\"]
            if ">" in args:
                args = args[:args.index(">")]
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    ns = build_parser(args[0]).parse_args(args)
            except SystemExit:
                if not any(a == "INVENTORY" or INVENTORY.fullmatch(a.rstrip("/")) for a in args[1:]):
                    continue  # names an option of the command (`pdnode check --json`), not a command line
                bad.append(f"{rel(doc)}:{line}: `pdnode {' '.join(args)}`: {err.getvalue().strip().splitlines()[-1]}")
                continue
            inv = getattr(ns, "inventory", None)
            m = INVENTORY.fullmatch(str(inv).rstrip("/")) if inv else None
            if not m:
                continue
            facts = inventory_facts(m.group(1))
            host = getattr(ns, "host", None)
            if host and host not in facts.hosts:
                bad.append(f"{rel(doc)}:{line}: --host {host}: {inv} has {sorted(facts.hosts)}")
            role = getattr(ns, "role", None)
            if role and role not in facts.service_ids | {"router-argv", "plan", "alerts"}:
                bad.append(f"{rel(doc)}:{line}: --role {role}: {inv} has {sorted(facts.service_ids)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_ansible_playbook_lines_name_real_tags_and_hosts(doc):
    text = doc.read_text()
    bad = []
    for line, code in code_lines(text):
        for words in commands_of(code):
            if not any(w.endswith("ansible-playbook") for w in words[:1]):
                continue
            opts = dict(zip(words, words[1:]))
            for tag in (opts.get("--tags") or opts.get("-t") or "").split(","):
                if tag and not PLACEHOLDER.search(tag) and tag not in playbook_tags():
                    bad.append(f"{rel(doc)}:{line}: tag {tag!r} is in no playbook or role")
            inv = INVENTORY.fullmatch((opts.get("-i") or "").rstrip("/"))
            extra = dict(v.split("=", 1) for k, v in zip(words, words[1:]) if k in ("-e", "--extra-vars") and "=" in v)
            target = extra.get("restart_instance")  # playbooks/restart.yml: all, or an instance id
            if inv and target and not PLACEHOLDER.search(target) \
                    and target not in inventory_facts(inv.group(1)).service_ids - {"router"} | {"all"}:
                bad.append(f"{rel(doc)}:{line}: restart_instance={target}: no instance of {inv.group(0)}")
            limit = opts.get("--limit") or opts.get("-l")
            if inv and limit and not PLACEHOLDER.search(limit):
                hosts = inventory_facts(inv.group(1)).hosts
                groups = set(yaml.safe_load((ROOT / "inventories" / inv.group(1) / "hosts.yml").read_text())["all"]
                             .get("children", {}))
                for h in limit.split(","):
                    if h not in hosts | groups | {"all"}:
                        bad.append(f"{rel(doc)}:{line}: --limit {h}: {inv.group(0)} has {sorted(hosts)}")
    assert not bad, "\n".join(bad)


# --- the checks catch what they are for ----------------------------------------------------
def test_the_checks_fail_on_stale_names():
    """The names the static runbooks carried before their units became one per instance."""
    facts = page_facts([REFERENCE])
    assert not unit_known("sglang-pd-prefill.service", facts)
    assert not unit_known("sglang-pd-decode.service", facts)
    assert unit_known("sglang-pd-prefill-0.service", facts)
    assert unit_arguments(["systemctl", "restart", "sglang-pd-prefill"]) == ["sglang-pd-prefill.service"]
    assert unit_arguments(["journalctl", "-u", "sglang-pd-decode", "--since", "-15min"]) == ["sglang-pd-decode.service"]
    assert 30001 in facts.ports and 30002 not in facts.ports
    assert not path_known("/etc/sglang-pd/prefill.json", facts)
    assert path_known("/etc/sglang-pd/prefill-0.json", facts)
    assert path_known("/opt/sglang-pd/venvs/<release>", facts)
    prose = "restart sglang-pd-prefill (decode follows),\nthen sglang-pd-prefill-0 and sglang-pd.target; /etc/sglang-pd/x"
    assert prose_units(prose, facts) == [(1, "sglang-pd-prefill")]
