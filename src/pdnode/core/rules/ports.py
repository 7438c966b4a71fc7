"""Every port a node binds: given ones checked, missing ones allocated, no collision.

An engine binds its HTTP port; a prefill also its bootstrap server; each its NCCL port
(SGLang picks a random one unless told, which can land on a neighbour's); and an
instance with DP attention also port+233 .. port+239 (SGLang's PortArgs: dist-init at
+233, then six derived ZMQ ports). Ports the inventory leaves out are allocated from a
base per kind with a stride of 10, decodes first: adding or removing a prefill never
moves a decode's ports (a 1P1D -> 2P1D re-deploy restarts only what changed); adding a
decode moves a prefill only where both run DP attention at the same index (their ranges
would overlap). Every reserved set (an instance's whole DP-attention range included) is
free of every other. A collision between given ports is one line naming both owners
and the nearest free port.
"""

from __future__ import annotations

from typing import Any

from .instances import Instance

# With DP attention and no --dist-init-addr, SGLang binds port+233 .. port+239 itself.
DP_ATTENTION_OFFSETS = range(233, 240)
# An instance spanning hosts: rank 0 listens on dist_init_port (torch's store), and with
# DP attention SGLang's PortArgs takes +1..+6 (tokenizer, detokenizer, rpc, metrics,
# scheduler input, load collector) and +13 (the worker-port handshake the other node
# ranks connect to; data_parallel_controller.py). docs/multi-host.md has the table.
DIST_INIT_OFFSETS = (1, 2, 3, 4, 5, 6, 13)
# DP replicas (dp_size > 1 without DP attention) cannot be given an NCCL port: SGLang 0.5.23
# hands the one port to every replica, and the second bind fails. Each replica draws its
# own at every start instead (PortArgs.init_new -> get_free_port_below_ephemeral: a random
# port of 22000-29999 that is free at that moment; sglang#39611 is this draw colliding).
# A listener of the plan in that range whose owner is not up yet (the router starts after
# the engines; a restarted engine) can be drawn, and its owner then fails to start.
REPLICA_NCCL_DRAW = range(22000, 30000)
BASES = {  # kind -> (first port, stride)
    ("prefill", "port"): (30000, 10),
    ("decode", "port"): (30001, 10),
    ("prefill", "bootstrap_port"): (8998, 1),
    ("prefill", "nccl_port"): (31000, 10),
    ("decode", "nccl_port"): (31100, 10),
    ("prefill", "dist_init_port"): (32000, 10),
    ("decode", "dist_init_port"): (32100, 10),
}


def _reserved(inst: Instance, key: str, port: int) -> dict[str, int]:
    """Ports one setting takes: the port itself, and the DP-attention range for HTTP."""
    out = {f"{inst.id}.{key}": port}
    if key == "port" and _dp_attention(inst):
        out.update({f"{inst.id}.port+{off}": port + off for off in DP_ATTENTION_OFFSETS})
    if key == "dist_init_port":
        out.update({f"{inst.id}.dist_init_port+{off}": port + off for off in DIST_INIT_OFFSETS})
    return out


def reserved_ports(inst: Instance) -> list[int]:
    """Every port INST binds (its settings' and their derived ranges), once allocated."""
    return sorted(p for key in _keys(inst) if isinstance(getattr(inst, key), int)
                  for p in _reserved(inst, key, getattr(inst, key)).values())


def _top(inst: Instance, key: str) -> int:
    """The highest port a setting may take (its derived range must fit below 65536)."""
    if key == "port" and _dp_attention(inst):
        return 65535 - DP_ATTENTION_OFFSETS[-1]
    return 65535 - (DIST_INIT_OFFSETS[-1] if key == "dist_init_port" else 0)


def _keys(inst: Instance) -> list[str]:
    keys = ["port", "nccl_port"]
    if inst.role == "prefill":
        keys.insert(1, "bootstrap_port")
    # DP replicas each bind an NCCL port of their own (SGLang's data-parallel controller):
    # SGLang chooses free ones; a pinned one is refused by pdnode.core.rules.instances.
    if isinstance(inst.dp_size, int) and inst.dp_size > 1:
        keys.remove("nccl_port")
    if inst.spans_hosts:
        keys.append("dist_init_port")
    return keys


def _owner(name: str) -> str:
    return name.split(".")[0]


def _label(name: str, ports: dict[str, int], whose: bool = True) -> str:
    """A reserved port's name as a person reads it, e.g. "decode-0's port+233..+239 (30234-30240)"."""
    owner, _, key = name.partition(".")
    if "+" in key:
        setting = key.split("+")[0]
        base = ports[f"{owner}.{setting}"]
        offsets = DIST_INIT_OFFSETS if setting == "dist_init_port" else DP_ATTENTION_OFFSETS
        key = (f"{setting}+{offsets[0]}..+{offsets[-1]} "
               f"({base + offsets[0]}-{base + offsets[-1]})")
    if not whose:
        return f"its {key}"
    return f"the router's {key}" if owner == "router" else f"{owner}'s {key}"


def allocate(c: Any, instances: list[Instance], router: dict[str, Any],
             avoid: frozenset[int] | set[int] = frozenset()) -> dict[str, int]:
    """name -> port for every listener; fills the instances' missing ports in place.

    ``router`` maps the router's port names ("router.port", "router.metrics_port") to
    (inventory variable, port). ``avoid``: ports an allocated one must not take (those of
    running instances that stop only once the new ones started: pdnode.core.change.identity)."""
    taken: dict[int, str] = {}
    ports: dict[str, int] = {}
    fields: dict[str, str] = {}  # reserved name -> the inventory field that sets it
    # (first owner, second owner) -> the first overlap: one line per pair, however many
    # of an instance's ports overlap the other's
    clashes: dict[tuple[str, str], tuple[str, str, int, str, Any]] = {}

    def take(named: dict[str, int], field: str, setting: tuple[str, Any]) -> None:
        for name, port in named.items():
            other = taken.get(port)
            if other is not None:
                clashes.setdefault((_owner(other), _owner(name)), (other, name, port, field, setting))
            else:
                taken[port] = name
            ports[name] = port
            fields[name] = field

    for name, (var, port) in router.items():
        if isinstance(port, int):
            take({name: port}, var, (name, None))
    for inst in instances:  # the given ports first: they are not moved
        for key in _keys(inst):
            port = getattr(inst, key)
            if not isinstance(port, int):
                continue
            top = _top(inst, key)
            if not 1024 <= port <= top:
                why = (f" (with DP attention it also binds port+{DP_ATTENTION_OFFSETS[0]}.."
                       f"+{DP_ATTENTION_OFFSETS[-1]})" if key == "port" and top < 65535 else
                       f" (SGLang also binds {key}+{DIST_INIT_OFFSETS[0]}..+{DIST_INIT_OFFSETS[-1]})"
                       if top < 65535 else "")
                c.error("port-range",
                        f"{inst.field}.{key}", port, f"must be an unprivileged TCP port (1024-{top}){why}",
                        f"choose a port in 1024-{top}, or leave it out to have one allocated")
                setattr(inst, key, None)
                continue
            take(_reserved(inst, key, port), f"{inst.field}.{key}", (f"{inst.id}.{key}", inst))
    # Allocation: decode first, so that adding or removing a prefill (a DP-attention one
    # included) never moves a decode's ports, and the re-deploy restarts only the prefills.
    for inst in sorted(instances, key=lambda i: i.role != "decode"):
        for key in _keys(inst):
            if getattr(inst, key) is not None:
                continue
            first, stride = BASES[(inst.role, key)]
            port = first
            while any(p in taken or p in avoid for p in _reserved(inst, key, port).values()):
                port += stride
            setattr(inst, key, port)
            take(_reserved(inst, key, port), f"{inst.field}.{key}", (f"{inst.id}.{key}", inst))
    for first, second, port, field, (setting, inst) in clashes.values():
        value = ports[setting]
        others = {p for p, n in taken.items() if n != setting and not n.startswith(setting + "+")}
        key = setting.split(".")[1]
        free = next((p for p in range(value + 1, 65536 - DP_ATTENTION_OFFSETS[-1])
                     if not set((_reserved(inst, key, p) if inst else {setting: p}).values()) & others), None)
        pair = f"{_label(second, ports)} and {_label(first, ports, _owner(first) != _owner(second))}"
        if "+" in first + second:
            rule = (f"{pair} overlap at port {port} (an instance with DP attention also binds its "
                    f"port+{DP_ATTENTION_OFFSETS[0]}..+{DP_ATTENTION_OFFSETS[-1]})")
        else:
            rule = f"{pair} are both port {port}"
        c.error("port-collision", field, value, rule,
                (f"set {field}: {free} (the nearest free port)" if free else f"move {field}")
                + (", or leave the instances' ports out so the plan allocates them" if inst else ""))
    _warn_replica_draw(c, instances, ports, fields, taken)
    return ports


def _warn_replica_draw(c: Any, instances: list[Instance], ports: dict[str, int], fields: dict[str, str],
                       taken: dict[int, str]) -> None:
    """A warning per planned setting with a listener a DP replica's NCCL draw can take
    (REPLICA_NCCL_DRAW), and the nearest free port above the range for it."""
    replicas = [i.id for i in instances if isinstance(i.dp_size, int) and i.dp_size > 1 and not _dp_attention(i)]
    if not replicas:
        return
    first, last = REPLICA_NCCL_DRAW[0], REPLICA_NCCL_DRAW[-1]
    used, warned = set(taken), set()
    for name, port in sorted(ports.items(), key=lambda item: item[1]):
        if port not in REPLICA_NCCL_DRAW or fields[name] in warned:
            continue
        warned.add(fields[name])
        free = next(p for p in range(last + 1, 65536) if p not in used)
        used.add(free)
        c.warn("dp-replica-port-draw", fields[name], port,
               f"{', '.join(replicas)} runs DP replicas, and SGLang 0.5.23 draws each replica's NCCL port at every "
               f"start from {first}-{last}, any port free at that moment: {_label(name, ports)} is there, and a "
               "draw made while its owner is down takes it (its owner then fails to start)",
               f"set {fields[name]}: {free} (the nearest free port above {last})")


def _dp_attention(inst: Instance) -> bool:
    return isinstance(inst.attn_dp_size, int) and inst.attn_dp_size > 1
