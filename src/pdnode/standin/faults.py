"""Fault injection: which faults are active, with their arguments.

A fault is written NAME or NAME:ARG (see the package docstring for the list). The set is
replaced as a whole, at start from PDNODE_SIM_FAULTS and at run time by POST /sim/faults;
listeners (the bootstrap server) are told about every change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable

DEFAULT_RENAME = ("sglang:e2e_request_latency_seconds", "sglang:request_e2e_latency_seconds")

KNOWN_FAULTS = {
    "slow": "every simulated latency multiplied (slow:F, default PDNODE_SIM_SLOW_FACTOR)",
    "error500": "generation routes answer 500",
    "wrong_output": "the model answers wrongly",
    "bootstrap_down": "the prefill bootstrap server stops listening",
    "transfer_stall": "the prefill never sends the KV cache",
    "transfer_fail": "Mooncake's write to the decode fails (-1): the request fails and the decode's session is "
                     "blacklisted until SGLang's failed-session probe lifts it",
    "no_metrics": "/metrics answers 404",
    "rename_metric": "a metric is exposed under another name (rename_metric:OLD=NEW)",
}


class FaultError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.name if self.arg is None else f"{self.name}:{self.arg}"


def parse_fault(spec: str) -> Fault:
    if not isinstance(spec, str):
        raise FaultError(f"fault {spec!r}: must be a string")
    spec = spec.strip()
    name, sep, arg = spec.partition(":")
    name = name.strip()
    if name not in KNOWN_FAULTS:
        raise FaultError(f"unknown fault {name!r}: known faults are {', '.join(sorted(KNOWN_FAULTS))}")
    arg_value = arg.strip() if sep else None
    if name == "slow" and arg_value is not None:
        try:
            if float(arg_value) < 1.0:
                raise ValueError
        except ValueError:
            raise FaultError(f"fault {spec!r}: slow takes a factor >= 1, e.g. slow:5") from None
    elif name == "rename_metric" and arg_value is not None:
        old, eq, new = arg_value.partition("=")
        if not (eq and old.strip() and new.strip()):
            raise FaultError(f"fault {spec!r}: rename_metric takes OLD=NEW metric names")
    elif arg_value is not None and name not in ("slow", "rename_metric"):
        raise FaultError(f"fault {spec!r}: {name} takes no argument")
    return Fault(name, arg_value or None)


def parse_faults(specs: Iterable[str]) -> list[Fault]:
    faults: dict[str, Fault] = {}
    for spec in specs:
        fault = parse_fault(spec)
        faults[fault.name] = fault
    return list(faults.values())


Listener = Callable[["Faults"], Awaitable[None]]


class Faults:
    def __init__(self, specs: Iterable[str] = (), slow_factor: float = 10.0) -> None:
        self._faults = {f.name: f for f in parse_faults(specs)}
        self._default_slow = slow_factor
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def replace(self, specs: Iterable[str]) -> list[str]:
        faults = parse_faults(specs)  # validate all before changing anything
        self._faults = {f.name: f for f in faults}
        for listener in self._listeners:
            await listener(self)
        return self.as_list()

    def active(self, name: str) -> bool:
        return name in self._faults

    def as_list(self) -> list[str]:
        return [str(f) for f in self._faults.values()]

    @property
    def latency_factor(self) -> float:
        fault = self._faults.get("slow")
        if fault is None:
            return 1.0
        return float(fault.arg) if fault.arg else self._default_slow

    @property
    def renames(self) -> dict[str, str]:
        fault = self._faults.get("rename_metric")
        if fault is None:
            return {}
        if fault.arg:
            old, _, new = fault.arg.partition("=")
            return {old.strip(): new.strip()}
        return {DEFAULT_RENAME[0]: DEFAULT_RENAME[1]}
