"""The firewall role's view of the plan: its names (unit, rules file, table, the nft argv
lists) and the rules file's values (the peers of each IP version, the ports and ranges it
accepts or drops, each as nftables writes it)."""

from __future__ import annotations

import ipaddress
from typing import Any

# Debian and Ubuntu install it here; the unit names it absolutely.
NFT = "/usr/sbin/nft"


def addresses(values: list[Any], version: int) -> list[str]:
    """The IPv4 or IPv6 address literals of VALUES (nftables keeps each version in a set of
    its own), normalised ("FD00:0::3" is fd00::3), unique, sorted. A value that is no
    literal of that version (a name, a network, a scoped "fe80::1%eth0", a number) is left
    out: the plan admits only address literals (pdnode.core.plan.cluster)."""
    found = set()
    for value in values:
        if not isinstance(value, str) or "%" in value:
            continue
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            continue
        if address.version == version:
            found.add(address)
    return [str(a) for a in sorted(found)]


def port_range(low: int, high: int) -> str:
    """An inclusive range as nftables writes it: "low-high", or the port of a one-port range."""
    return str(low) if low == high else f"{low}-{high}"


def names(prefix: str) -> dict[str, Any]:
    """Everything the role names after the install prefix. nftables names allow letters,
    digits and underscores safely; the prefix has hyphens. The rules file lies directly in
    /etc, root-owned: the node's config_dir belongs to the service user, who could swap a
    file there for rules root loads at boot."""
    table = prefix.replace("-", "_") + "_pdnode"
    unit = f"{prefix}-firewall.service"
    unit_path = f"/etc/systemd/system/{unit}"
    rules_file = f"/etc/{prefix}-firewall.nft"
    return {
        "prefix": prefix, "table": table, "unit": unit, "unit_path": unit_path, "rules_file": rules_file,
        "target": f"{prefix}.target", "nft": NFT,
        # what an earlier multi-host layout may have left, in the order the role removes it
        "files": [unit_path, rules_file],
        "load_argv": [NFT, "-f", rules_file],
        "list_argv": [NFT, "list", "table", "inet", table],
        "delete_argv": [NFT, "delete", "table", "inet", table],
    }


def port_rules(firewall: dict[str, Any]) -> list[str]:
    """The input chain's port rules after the peers' accepts, in order: the public ports
    (the router's: accepted before the drops, so a port both public and guarded stays
    open), then the guarded ports, then each guarded range (sorted; a one-port range is a
    port). Each list once and sorted; an empty list writes no rule (nft refuses "{ }")."""
    public = sorted({int(p) for p in firewall.get("public_tcp_ports", [])})
    guarded = sorted({int(p) for p in firewall.get("tcp_ports", [])})
    out = []
    if public:
        out.append(f"tcp dport {{ {', '.join(map(str, public))} }} accept")
    if guarded:
        out.append(f"tcp dport {{ {', '.join(map(str, guarded))} }} counter drop")
    out += [f"tcp dport {port_range(int(lo), int(hi))} counter drop"
            for lo, hi in sorted(firewall.get("tcp_port_ranges", []))]
    return out


def rules(firewall: dict[str, Any]) -> dict[str, Any]:
    """plan.firewall -> what the rules file writes: whether the table exists, the peers by
    IP version, the port rules."""
    peers = firewall.get("peers", [])
    return {
        "enabled": bool(firewall["enabled"]),
        "peers_v4": addresses(peers, 4),
        "peers_v6": addresses(peers, 6),
        "port_rules": port_rules(firewall),
    }


def view(plan: dict[str, Any]) -> dict[str, Any]:
    """PLAN (``Plan.as_dict()`` without ``roles``) -> what the firewall role reads."""
    return {**names(plan["install"]["prefix"]), **rules(plan["firewall"])}
