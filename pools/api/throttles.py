"""Placement searches rate-limited per tenant: POST /api/v1/jobs.

A DRF throttle (scope `placement`, rate `PLACEMENT_THROTTLE_RATE`, default "600/minute") keyed
by the tenant the request acts for. The view names that tenant (`placement_tenant(request)`)
only once it is known to be the requester's own, so nobody spends another tenant's budget;
a request that names no tenant of theirs is refused by validation anyway (no search is run).
Counts are fixed windows in Redis (`CACHES["throttle"]`, shared by every server process):
one atomic add + incr per request. When Redis cannot be reached the throttle is off (a logged
warning, then Redis is not asked again for RETRY_AFTER_OUTAGE_S): fail open, like sign-in.

Not on POST /api/v1/compute-leases: its two Redis round trips per grant cost the lease hot path
a third of its throughput at 64 clients (measured); a tenant's leases are bounded there by its
quota (leases, CPU, memory, GPUs) instead.
"""

import logging
import math
import time

from django.conf import settings
from django.core.cache import caches
from rest_framework.throttling import SimpleRateThrottle

log = logging.getLogger(__name__)

DEFAULT_RATE = "600/minute"
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
