"""Who may read /metrics (docs/observability.md, "Who may scrape"): a token with the
`metrics:read` scope (a scrape token an operator made), an operator (their session, or a token
of theirs with `read`), or a client whose address is in METRICS_ALLOWED_CIDRS. Everyone else
gets 403, signed in or not."""

from __future__ import annotations

import ipaddress
from functools import cache

from django.conf import settings
from rest_framework.exceptions import AuthenticationFailed

from pools.actors import Actor
from pools.authentication import ApiTokenAuthentication
from pools.choices import TokenScope


@cache
def _networks(cidrs: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip())


def _within(address: str, cidrs) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in network for network in _networks(tuple(cidrs)))


def client_address(request) -> str:
    """The client's address: REMOTE_ADDR, unless that is a trusted proxy (TRUSTED_PROXY_CIDRS):
    then the last address of X-Forwarded-For that is not one (the proxies append; whatever a
    client wrote itself is further left and never read)."""
    address = request.META.get("REMOTE_ADDR", "")
    if not _within(address, settings.TRUSTED_PROXY_CIDRS):
        return address
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    for hop in reversed([h for h in hops if h]):
        if not _within(hop, settings.TRUSTED_PROXY_CIDRS):
            return hop
    return address


def refusal(request) -> str:
    """Why this request may not read the metrics; "" when it may."""
    try:
        authenticated = ApiTokenAuthentication().authenticate(request)
    except AuthenticationFailed as failed:
        return str(failed.detail)
    if authenticated is not None:
        user, token = authenticated
        if token.allows(TokenScope.METRICS_READ):
            return ""
        if Actor.for_user(user).is_operator and token.allows(TokenScope.READ):
            return ""
        return "This token needs the metrics:read scope (or to be an operator's, with read)."
    if Actor.from_request(request).is_operator:
        return ""
    if _within(client_address(request), settings.METRICS_ALLOWED_CIDRS):
        return ""
    return "Metrics are for operators, scrape tokens (metrics:read) and METRICS_ALLOWED_CIDRS."
