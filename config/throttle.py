"""Failed sign-ins are counted in Redis (cache alias "throttle"), so all server processes count
together. Used for the console login and the Django admin login (config/urls.py).

- PAIR_LIMIT failures of one username from one address within WINDOW_S lock that pair;
- IP_LIMIT failures from one address, whatever the usernames, lock the address;
- a lock lasts LOCK_S and refuses even the right password (HTTP 429).
A username is never locked for every address: that would let anyone lock a person out.
When Redis cannot be reached, sign-in fails open (a logged warning), never locks everyone out.
"""

import hashlib
import logging
import math
import time
from functools import wraps

from django.core.cache import caches
from django.shortcuts import render

log = logging.getLogger(__name__)

PAIR_LIMIT = 10
IP_LIMIT = 30
WINDOW_S = 300
LOCK_S = 900


def _counters(request, username: str) -> list[tuple[str, int]]:
    # REMOTE_ADDR, not X-Forwarded-For: a client sets that header to whatever it likes.
    address = request.META.get("REMOTE_ADDR", "")
    name = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    return [(f"login:{address}:{name}", PAIR_LIMIT), (f"login:{address}", IP_LIMIT)]


def seconds_locked(request, username: str) -> int:
    """Seconds left on the longest lock that applies; 0 when none (or Redis is unreachable)."""
    try:
        locks = caches["throttle"].get_many(
            [f"{key}:lock" for key, _ in _counters(request, username)]
        )
    except Exception as exc:  # fail open: an unreachable Redis must not lock everyone out
        log.warning("login throttle off, Redis unreachable: %s", exc)
        return 0
    return max((math.ceil(until - time.time()) for until in locks.values()), default=0)


def record(request, username: str, *, success: bool) -> None:
    cache = caches["throttle"]
    counters = _counters(request, username)
    try:
        if success:  # only the pair restarts; the address keeps counting other names
            cache.delete(counters[0][0])
            return
        for key, limit in counters:
            cache.add(key, 0, WINDOW_S)  # the window starts at the first failure
            if cache.incr(key) >= limit:
                cache.set(f"{key}:lock", time.time() + LOCK_S, LOCK_S)
    except Exception as exc:
        log.warning("login throttle off, Redis unreachable: %s", exc)


def throttled_login(view):
    """Wrap a login view: refuse while locked, count what did not sign in."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method != "POST":
            return view(request, *args, **kwargs)
        username = request.POST.get("username", "")
        wait = seconds_locked(request, username)
        if wait > 0:
            context = {"minutes": math.ceil(wait / 60)}
            response = render(request, "registration/throttled.html", context, status=429)
            response["Retry-After"] = str(wait)
            return response
        response = view(request, *args, **kwargs)
        # Both login views redirect after signing in and show the form again otherwise.
        success = response.status_code == 302 and request.user.is_authenticated
        record(request, username, success=success)
        return response

    return wrapper
