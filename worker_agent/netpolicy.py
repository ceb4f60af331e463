"""A job's network rules on the pool network, enforced with iptables inside the job's network
namespace (docs/data-plane.md, "Network policy").

The Docker runtime starts a small network-owner container per attempt (the Kubernetes "pause"
pattern); the job container joins its namespace (`network_mode="container:<owner>"`) with every
capability dropped, so it cannot change what is installed here. As root on the host we enter the
owner's namespace (`nsenter -t <pid> -n`) and install OUTPUT rules: loopback, replies, DNS to the
engine's resolver (and the upstream resolvers it forwards to from inside the namespace), one
ACCEPT per allowed address (host names resolved on the node, IPv4, once at start), then REJECT.
Every allowed address is checked again here, after the lookup, against the data plane's address
rules (worker_agent/addresses.py) and the pool's bound (`egress_allowed`): a name that resolves
to the metadata endpoint or the node itself fails the job. INPUT rules let in replies and the
published ports, from the job's `ingress_allow` only when it names sources. IPv6 is dropped
entirely (ip6tables when present; the owner also has IPv6 disabled by sysctl).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from worker_agent import addresses

log = logging.getLogger(__name__)

DOCKER_RESOLVER = "127.0.0.11"  # the engine's embedded DNS on user-defined networks
TOOLS = ("nsenter", "iptables")
RUN_TIMEOUT_S = 15


class EgressError(Exception):
    """The allow-list cannot be enforced or honoured; the runtime fails the job (runtime_error)
    and starts nothing. (Its own exception: worker_agent.runtime imports this module.)"""


@dataclass(frozen=True)
class Allowed:
    ip: str
    port: int | None = None


@dataclass(frozen=True)
class Bounds:
    """What an allow-list may reach once resolved: the address rules (private ranges as the
    pool says, the caller's own refused networks) and, for a job's own egress, the pool's
    `egress_allowed` (`allowed` networks, `names` admitted by name; None: not bounded, as for
    the namespace an input is fetched in, whose entries are the inputs' own hosts)."""

    private_allowed: bool = False
    refused: tuple = ()  # (why, network) pairs: the node's and the control plane's addresses
    allowed: tuple | None = None
    names: frozenset = frozenset()

    @classmethod
    def of_pool(cls, egress_allowed, *, private_allowed: bool, refused=()) -> Bounds:
        """The pool's `egress_allowed` knob (CIDRs and host names) as bounds."""
        nets, names = [], set()
        for entry in egress_allowed:
            try:
                nets.extend(addresses.networks([entry]))
            except ValueError:
                names.add(canonical(entry))
        return cls(private_allowed, tuple(refused), tuple(nets), frozenset(names))

    def check(self, entry: str, host: str, ip: str) -> None:
        """Raises EgressError when `ip` (what `host` of `entry` resolved to) is out of bounds."""
        problem = addresses.refusal(ip, private_allowed=self.private_allowed, refused=self.refused)
        if problem is None and self.allowed is not None:
            literal = addresses.ip_literal(host) is not None
            if literal and not addresses.within(addresses.ip_literal(host), self.allowed):
                problem = f"{ip} is outside the pool's egress_allowed"
            if not literal and canonical(host) not in self.names:
                problem = f"{host} is not a name the pool's egress_allowed lists"
        if problem:
            raise EgressError(f"egress to {entry!r} refused: {problem}")


def refused(pool_network, api_url: str = "") -> tuple:
    """The (why, network) pairs refused beyond the always-refused ranges: this node's own
    addresses (its interfaces, read here: the Docker gateways among them), the control plane's
    (its URL's host, resolved here) and those the control plane sends (`pool_network.refused`:
    its own addresses and its nodes')."""
    pairs = addresses.host_networks("this node's own address")
    host = urlsplit(api_url).hostname if api_url else None
    if host:
        try:
            for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM):
                address = ipaddress.ip_address(info[4][0].partition("%")[0])
                pairs.append(("the control plane's address", ipaddress.ip_network(address)))
        except (OSError, UnicodeError, ValueError):
            log.warning("the control plane's host %r does not resolve here", host)
    for entry in pool_network.refused:
        try:
            pairs += [
                ("an address the control plane refuses", net) for net in addresses.networks([entry])
            ]
        except ValueError:
            log.warning("pool_network.refused: %r is not an address; ignored", entry)
    return tuple(pairs)


def canonical(name: str) -> str:
    return str(name).strip().rstrip(".").lower()


def unenforceable(problem: str) -> EgressError:
    return EgressError(
        f"egress cannot be enforced on this node ({problem}): a job on the pool network is "
        "never run unenforced",
    )


def enforcement_problem() -> str | None:
    """Why this node cannot enforce egress rules (None: it can)."""
    if os.geteuid() != 0:
        return "the agent is not root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found"
    return None


def split_entry(entry: str) -> tuple[str, int | None]:
    """`host[:port]` or `[IPv6][:port]` → (host, port); the control plane validated the shape."""
    port = None
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif ":" in entry:
        host, _, text = entry.rpartition(":")
        port = int(text)
    else:
        host = entry
    return host, port


def resolve(entries, bounds: Bounds | None = None) -> list[Allowed]:
    """Each entry's IPv4 addresses, resolved here on the node, each checked against `bounds`
    (an address out of them raises EgressError). An IPv6 entry is refused (the pool network is
    IPv4 only); a name that does not resolve allows nothing (logged)."""
    bounds = bounds or Bounds()
    allowed: dict[Allowed, None] = {}
    for entry in entries:
        host, port = split_entry(entry)
        try:
            if ipaddress.ip_address(host).version == 6:
                raise EgressError(
                    f"egress to {entry!r}: the pool network is IPv4 only, IPv6 is dropped",
                )
        except ValueError:
            pass  # a host name
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            log.warning("egress %r does not resolve on this node (%s): allows nothing", entry, exc)
            continue
        for info in infos:
            bounds.check(entry, host, info[4][0])
            allowed[Allowed(info[4][0], port)] = None
    return list(allowed)


def upstream_resolvers(resolv_conf: str = "/etc/resolv.conf") -> list[str]:
    """The node's IPv4 name servers the engine's resolver forwards to (loopback ones excepted:
    the engine reaches those from the host, not from the job's namespace)."""
    servers = []
    try:
        lines = Path(resolv_conf).read_text().splitlines()
    except OSError:
        return servers
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                address = ipaddress.ip_address(parts[1])
            except ValueError:
                continue
            if address.version == 4 and not address.is_loopback:
                servers.append(str(address))
    return servers


def rules(allowed: list[Allowed], resolvers: list[str]) -> list[list[str]]:
    """The IPv4 OUTPUT rules, in order (each an `iptables -A` argument list); REJECT last (a
    refused connection fails at once, for the job and for an input fetched in its namespace,
    rather than after a connect timeout)."""
    out = [
        ["-o", "lo", "-j", "ACCEPT"],
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
    ]
    for server in [DOCKER_RESOLVER, *resolvers]:
        for proto in ("udp", "tcp"):
            out.append(["-d", server, "-p", proto, "--dport", "53", "-j", "ACCEPT"])
    for rule in allowed:
        if rule.port is None:
            out.append(["-d", rule.ip, "-j", "ACCEPT"])
        else:
            out.append(["-d", rule.ip, "-p", "tcp", "--dport", str(rule.port), "-j", "ACCEPT"])
    out.append(["-j", "REJECT"])
    return out


def ingress_rules(ports, sources) -> list[list[str]]:
    """The IPv4 INPUT rules, in order: loopback and replies, then each published port from
    the job's `ingress_allow` sources (any source when it names none), then DROP: nothing else
    reaches the job, not even from the node's own bridge."""
    out = [
        ["-i", "lo", "-j", "ACCEPT"],
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
    ]
    for port in ports:
        for source in sources or [None]:
            rule = ["-p", "tcp", "--dport", str(port), "-j", "ACCEPT"]
            out.append(rule if source is None else ["-s", str(source), *rule])
    out.append(["-j", "DROP"])
    return out


def _run(pid: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-n", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def enforce(
    pid: int, entries, bounds: Bounds | None = None, *, ports=(), sources=()
) -> list[Allowed]:
    """Install the allow-list (and the ingress rules of `ports`, from `sources`) in the network
    namespace of process `pid`; what was allowed. Any failure raises EgressError: the caller
    starts nothing then."""
    problem = enforcement_problem()
    if problem:
        raise unenforceable(problem)
    allowed = resolve(entries, bounds)
    chains = [("OUTPUT", rule) for rule in rules(allowed, upstream_resolvers())]
    chains += [("INPUT", rule) for rule in ingress_rules(ports, sources)]
    for chain, rule in chains:
        done = _run(pid, "iptables", "-w", "5", "-A", chain, *rule)
        if done.returncode != 0:
            raise unenforceable(f"iptables {' '.join(rule)}: {done.stderr.strip()[:200]}")
    _drop_ipv6(pid)
    return allowed


def _drop_ipv6(pid: int) -> None:
    """No IPv6 out: ip6tables DROP when present, else IPv6 disabled in the namespace."""
    if shutil.which("ip6tables"):
        for chain, rule in [
            (chain, rule)
            for chain, lo in (("OUTPUT", "-o"), ("INPUT", "-i"))
            for rule in ([lo, "lo", "-j", "ACCEPT"], ["-j", "DROP"])
        ]:
            if _run(pid, "ip6tables", "-w", "5", "-A", chain, *rule).returncode != 0:
                break
        else:
            return
    if not Path("/proc/sys/net/ipv6").exists():
        return  # no IPv6 in this kernel
    done = _run(pid, "sysctl", "-w", "net.ipv6.conf.all.disable_ipv6=1")
    if done.returncode != 0:
        raise unenforceable(f"IPv6 could not be dropped: {done.stderr.strip()[:200]}")
