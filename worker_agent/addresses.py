"""Which addresses a job may make anything reach: the one table of the data plane's address
rules, used by the control plane at submit (pools/networks.py imports it) and by the agent when
it fetches inputs and installs egress rules (docs/security.md, "Networks a job may reach").

Standard library only (psutil, a dependency of both, for the host's own addresses): the agent
imports nothing of the control plane, and the control plane may import this module of the agent,
so there is one definition of the rules.

- Always refused: loopback, link-local (169.254.0.0/16 and fe80::/10: the cloud metadata
  endpoints live there), unspecified, multicast, broadcast and the reserved 240.0.0.0/4, plus
  whatever the caller adds (the node's own addresses, the Docker gateway, the control plane's
  addresses).
- Private ranges (RFC 1918, carrier-grade NAT 100.64.0.0/10, IPv6 unique-local fc00::/7) are
  refused unless the pool allows them (knob `private_ranges_allowed`).
- An IPv6 address that embeds an IPv4 one (IPv4-mapped, IPv4-compatible, NAT64, 6to4) is judged
  by the IPv4 address it carries too.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALWAYS_REFUSED: dict[str, tuple[str, ...]] = {
    "loopback": ("127.0.0.0/8", "::1/128"),
    "link-local (metadata endpoints)": ("169.254.0.0/16", "fe80::/10"),
    "unspecified": ("0.0.0.0/8", "::/128"),
    "multicast": ("224.0.0.0/4", "ff00::/8"),
    "reserved": ("240.0.0.0/4",),  # 255.255.255.255 among them
}
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")

_ALWAYS = [(why, ipaddress.ip_network(net)) for why, nets in ALWAYS_REFUSED.items() for net in nets]
_PRIVATE = [ipaddress.ip_network(net) for net in PRIVATE]


def ip_literal(host: str) -> Address | None:
    """The address a URL's host names literally, or None for a host name. IPv4 in every form
    the C resolver accepts (`127.1`, `0x7f.0.0.1`, `2130706433`), which is how a client would
    read it; IPv6 with or without brackets and a zone."""
    host = host.strip().strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(host.partition("%")[0] if ":" in host else host)
    except ValueError:
        pass
    if ":" in host or not host or not all(part.isalnum() for part in host.split(".")):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def embedded(address: Address) -> list[Address]:
    """The address and any IPv4 address an IPv6 one carries."""
    found = [address]
    if address.version == 6:
        if address.ipv4_mapped:
            found.append(address.ipv4_mapped)
        if address.sixtofour:
            found.append(address.sixtofour)
        if address in NAT64 or (int(address) >> 32 == 0 and int(address) > 1):  # v4-compatible
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def networks(entries: Iterable[str]) -> list[Network]:
    """CIDRs or single addresses as networks (a malformed entry raises ValueError)."""
    return [ipaddress.ip_network(str(entry).strip(), strict=False) for entry in entries]


def refusal(
    address: Address | str,
    *,
    private_allowed: bool = False,
    refused: Iterable[tuple[str, Network]] = (),
) -> str | None:
    """Why `address` may not be reached, or None when it may. `refused` adds (why, network)
    pairs of the caller's own: the node's addresses, the gateway, the control plane."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.partition("%")[0])
    extra = list(refused)
    for each in embedded(address):
        for why, net in _ALWAYS:
            if each in net:
                return f"{each} is {why}: always refused"
        for why, net in extra:
            if each.version == net.version and each in net:
                return f"{each} is {why}: always refused"
        if not private_allowed and any(each in net for net in _PRIVATE):
            return f"{each} is in a private range, which this pool does not allow"
    return None


def host_refusal(host: str) -> str | None:
    """What is wrong with a host name before any lookup: the names of the loopback."""
    name = host.strip().rstrip(".").lower()
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        return f"{host} names the loopback: always refused"
    return None


def within(address: Address, allowed: Iterable[Network]) -> bool:
    return any(address.version == net.version and address in net for net in allowed)


def host_networks(why: str) -> list[tuple[str, Network]]:
    """Every address of this machine's interfaces (in the namespace this runs in), as refused
    (why, /32 or /128) pairs: the node's own addresses for the agent, the control plane's for
    the control plane. The Docker bridges' gateways are among them."""
    import psutil

    found = []
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    address = ipaddress.ip_address(entry.address.partition("%")[0])
                except ValueError:
                    continue
                found.append((why, ipaddress.ip_network(address)))
    return found
