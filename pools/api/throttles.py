"""Placement searches rate-limited per tenant: POST /api/v1/jobs.

A DRF throttle (scope `placement`, rate `PLACEMENT_THROTTLE_RATE`, default "600/minute") keyed
by the tenant the request acts for. The view names that tenant (`placement_tenant(request)`)
only once it is known to be the requester's own, so nobody spends another tenant's budget;
a request that names no tenant of theirs is refused by validation anyway (no search is run).
Counts are fixed windows in Redis (`CACHES["throttle"]`, shared by every server process):
one atomic add + incr per request. When Redis cannot be reached the throttle is off (a logged
warning, then Redis is not asked again for RETRY_AFTER_OUTAGE_S): fail open, like sign-in.

POST /api/v1/compute-leases is the hot path: two Redis round trips per grant cost it a third of
its throughput at 64 clients (measured). There `SharedPermits` limits each tenant
(`LEASE_THROTTLE_RATE`) with permits taken from Redis in batches, and `TokenThrottle` limits each
token (`TOKEN_THROTTLE_RATE`) the same way on lease creation, job submit and explain.
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
_outage_until = 0.0  # per process: while Redis is down, do not pay its timeout on every request


class PlacementThrottle(SimpleRateThrottle):
    scope = "placement"

    def __init__(self):
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self._wait = 0.0

    def get_rate(self):
        return getattr(settings, "PLACEMENT_THROTTLE_RATE", DEFAULT_RATE) or None

    def get_cache_key(self, request, view):
        tenant_of = getattr(view, "placement_tenant", None)
        tenant = tenant_of(request) if tenant_of else None
        return None if tenant is None else f"placement:{tenant.pk}"

    def allow_request(self, request, view):
        global _outage_until
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None or time.monotonic() < _outage_until:
            return True
        now = time.time()
        window = int(now // self.duration)
        key = f"{key}:{window}"
        cache = caches["throttle"]
        try:
            cache.add(key, 0, self.duration + 1)
            count = cache.incr(key)
        except Exception as exc:  # fail open: an unreachable Redis must not stop all placement
            _outage_until = time.monotonic() + RETRY_AFTER_OUTAGE_S
            log.warning("placement throttle off, Redis unreachable: %s", exc)
            return True
        if count <= self.num_requests:
            return True
        self._wait = (window + 1) * self.duration - now
        return False

    def wait(self):
        return max(1, math.ceil(self._wait))


# --- lease creation per tenant, expensive calls per token: permits taken in batches ------------


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
            log.warning("lease/token throttle off, Redis unreachable: %s", exc)
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
