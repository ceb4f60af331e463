"""The value rules of a job's network policy (docs/data-plane.md "Networks"): its egress
allow-list's host[:port] entries and its published ports' source CIDRs. The job body's checks
(`network_policy`, used by the jobs API) and the pool's `egress_allowed` knob (pools/knobs.py)
share the entry syntax. Whether the pool lets these addresses be reached is the submit's
question (jobs/networks.py).
"""

import ipaddress
import re

from django.core.exceptions import ValidationError

NETWORK_MODES = ("none", "pool")
EGRESS_MAX_ENTRIES = 64
EGRESS_ENTRY_MAX_CHARS = 261  # a 253-character host name, ":" and a port
INGRESS_MAX_ENTRIES = 64
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)", re.ASCII)


def egress_entry_problem(entry) -> str | None:
    """What is wrong with an egress allow-list entry (host[:port], [IPv6][:port]), or None."""
    if not isinstance(entry, str) or not entry or len(entry) > EGRESS_ENTRY_MAX_CHARS:
        return f"a host[:port] string of at most {EGRESS_ENTRY_MAX_CHARS} characters"
    host, port = entry, None
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                return "[IPv6]:port"
            port = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "not an IPv6 address"
    elif ":" in entry:
        host, port = entry.rsplit(":", 1)
    if port is not None and (
        not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535
    ):
        return "the port is a number from 1 to 65535"
    if not entry.startswith("["):
        labels = host.rstrip(".").split(".")
        if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
            return "not a host name or IPv4 address"
    return None


def network_policy(value) -> dict:
    """A job's `network_policy`: {"mode": "none"} (no network) or {"mode": "pool",
    "egress_allow": [host[:port], …], "ingress_allow": [source CIDR, …]} (the pool network,
    egress only to those; its published ports reached only from those sources, any when
    none). Whether the pool lets these addresses be reached is the submit's question
    (jobs/networks.py)."""
    if not isinstance(value, dict):
        raise ValidationError('An object: {"mode": "none"|"pool", "egress_allow": [...]}.')
    unknown = sorted(set(value) - {"mode", "egress_allow", "ingress_allow"})
    if unknown:
        raise ValidationError(f"Unknown keys: {', '.join(unknown)[:200]}.")
    mode = value.get("mode", "none")
    if mode not in NETWORK_MODES:
        raise ValidationError(f"mode is one of {', '.join(NETWORK_MODES)}.")
    egress = value.get("egress_allow", [])
    if not isinstance(egress, list):
        raise ValidationError("egress_allow is a list of host[:port].")
    if egress and mode != "pool":
        raise ValidationError('egress_allow needs mode "pool": mode "none" has no network.')
    if len(egress) > EGRESS_MAX_ENTRIES:
        raise ValidationError(f"egress_allow has at most {EGRESS_MAX_ENTRIES} entries.")
    for entry in egress:
        if problem := egress_entry_problem(entry):
            raise ValidationError(f"egress_allow {str(entry)[:60]!r}: {problem}.")
    policy = {"mode": mode, "egress_allow": egress}
    if "ingress_allow" in value:
        policy["ingress_allow"] = ingress_allow(value["ingress_allow"], mode)
    return policy


def ingress_allow(value, mode: str) -> list[str]:
    """Source CIDRs of a job's published ports (IPv4: the pool network is IPv4 only),
    normalised ("10.0.0.7" → "10.0.0.7/32")."""
    if not isinstance(value, list) or len(value) > INGRESS_MAX_ENTRIES:
        raise ValidationError(f"ingress_allow is a list of at most {INGRESS_MAX_ENTRIES} CIDRs.")
    if value and mode != "pool":
        raise ValidationError('ingress_allow needs mode "pool": mode "none" has no network.')
    out = []
    for entry in value:
        try:
            network = ipaddress.IPv4Network(entry, strict=False) if isinstance(entry, str) else None
        except ValueError:
            network = None
        if network is None:
            raise ValidationError(f"ingress_allow {str(entry)[:60]!r}: an IPv4 CIDR.")
        out.append(str(network))
    return list(dict.fromkeys(out))
