"""Placement searches rate-limited per tenant: POST /api/v1/jobs.

Every limit here is a fixed window counted in Redis (`CACHES["throttle"]`, shared by every
server process) through `SharedPermits`: a process takes permits from the shared counter in
batches (one round trip per batch, not per request) and spends them locally, so the lease hot
path does not pay a Redis round trip per grant. When Redis cannot be reached a limit is off (a
logged warning, then Redis is not asked again for RETRY_AFTER_OUTAGE_S): fail open, like sign-in.

- placement searches per tenant (`PLACEMENT_THROTTLE_RATE`, default 600/minute): job submit,
  explain, the console's submit and preview (`check_placement_rate`, `PlacementThrottle`). The
  tenant is named only once it is known to be the requester's own, so nobody spends another
  tenant's budget; a request naming no tenant of theirs is refused by validation (no search);
- lease creation per tenant (`LEASE_THROTTLE_RATE`, `check_lease_rate`);
- expensive calls per token (`TOKEN_THROTTLE_RATE`, `TokenThrottle`): lease creation, job
  submit, explain.
"""

import logging
import math
import threading
import time

from django.conf import settings
from django.core.cache import caches
from rest_framework.exceptions import Throttled
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from pools.models import ApiToken

log = logging.getLogger(__name__)

DEFAULT_RATE = "600/minute"
DEFAULT_LEASE_RATE = "6000/minute"  # per tenant: POST /compute-leases
DEFAULT_TOKEN_RATE = "6000/minute"  # per token: lease creation, job submit, explain
RETRY_AFTER_OUTAGE_S = 5.0


class SharedPermits:
    """Fixed-window permits shared by every server process through one Redis counter per key and
    window, without a Redis round trip per request: a process takes a small batch of permits
    (one pipelined INCRBY + EXPIRE) and spends them locally. A batch is granted only as far as the
    counter stays within the limit, so all processes together never admit more than the limit in
    a window: no overshoot. The price is the other way: permits a process took and has not spent
    are not the others', so a key may be refused up to processes × (batch − 1) requests early.
    A batch is 1 (exact) for limits up to BATCH_DIVISOR a window, at most BATCH_MAX. Once the
    counter is spent a process refuses until the window ends without asking Redis again, so a
    flood of refused requests costs Redis nothing. Redis unreachable: fail open, as above."""

    BATCH_MAX = 20
    BATCH_DIVISOR = 100
    MAX_KEYS = 10_000  # local state of past windows is dropped beyond this many keys

    def __init__(self):
        self._lock = threading.Lock()
        self._local: dict[str, list] = {}  # key → [window, permits left, counter spent]
        self._outage_until = 0.0  # while Redis is down, do not pay its timeout on every request

    @classmethod
    def batch_for(cls, limit: int) -> int:
        return max(1, min(cls.BATCH_MAX, limit // cls.BATCH_DIVISOR))

    def wait(self, key: str, limit: int, duration: int) -> float:
        """0 when a permit is granted, else the seconds until the window ends."""
        now = time.time()
        window = int(now // duration)
        left = (window + 1) * duration - now
        with self._lock:
            state = self._local.get(key)
            if state is not None and state[0] == window:
                if state[1] > 0:
                    state[1] -= 1
                    return 0.0
                if state[2]:
                    return left
        granted = self._take(key, window, limit, duration)  # outside the lock: a round trip
        if granted is None:
            return 0.0
        with self._lock:
            state = self._local.get(key)
            if state is None or state[0] != window:
                if len(self._local) >= self.MAX_KEYS:
                    self._local = {k: s for k, s in self._local.items() if s[0] == window}
                state = self._local[key] = [window, 0, False]
            state[1] += granted
            state[2] = granted < self.batch_for(limit)
            if state[1] > 0:
                state[1] -= 1
                return 0.0
        return left

    def _take(self, key: str, window: int, limit: int, duration: int) -> int | None:
        """Permits granted from the shared counter (0: it is spent); None: Redis unreachable."""
        if time.monotonic() < self._outage_until:
            return None
        batch = self.batch_for(limit)
        cache = caches["throttle"]
        redis_key = cache.make_and_validate_key(f"{key}:{window}")
        try:
            # one round trip; Django's cache API has no INCRBY with an expiry, its client has
            client = cache._cache.get_client(redis_key, write=True)
            taken = client.pipeline().incrby(redis_key, batch).expire(redis_key, duration + 1)
            taken = taken.execute()[0]
        except Exception as exc:  # fail open: an unreachable Redis must not stop all leases
            self._outage_until = time.monotonic() + RETRY_AFTER_OUTAGE_S
            log.warning("throttle off (placement, lease, token), Redis unreachable: %s", exc)
            return None
        return max(0, min(batch, limit - (taken - batch)))


PERMITS = SharedPermits()  # one per server process


def _rate(name: str, default: str) -> tuple[int, int] | None:
    """(requests, seconds) of a rate setting such as "6000/minute"; None: "" turns it off."""
    value = getattr(settings, name, default)
    return SimpleRateThrottle.parse_rate(None, value) if value else None


def _permit_wait(key: str, rate: tuple[int, int] | None) -> int:
    if rate is None:
        return 0
    wait = PERMITS.wait(key, *rate)
    return max(1, math.ceil(wait)) if wait else 0


def check_placement_rate(tenant) -> None:
    """A placement search for `tenant` (job submit, explain, the console's preview), once the
    tenant is known to be the requester's own: a permit of its `PLACEMENT_THROTTLE_RATE`, else
    429 `throttled` with Retry-After."""
    if wait := placement_wait(tenant):
        raise Throttled(wait=wait)


def placement_wait(tenant) -> int:
    return _permit_wait(f"placement:{tenant.pk}", _rate("PLACEMENT_THROTTLE_RATE", DEFAULT_RATE))


class PlacementThrottle(BaseThrottle):
    """`check_placement_rate` as a DRF throttle: the view names the tenant a request acts for
    (`placement_tenant(request)`, None when it is not the requester's own or not a search)."""

    def __init__(self):
        self._wait = 0

    def allow_request(self, request, view):
        tenant_of = getattr(view, "placement_tenant", None)
        tenant = tenant_of(request) if tenant_of else None
        self._wait = placement_wait(tenant) if tenant is not None else 0
        return not self._wait

    def wait(self):
        return self._wait


def check_lease_rate(tenant) -> None:
    """POST /compute-leases, once the tenant is known to be the requester's own: a permit of
    the tenant's `LEASE_THROTTLE_RATE`, else 429 `throttled` with Retry-After."""
    wait = _permit_wait(f"lease:{tenant.pk}", _rate("LEASE_THROTTLE_RATE", DEFAULT_LEASE_RATE))
    if wait:
        raise Throttled(wait=wait)


class TokenThrottle(BaseThrottle):
    """`TOKEN_THROTTLE_RATE` per token (a browser session: per person) on a view's expensive
    actions (lease creation, job submit, explain); the view's other actions are not counted."""

    EXPENSIVE_ACTIONS = ("create", "explain")

    def __init__(self):
        self._wait = 0

    def allow_request(self, request, view):
        if getattr(view, "action", None) not in self.EXPENSIVE_ACTIONS:
            return True
        token = request.auth if isinstance(request.auth, ApiToken) else None
        user_id = getattr(request.user, "pk", None)
        if token is None and user_id is None:
            return True  # a node or nobody: refused by the permissions already
        key = f"token:{token.pk}" if token else f"user:{user_id}"
        self._wait = _permit_wait(key, _rate("TOKEN_THROTTLE_RATE", DEFAULT_TOKEN_RATE))
        return not self._wait

    def wait(self):
        return self._wait
