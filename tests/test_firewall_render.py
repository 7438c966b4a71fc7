"""The firewall role's templates, rendered as Ansible renders them, for an enabled and a
disabled plan.

Rendering uses Jinja2 with Ansible's own core filters and tests plus the role's filter
plugin (trim_blocks, as the template module does), so the text checked here is the text a
host gets. The chain is then evaluated for a packet (source, port) the way nftables walks
it: peers reach every port, everyone else only the public and unlisted ones. When `nft`
is on this machine the text also goes through `nft -c -f`; the same check runs on every
deploy (the template task's validate) and in the real-nftables container test of
docs/firewall.md.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters
from ansible.plugins.test.core import TestModule as CoreTests

from planvars import variables

from pdnode.core.plan.build import build_plan
from pdnode.core.plan.roles import firewall

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles/firewall"


PDNODE_FILTERS = importlib.util.spec_from_file_location("pdnode_filters", ROOT / "plugins/filter/pdnode.py")


def _env() -> jinja2.Environment:
    # No autoescape: nftables and unit text, as the template module renders it.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), trim_blocks=True,  # noqa: S701
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters.update(CoreFilters().filters())
    project = importlib.util.module_from_spec(PDNODE_FILTERS)  # the project's filters (pdnode_exec_line)
    PDNODE_FILTERS.loader.exec_module(project)
    # the collection's filters, by the names the role's templates use (FQCN)
    for name, fn in project.FilterModule().filters().items():
        env.filters[f"pdnode.sglang_pd.{name}"] = fn
    env.tests.update(CoreTests().tests())
    return env


def plan(**over) -> dict:
    base = {"enabled": True, "peers": ["10.0.0.2", "10.0.0.3", "fd00::2"], "tcp_ports": [30000, 30001, 30001],
            "tcp_port_ranges": [[15000, 17000], [32768, 60999], [5000, 5000]], "public_tcp_ports": [8000, 30001]}
    return {**base, **over}


def render(name: str, firewall_plan: dict, prefix: str = "sglang-pd") -> str:
    """The template as the role writes it from the plan's view (pdnode.core.plan.roles.firewall)."""
    view = firewall.view({"install": {"prefix": prefix}, "firewall": firewall_plan})
    return _env().get_template(name).render({"firewall_view": view, "ansible_managed": "Ansible managed"})


def statements(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# --- a small evaluator of the rendered input chain ---------------------------------------
def _sets(text: str) -> dict[str, set[str]]:
    out = {}
    for name, body in re.findall(r"set (\w+) \{(.*?)\n\t\}", text, re.DOTALL):
        m = re.search(r"elements = \{ (.*) \}", body)
        out[name] = {e.strip() for e in m.group(1).split(",")} if m else set()
    return out


def _ports(spec: str) -> set[int]:
    out: set[int] = set()
    for part in spec.strip("{} ").split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def verdict(text: str, src: str, dport: int, iface: str = "eth0") -> str:
    """What the chain does with a NEW TCP connection (policy accept when no rule matches)."""
    sets = _sets(text)
    chain = re.search(r"chain input \{\n(.*?)\n\t\}", text, re.DOTALL).group(1)
    ip = ipaddress.ip_address(src)
    for rule in statements(chain)[1:]:   # [0] is the hook line
        if rule.startswith("ct state established,related"):
            continue                      # a new connection is neither
        if rule == 'iif "lo" accept':
            if iface == "lo":
                return "accept"
            continue
        if m := re.fullmatch(r"(ip6?) saddr @(\w+) accept", rule):
            if (m.group(1) == "ip") == (ip.version == 4) and str(ip) in sets[m.group(2)]:
                return "accept"
            continue
        if m := re.fullmatch(r"tcp dport (\{[^}]*\}|\d+(?:-\d+)?) (accept|counter drop)", rule):
            if dport in _ports(m.group(1)):
                return m.group(2).split()[-1]
            continue
        raise AssertionError(f"rule the evaluator does not know: {rule!r}")
    return "accept"


# --- the rules file -----------------------------------------------------------------------
def test_file_replaces_only_its_own_table_atomically():
    text = render("firewall.nft.j2", plan())
    s = statements(text)
    assert s[:3] == ["table inet sglang_pd_pdnode {}", "delete table inet sglang_pd_pdnode",
                     "table inet sglang_pd_pdnode {"]
    assert text.startswith("#!/usr/sbin/nft -f\n")
    # No other table, no ruleset-wide command, no default policy but accept.
    assert set(re.findall(r"^table (\S+ \S+)", text, re.MULTILINE)) == {"inet sglang_pd_pdnode"}
    assert "flush" not in text and "ruleset" not in text
    assert re.findall(r"policy (\w+);", text) == ["accept"]


def test_peers_are_split_by_ip_version():
    sets = _sets(render("firewall.nft.j2", plan(peers=["10.0.0.3", "fd00::2", "10.0.0.2", "FD00:0::3"])))
    assert sets == {"peers_v4": {"10.0.0.2", "10.0.0.3"}, "peers_v6": {"fd00::2", "fd00::3"}}


@pytest.mark.parametrize("port", [30000, 16999, 15000, 16000, 17000, 32768, 60999, 5000])
def test_peers_and_loopback_reach_every_port_others_do_not(port):
    text = render("firewall.nft.j2", plan())
    assert verdict(text, "10.0.0.2", port) == "accept"
    assert verdict(text, "fd00::2", port) == "accept"
    assert verdict(text, "127.0.0.1", port, iface="lo") == "accept"
    assert verdict(text, "10.0.0.9", port) == "drop"
    assert verdict(text, "fd00::9", port) == "drop"


@pytest.mark.parametrize("port", [22, 8000, 30001, 14999, 17001, 4999, 5001, 61000])
def test_public_and_unlisted_ports_stay_open_to_everyone(port):
    # 30001 is both a worker port and public: public wins (accepted before the drops).
    assert verdict(render("firewall.nft.j2", plan()), "192.0.2.7", port) == "accept"


def test_ports_are_listed_once_and_a_one_port_range_is_a_port():
    text = render("firewall.nft.j2", plan())
    assert "tcp dport { 30000, 30001 } counter drop" in statements(text)
    assert "tcp dport 5000 counter drop" in statements(text)
    assert "tcp dport 5000-5000" not in text


def test_a_peer_removed_from_the_plan_is_dropped():
    before = render("firewall.nft.j2", plan())
    after = render("firewall.nft.j2", plan(peers=["10.0.0.3"]))
    assert verdict(before, "10.0.0.2", 30000) == "accept"
    assert verdict(after, "10.0.0.2", 30000) == "drop"
    assert verdict(after, "10.0.0.3", 30000) == "accept"


def test_empty_lists_render_no_empty_sets():
    text = render("firewall.nft.j2", plan(peers=["10.0.0.2"], public_tcp_ports=[], tcp_port_ranges=[]))
    assert "{ }" not in text and "{  }" not in text
    assert "elements" not in _sets_body(text, "peers_v6")
    assert verdict(text, "10.0.0.9", 30000) == "drop"


def _sets_body(text: str, name: str) -> str:
    return re.search(rf"set {name} \{{(.*?)\n\t\}}", text, re.DOTALL).group(1)


def test_disabled_plan_only_removes_the_table():
    text = render("firewall.nft.j2", plan(enabled=False))
    assert statements(text) == ["table inet sglang_pd_pdnode {}", "delete table inet sglang_pd_pdnode"]


def test_prefix_names_table_file_and_unit():
    text = render("firewall.service.j2", plan(), prefix="pd-a")
    # every argument quoted (pdnode_exec_line; systemd reads the argv back: tests/test_unit_argv.py)
    assert 'ExecStart="/usr/sbin/nft" \\\n    "-f" \\\n    "/etc/pd-a-firewall.nft"\n' in text
    assert 'ExecReload="/usr/sbin/nft" \\\n    "-f" \\\n    "/etc/pd-a-firewall.nft"\n' in text
    assert 'ExecStop=-"/usr/sbin/nft" \\\n    "delete" \\\n    "table" \\\n    "inet" \\\n    "pd_a_pdnode"\n' in text
    assert re.search(r"^Before=.*\bpd-a\.target\b", text, re.MULTILINE)
    for line in ["Type=oneshot", "RemainAfterExit=yes", "WantedBy=multi-user.target"]:
        assert line in text.splitlines()


@pytest.mark.parametrize("enabled", [True, False])
def test_nft_accepts_the_file(tmp_path, enabled):
    # not a skip: scripts/setup installs nft (nftables in scripts/lib/system-packages)
    assert shutil.which("nft"), "nft is not installed: run scripts/setup (nftables, scripts/lib/system-packages)"
    path = tmp_path / "firewall.nft"
    path.write_text(render("firewall.nft.j2", plan(enabled=enabled)))
    run = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


# --- the role's view and inputs ------------------------------------------------------------
@pytest.mark.parametrize("value", ["gpu02", "10.0.0.0/24", "10.0.0.256", "fe80::1%eth0", "", 167772162, None,
                                   True, " 10.0.0.2"])
def test_a_value_that_is_no_address_literal_is_in_no_set(value):
    assert firewall.addresses(["10.0.0.2", value, "::1"], 4) == ["10.0.0.2"]
    assert firewall.addresses(["10.0.0.2", value, "::1"], 6) == ["::1"]


def test_addresses_are_normalised_sorted_and_unique():
    peers = ["10.0.0.10", "10.0.0.9", "10.0.0.9", "FD00:0::3", "fd00::3", "fd00::2"]
    assert firewall.addresses(peers, 4) == ["10.0.0.9", "10.0.0.10"]  # by address, not as text
    assert firewall.addresses(peers, 6) == ["fd00::2", "fd00::3"]


def test_a_range_is_written_as_nft_reads_it():
    assert firewall.port_range(15000, 17000) == "15000-17000"
    assert firewall.port_range(5000, 5000) == "5000"


def test_the_view_names_everything_after_the_prefix():
    names = firewall.names("pd-a")
    assert names == {
        "prefix": "pd-a", "table": "pd_a_pdnode", "unit": "pd-a-firewall.service",
        "unit_path": "/etc/systemd/system/pd-a-firewall.service", "rules_file": "/etc/pd-a-firewall.nft",
        "target": "pd-a.target", "nft": "/usr/sbin/nft",
        "files": ["/etc/systemd/system/pd-a-firewall.service", "/etc/pd-a-firewall.nft"],
        "load_argv": ["/usr/sbin/nft", "-f", "/etc/pd-a-firewall.nft"],
        "list_argv": ["/usr/sbin/nft", "list", "table", "inet", "pd_a_pdnode"],
        "delete_argv": ["/usr/sbin/nft", "delete", "table", "inet", "pd_a_pdnode"]}


def test_the_port_rules_accept_the_public_ports_first_then_drop_each_port_once_and_the_ranges():
    rules = firewall.port_rules(plan(tcp_ports=[30001, 30000, 30001], public_tcp_ports=[8000, 30001, 8000],
                                     tcp_port_ranges=[[32768, 60999], [5000, 5000], [15000, 17000]]))
    assert rules == ["tcp dport { 8000, 30001 } accept", "tcp dport { 30000, 30001 } counter drop",
                     "tcp dport 5000 counter drop", "tcp dport 15000-17000 counter drop",
                     "tcp dport 32768-60999 counter drop"]
    assert firewall.port_rules(plan(tcp_ports=[], public_tcp_ports=[], tcp_port_ranges=[])) == []
    assert firewall.port_rules(plan(public_tcp_ports=[])) == ["tcp dport { 30000, 30001 } counter drop",
                                                              "tcp dport 5000 counter drop",
                                                              "tcp dport 15000-17000 counter drop",
                                                              "tcp dport 32768-60999 counter drop"]
    assert firewall.rules(plan(enabled=False))["enabled"] is False


def test_the_plan_of_every_host_carries_the_firewall_view():
    doc = build_plan(variables("demo")).as_dict()
    assert doc["roles"]["firewall"] == firewall.view(doc)
    assert doc["roles"]["firewall"]["enabled"] is False  # one host: engines on loopback


def test_every_role_variable_has_an_argument_spec():
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    used = set()
    for path in [*ROLE.rglob("*.yml"), *ROLE.rglob("*.j2")]:
        used |= set(re.findall(r"\bfirewall_[a-z_]+\b", path.read_text()))
    assert set(defaults) <= set(spec)
    assert used == set(spec), f"role variables without a spec or specs never used: {used ^ set(spec)}"
    view_keys = set(spec["firewall_view"]["options"])
    # the defaults are the view of the default prefix with the firewall disabled
    assert view_keys == set(defaults["firewall_view"]) == set(firewall.view(
        {"install": {"prefix": "sglang-pd"}, "firewall": plan(enabled=False)}))
    assert defaults["firewall_view"] == firewall.view({"install": {"prefix": "sglang-pd"}, "firewall": {
        "enabled": False, "peers": [], "tcp_ports": [], "tcp_port_ranges": [], "public_tcp_ports": []}})


def test_playbook_feeds_the_view():
    play = yaml.safe_load((ROOT / "playbooks/firewall.yml").read_text())[0]
    assert play["hosts"] == "all" and play["become"] is True and play["tags"] == ["firewall"]
    assert play["pre_tasks"][0]["ansible.builtin.import_tasks"] == "tasks/plan.yml"
    role = play["roles"][0]
    assert role["role"] == "pdnode.sglang_pd.firewall"
    assert role["vars"] == {"firewall_view": "{{ _pdnode_plan.roles.firewall }}"}
