"""Every port a node binds: given ones checked, missing ones allocated, no collision.

An engine binds its HTTP port; a prefill also its bootstrap server; each its NCCL port
(SGLang picks a random one unless told, which can land on a neighbour's); and an
instance with DP attention also port+233 .. port+239 (SGLang's PortArgs: dist-init at
+233, then six derived ZMQ ports). Ports the inventory leaves out are allocated from a
base per kind with a stride of 10, so adding an instance of one role never moves the
ports of another role's instances (a re-deploy restarts only what changed), and every
reserved set (an instance's whole DP-attention range included) is free of every other.
A collision between given ports is one line naming both owners and the smallest fix.
"""

from __future__ import annotations

from typing import Any

from .instances import Instance

# With DP attention and no --dist-init-addr, SGLang binds port+233 .. port+239 itself.
DP_ATTENTION_OFFSETS = range(233, 240)
BASES = {  # kind -> (first port, stride)
    ("prefill", "port"): (30000, 10),
    ("decode", "port"): (30001, 10),
    ("prefill", "bootstrap_port"): (8998, 1),
    ("prefill", "nccl_port"): (31000, 10),
    ("decode", "nccl_port"): (31100, 10),
}


def _reserved(inst: Instance, key: str, port: int) -> dict[str, int]:
    """Ports one setting takes: the port itself, and the DP-attention range for HTTP."""
    out = {f"{inst.id}.{key}": port}
    if key == "port" and isinstance(inst.attn_dp_size, int) and inst.attn_dp_size > 1:
        out.update({f"{inst.id}.port+{off}": port + off for off in DP_ATTENTION_OFFSETS})
    return out


def _keys(inst: Instance) -> list[str]:
    keys = ["port", "nccl_port"]
    if inst.role == "prefill":
        keys.insert(1, "bootstrap_port")
    # DP replicas each bind an NCCL port of their own near the given one (SGLang's data-
    # parallel controller): let SGLang choose free ones instead of pinning one.
    if isinstance(inst.dp_size, int) and inst.dp_size > 1:
        keys.remove("nccl_port")
    return keys


def allocate(c: Any, instances: list[Instance], router: dict[str, Any]) -> dict[str, int]:
    """name -> port for every listener; fills the instances' missing ports in place.

    ``router`` maps the router's port names ("router.port", "router.metrics_port") to
    (inventory variable, port)."""
    taken: dict[int, str] = {}
    field_of: dict[str, str] = {}
    ports: dict[str, int] = {}
    clashes: dict[tuple[str, str], tuple[str, int, str]] = {}

    def owner(name: str) -> str:
        return name.split(".")[0] if not name.startswith("router.") else "router"

    def take(named: dict[str, int], field: str) -> None:
        for name, port in named.items():
            other = taken.get(port)
            if other is not None:
                pair = (owner(other), owner(name))
                clashes.setdefault(pair, (field, port, f"{other} and {name}"))
            else:
                taken[port] = name
            ports[name] = port
            field_of[name] = field

    for name, (var, port) in router.items():
        if isinstance(port, int):
            take({name: port}, var)
    for inst in instances:  # the given ports first: they are not moved
        for key in _keys(inst):
            port = getattr(inst, key)
            if isinstance(port, int):
                if not 1024 <= port <= 65535:
                    c.error(f"{inst.field}.{key}", port, "must be an unprivileged TCP port (1024-65535)",
                            "choose a port in 1024-65535, or leave it out to have one allocated")
                    continue
                take(_reserved(inst, key, port), f"{inst.field}.{key}")
    for inst in instances:
        for key in _keys(inst):
            if getattr(inst, key) is not None:
                continue
            first, stride = BASES[(inst.role, key)]
            port = first
            while any(p in taken for p in _reserved(inst, key, port).values()):
                port += stride
            setattr(inst, key, port)
            take(_reserved(inst, key, port), f"{inst.field}.{key}")
    for (a, b), (field, port, names) in clashes.items():
        who = f"{a} and {b} both need" if a != b else f"{a} needs twice"
        c.error(field, port, f"{who} port {port} ({names}; with DP attention an instance also "
                "binds its port+233..+239)",
                "move one of them (an instance's HTTP ports at least 7 apart from another DP-attention "
                "instance's), or leave the instance's ports out so the plan allocates them")
    return ports
