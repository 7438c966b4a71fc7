"""What the host-layer roles (rdma, nvidia_driver) write or check from their own values and
the host's facts: the OS as their supported lists name it, the limits.d lines of the
rdma role. Called through filters (plugins/filter/roles.py)."""

from __future__ import annotations

from typing import Any


def os_release(facts: dict[str, Any]) -> str:
    """ansible_facts -> "ubuntu 22.04" / "debian 12": Ubuntu by its full version, every other
    distribution by its major one, as the roles' supported lists name them."""
    os = str(facts["distribution"]).lower()
    version = facts["distribution_version"] if os == "ubuntu" else facts["distribution_major_version"]
    return f"{os} {version}"


def memlock_lines(users: list[str], limit: Any) -> str:
    """The limits.d lines that raise the locked-memory limit of each user (or @group): a
    soft and a hard line each, the name padded to 20 columns; each line ends in a newline."""
    return "".join(f"{user:<20} {kind}    memlock    {limit}\n" for user in users for kind in ("soft", "hard"))
