"""What a job may make anything reach, as the control plane judges it at submit and tells the
agent in each assignment (docs/security.md, "Networks a job may reach").

The address rules are the agent's own table (worker_agent/addresses.py: one definition, which
the agent applies again after DNS at fetch time and when it installs the egress rules); here
they meet the pool's knobs (`private_ranges_allowed`, `egress_allowed`, `ingress_address`) and
the addresses the control plane knows: its own interfaces and `ALLOWED_HOSTS` addresses, and
the addresses its nodes have published routes on. A host name is not looked up here (the node
resolves it, and checks what it finds): only literal addresses and the loopback's names are
refused at submit.

Inputs the control plane makes itself (presigned objects of a registered object store,
`OBJECT_STORE_ENDPOINTS`) carry `"presigned": true`; `presigned_input` is the only way to make
one, the submit body can never carry the key, and an assignment keeps the mark only for a URL
on an endpoint registered now.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from django.conf import settings

from leases.models import Lease
from pools.knobs import PoolKnobs, knobs_for
from worker_agent import addresses

NODE_ROUTES_MAX = 256
NODE_ROUTES_TTL_S = 30.0
_node_routes: dict[int, tuple[float, list[str]]] = {}  # pool id → (when read, addresses)


def control_plane_addresses() -> list[str]:
    """The control plane's own addresses: this machine's interfaces and the addresses among
    `ALLOWED_HOSTS` (the names it answers to)."""
    found = [str(net.network_address) for _, net in addresses.host_networks("")]
    for host in settings.ALLOWED_HOSTS:
        literal = addresses.ip_literal(host)
        if literal is not None:
            found.append(str(literal))
    return list(dict.fromkeys(found))


def node_addresses(pool) -> list[str]:
    """The addresses the pool's nodes have published routes on (what the control plane knows
    of them; each agent adds its own interfaces). Read at most every NODE_ROUTES_TTL_S per pool
    and process: every agent's poll for its assignments asks."""
    now = time.monotonic()
    cached = _node_routes.get(pool.pk)
    if cached is not None and now - cached[0] < NODE_ROUTES_TTL_S:
        return cached[1]
    found = _node_routes_now(pool)
    _node_routes[pool.pk] = (now, found)
    return found


def _node_routes_now(pool) -> list[str]:
    hosts = (
        Lease.objects.filter(node__pool=pool)
        .exclude(route={})
        .order_by()
        .values_list("route__host", flat=True)
        .distinct()[:NODE_ROUTES_MAX]
    )
    found = []
    for host in hosts:
        literal = addresses.ip_literal(str(host or ""))
        if literal is not None:
            found.append(str(literal))
    return found


def refused(pool) -> list[tuple[str, object]]:
    """(why, network) pairs of the addresses the control plane knows to refuse."""
    pairs = [("the control plane's address", a) for a in control_plane_addresses()]
    pairs += [("a node's address", a) for a in node_addresses(pool)]
    return [(why, net) for why, address in pairs for net in addresses.networks([address])]


def _address_problem(host: str, knobs: PoolKnobs, refused_pairs) -> str | None:
    if problem := addresses.host_refusal(host):
        return problem
    literal = addresses.ip_literal(host)
    if literal is None:
        return None
    return addresses.refusal(
        literal, private_allowed=knobs.private_ranges_allowed, refused=refused_pairs
    )


def input_errors(pool, inputs: list[dict]) -> dict:
    """{index: {"url": [message]}} for each input whose URL names a refused address."""
    if not inputs:
        return {}
    knobs, refused_pairs = knobs_for(pool), refused(pool)
    errors = {}
    for index, item in enumerate(inputs):
        if item["url"].startswith("s3://"):  # a registered bucket, presigned (object_store.py)
            continue
        host = urlsplit(item["url"]).hostname or ""
        if problem := _address_problem(host, knobs, refused_pairs):
            errors[str(index)] = {"url": [f"{problem}."]}
    return errors


def egress_errors(pool, policy: dict) -> dict:
    """{"egress_allow": {index: [message]}} for each entry that names a refused address or lies
    outside the pool's `egress_allowed` (CIDRs contain addresses; names are listed by name)."""
    entries = policy.get("egress_allow") or []
    if not entries:
        return {}
    knobs, refused_pairs = knobs_for(pool), refused(pool)
    nets, names = [], set()
    for entry in knobs.egress_allowed:
        try:
            nets.extend(addresses.networks([entry]))
        except ValueError:
            names.add(str(entry).rstrip(".").lower())
    errors = {}
    for index, entry in enumerate(entries):
        host = _entry_host(entry)
        literal = addresses.ip_literal(host)
        problem = _address_problem(host, knobs, refused_pairs)
        if problem is None and literal is not None and not addresses.within(literal, nets):
            problem = f"{literal} is outside the pool's egress_allowed"
        if problem is None and literal is None and host.rstrip(".").lower() not in names:
            problem = f"{host} is not a name the pool's egress_allowed lists"
        if problem:
            errors[str(index)] = [f"{problem}."]
    return {"egress_allow": errors} if errors else {}


def _entry_host(entry: str) -> str:
    """The host of an egress entry: `host[:port]` or `[IPv6][:port]`."""
    if entry.startswith("["):
        return entry[1:].partition("]")[0]
    return entry.rpartition(":")[0] if ":" in entry else entry


def object_store_origins() -> list[str]:
    return [_origin(endpoint) for endpoint in settings.OBJECT_STORE_ENDPOINTS]


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}".lower()


def presigned_input(url: str, name: str) -> dict:
    """An input the control plane presigned on a registered object store (exempt from the
    loopback rule on the agent); a URL on no registered endpoint raises ValueError."""
    if _origin(url) not in object_store_origins():
        raise ValueError(f"{url[:100]!r} is on no endpoint of OBJECT_STORE_ENDPOINTS")
    return {"url": url, "name": name, "presigned": True}


def assignment_inputs(inputs: list[dict], presign=None) -> list[dict]:
    """A job's inputs as the agent gets them: the presigned mark kept only on a URL of an
    endpoint registered now; an `s3://bucket/key` input of the tenant's registered bucket
    becomes its presigned GET through `presign(url)` (jobs/object_store.py `input_presigner`),
    marked presigned when its endpoint is registered (and without `presign`, left out)."""
    origins = set(object_store_origins())
    out = []
    for item in inputs or ():
        if item["url"].startswith("s3://"):
            if presign is not None:
                signed = presign(item["url"])  # None: its bucket is gone (the job fails)
                if signed and _origin(signed) in origins:
                    out.append(presigned_input(signed, item["name"]))
            continue
        entry = {"url": item["url"], "name": item["name"]}
        if item.get("presigned") is True and _origin(item["url"]) in origins:
            entry["presigned"] = True
        out.append(entry)
    return out


def pool_network(pool) -> dict:
    """The assignment's `pool_network` (docs/data-plane.md)."""
    knobs = knobs_for(pool)
    return {
        "private_ranges_allowed": knobs.private_ranges_allowed,
        "egress_allowed": list(knobs.egress_allowed),
        "ingress_address": knobs.ingress_address,
        "refused": [str(net) for _, net in refused(pool)],
        "object_store_endpoints": list(settings.OBJECT_STORE_ENDPOINTS),
    }
