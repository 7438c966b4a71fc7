"""Address filters of the firewall role: which peers are not IP literals, and the
peers of one IP version (nftables keeps IPv4 and IPv6 addresses in separate sets)."""

from __future__ import annotations

import ipaddress


def _address(value):
    # Only text: ip_address(5) would read an integer as 0.0.0.5. A scope ("fe80::1%eth0")
    # is refused too: nft has no syntax for it.
    if not isinstance(value, str) or "%" in value:
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def firewall_not_addresses(values):
    """The values that are not IPv4/IPv6 address literals."""
    return [v for v in values if _address(v) is None]


def firewall_addresses(values, version):
    """The address literals of one IP version (4 or 6), normalised, sorted, unique."""
    found = {a for a in map(_address, values) if a is not None and a.version == int(version)}
    return [str(a) for a in sorted(found)]


class FilterModule:
    def filters(self):
        return {
            "firewall_not_addresses": firewall_not_addresses,
            "firewall_addresses": firewall_addresses,
        }
