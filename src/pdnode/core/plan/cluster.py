"""Which host runs what: the instances placed on the inventory's hosts.

A node description names hosts only when its layout spans several (an instance's
``hosts``, ``pdnode_router_node``); otherwise everything runs on the host being
planned, on loopback, as before. With several hosts every host of the layout needs
``pdnode_node_address`` (what its peers connect to and its firewall admits), the API
key (workers then listen beyond loopback), and the same layout description (a host
planning from another layout than its peers would register workers the others do not
run). docs/multi-host.md is the operator's view.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..inventory.deferred import REFUSED_FIX, REFUSED_RULE, Deferred, leaves
from ..rules.instances import Instance
from ..rules.values import zone_id

# What every host of one layout must agree on: the plan of each host reads them.
LAYOUT_VARIABLES = (
    "pdnode_prefill_instances", "pdnode_decode_instances", "pdnode_router_node", "pdnode_router_port",
    "pdnode_service_prefix", "pdnode_model_served_name", "pdnode_engine", "pdnode_transfer_backend",
)
# Listeners other than the plan's fixed ports, reached by peers; the firewall guards
# them too. Mooncake's RPC and TCP transport ports: random in 15000-17000 (its
# rpc_min_port/rpc_max_port, config.h; MC_MIN_RPC_PORT/MC_MAX_RPC_PORT move them);
# SGLang's ZMQ rank ports: the kernel's ephemeral range (net.ipv4.ip_local_port_range,
# 32768-60999 by default).
MOONCAKE_PORTS = (15000, 17000)
EPHEMERAL_PORTS = (32768, 60999)


@dataclass(frozen=True)
class Layout:
    host: str  # the host being planned
    hosts: dict[str, str]  # every host of the layout -> its address (loopback on one host)
    router_host: str

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1

    def address(self, host: str) -> str:
        return self.hosts[host]


def place(c: Any, v: dict[str, Any], engines: list[Instance], host: str,
          inventory: Mapping[str, Mapping[str, Any]] | None) -> Layout | None:
    """Fill each instance's hosts (default: ``host``) and check the layout; None when
    a problem leaves no layout to plan."""
    known = set(inventory) if inventory is not None else {host}
    before = len(c.problems)
    for inst in engines:
        for i, name in enumerate(inst.hosts):
            if name not in known:
                c.error("host-known", f"{inst.field}.hosts[{i}]", name, "is not a host of the inventory",
                        f"use one of {', '.join(sorted(known))}")
        if len(set(inst.hosts)) != len(inst.hosts):
            c.error("hosts-unique", f"{inst.field}.hosts", inst.hosts, "names a host twice",
                    "list each host once (one node rank per host)")
        if not inst.hosts:
            inst.hosts = [host]
        if inst.dist_init_port is not None and not inst.spans_hosts:
            c.error("dist-init-port-spanning-only", f"{inst.field}.dist_init_port", inst.dist_init_port,
                    "only an instance spanning several hosts has a rendezvous", "remove it")
        if inst.spans_hosts and isinstance(inst.dp_size, int) and inst.dp_size > 1:
            c.error("spanning-without-dp-replicas", f"{inst.field}.dp_size", inst.dp_size,
                    "an instance spanning hosts is one model replica here", "list each replica as an instance of its own")
    prefills = [i for i in engines if i.role == "prefill"]
    router_host = v["pdnode_router_node"] or (prefills[0].hosts[0] if prefills else host)
    if router_host not in known:
        c.error("host-known", "pdnode_router_node", router_host, "is not a host of the inventory",
                f"use one of {', '.join(sorted(known))}")
    if len(c.problems) > before:
        return None
    names = list(dict.fromkeys([h for i in engines for h in i.hosts] + [router_host]))
    if host not in names:
        c.error("host-in-layout", "pdnode_prefill_instances", host,
                f"the host being deployed, {host}, runs no instance and not the router (the layout's hosts: "
                f"{', '.join(names)})", f"add {host} to an instance's hosts, or leave it out of the play")
        return None
    if len(names) == 1:
        return Layout(host=host, hosts={host: "127.0.0.1"}, router_host=router_host)
    addresses = _addresses(c, v, host, names, inventory or {})
    _same_description(c, host, names, inventory or {})
    if not v["pdnode_api_key_file"]:
        c.error("multi-host-api-key", "pdnode_api_key_file", None,
                f"the layout spans {len(names)} hosts, so its workers listen on the hosts' addresses and must "
                "require the API key", "set pdnode_api_key_file to a controller file holding the key")
    if addresses is None:
        return None
    return Layout(host=host, hosts=addresses, router_host=router_host)


def _addresses(c: Any, v: dict[str, Any], host: str, names: list[str],
               inventory: Mapping[str, Mapping[str, Any]]) -> dict[str, str] | None:
    found: dict[str, str] = {}
    for name in names:
        value = v["pdnode_node_address"] if name == host else inventory[name].get("pdnode_node_address")
        field = "pdnode_node_address" if name == host else f"{name}.pdnode_node_address"
        if value is None:
            c.error("node-address-required", field, None,
                    f"{name} is one of the layout's {len(names)} hosts, and its peers need its address",
                    f"set pdnode_node_address in host_vars/{name} (an IP address the other hosts reach)")
            continue
        if field in {p.field for p in c.problems}:
            continue  # this host's own value, already refused by its pattern (pdnode.core.rules.values)
        if isinstance(value, Deferred):  # another host's, not computed (pdnode.core.inventory.deferred)
            c.error("value-needs-lookup", field, str.__str__(value), REFUSED_RULE.format(needs=value.needs),
                    REFUSED_FIX)
            continue
        if isinstance(value, str) and zone_id(value):
            c.error("host-zone-id", field, value, "is an address with an IPv6 zone id ('%...'); no host field "
                    "takes one (it cannot be written in a URL or a firewall rule, and text after '%' is not checked)",
                    "write the host's global or unique-local address, without '%...'")
            continue
        try:
            ip = ipaddress.ip_address(str(value))
        except ValueError:
            c.error("node-address-ip", field, value, "must be an IP address (the firewall admits peers by address)",
                    "write the host's IPv4 or IPv6 address, e.g. 10.0.0.11")
            continue
        if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
            c.error("node-address-ip", field, value, "must be an address other hosts can reach",
                    "write the host's address on the network its peers share")
            continue
        if str(ip) in found.values():
            other = next(n for n, a in found.items() if a == str(ip))
            c.error("node-address-unique", field, value, f"is also {other}'s address",
                    "give each host its own address")
            continue
        found[name] = str(ip)
    return found if len(found) == len(names) else None


def _same_description(c: Any, host: str, names: list[str], inventory: Mapping[str, Mapping[str, Any]]) -> None:
    for name in names:
        if name == host:
            continue
        theirs = inventory[name]
        deferred = {var: leaves(theirs.get(var), f"{name}.{var}") for var in LAYOUT_VARIABLES}
        for where, leaf in (found for var in LAYOUT_VARIABLES for found in deferred[var]):
            # not computed (pdnode.core.inventory.deferred): what it will be is not known here
            c.error("value-needs-lookup", where, str.__str__(leaf), REFUSED_RULE.format(needs=leaf.needs), REFUSED_FIX)
        differs = [var for var in LAYOUT_VARIABLES if not deferred[var] and theirs.get(var) != c.raw.get(var)]
        if differs:
            var = differs[0]
            c.error("layout-same-on-every-host", f"{name}.{var}", theirs.get(var),
                    f"differs from {host}'s {c.raw.get(var)!r}: every host of a layout must plan from one description",
                    f"set {var} once, in group_vars of the layout's hosts")


def _mooncake_ports(environment: Mapping[str, str]) -> list[int]:
    """Mooncake's port range, as the engines' environment sets it (its defaults otherwise)."""
    try:
        low = int(environment.get("MC_MIN_RPC_PORT", MOONCAKE_PORTS[0]))
        high = int(environment.get("MC_MAX_RPC_PORT", MOONCAKE_PORTS[1]))
    except ValueError:
        return list(MOONCAKE_PORTS)
    return [low, high] if 1024 <= low <= high <= 65535 else list(MOONCAKE_PORTS)


def firewall(layout: Layout, services: dict[str, dict[str, Any]], ports: dict[str, int],
             environment: Mapping[str, str]) -> dict[str, Any]:
    """What this host admits: peers reach every listener of its engines; the router's
    port is public; nothing else of ours is reachable from elsewhere."""
    if not layout.multi_host:
        return {"enabled": False, "peers": [], "tcp_ports": [], "tcp_port_ranges": [], "public_tcp_ports": []}
    local = {s["id"] for s in services.values() if s["role"] != "router"}
    guarded = sorted({p for name, p in ports.items() if name.split(".")[0] in local})
    public = [ports["router.port"]] if "router" in services else []
    return {
        "enabled": True,
        "peers": sorted(a for h, a in layout.hosts.items() if h != layout.host),
        "tcp_ports": [p for p in guarded if p not in public],
        "tcp_port_ranges": [_mooncake_ports(environment), list(EPHEMERAL_PORTS)],
        "public_tcp_ports": public,
    }


def layout_view(plans: Mapping[str, Mapping[str, Any]], host: str) -> dict[str, Any]:
    """The plan of ``host`` with every engine instance of the layout in its services
    (each as its first host plans it: where it serves HTTP), then the router (as its host
    plans it): what the verifier on any host of the layout checks, each service marked
    with the host it runs on. ``plans`` holds the plan of every host of the layout
    (Plan.as_dict()). One host: its plan unchanged."""
    plan = dict(plans[host])
    if not plan["cluster"]["multi_host"]:
        return plan
    services: dict[str, Any] = {}
    for iid, entry in plan["cluster"]["engines"].items():
        services[iid] = plans[entry["hosts"][0]]["services"][iid]
    services["router"] = plans[plan["cluster"]["router"]["host"]]["services"]["router"]
    plan["services"] = services
    return plan
