"""API token authentication for people: `Authorization: Bearer cpu_…`, looked up by digest.

A successful lookup is cached in-process for `API_TOKEN_AUTH_CACHE_SECONDS` (default 5 s):
digest → (token, user). A token revoked, expired or whose user was deactivated is therefore
refused at the latest that many seconds later by every server process — at once in the process
that revokes it (`api_token_revoke` reloads the token: a token loaded with `revoked_at` set is
dropped from the cache) or saves the token or the user through the ORM. Expiry is re-checked
on every request against the cached expiry time. Only successes are cached: an unknown or
refused secret is looked up every time. Each request gets its own copy of the user, without
the role caches of `pools.roles`, so roles and memberships are read fresh per request.
"""

import copy
import threading
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_init, post_save
from django.dispatch import receiver
from django.utils import timezone
from rest_framework import authentication, exceptions

from .models import ApiToken, token_digest

DEFAULT_CACHE_SECONDS = 5.0
_MAX_ENTRIES = 10_000
_ROLE_CACHES = ("_platform_roles", "_tenant_roles")

_clock = time.monotonic  # tests move it forward
_cache: dict[str, tuple[float, ApiToken]] = {}  # digest → (cached at, token with its user)
_lock = threading.Lock()


def cache_seconds() -> float:
    return float(getattr(settings, "API_TOKEN_AUTH_CACHE_SECONDS", DEFAULT_CACHE_SECONDS))


def forget_tokens() -> None:
    """Drop every cached token of this process."""
    with _lock:
        _cache.clear()


@receiver([post_save, post_delete], sender=ApiToken)
def _forget_token(sender, instance, **kwargs):
    with _lock:
        _cache.pop(instance.digest, None)


@receiver(post_init, sender=ApiToken)
def _forget_revoked_token(sender, instance, **kwargs):
    # `revoked_at` not in __dict__: a deferred field (not loaded), nothing to learn
    if instance.__dict__.get("revoked_at") is not None and instance.pk is not None:
        with _lock:
            for digest in [d for d, (_, t) in _cache.items() if t.pk == instance.pk]:
                _cache.pop(digest, None)


@receiver([post_save, post_delete], sender=get_user_model())
def _forget_user_tokens(sender, instance, **kwargs):
    with _lock:
        for digest in [d for d, (_, t) in _cache.items() if t.user_id == instance.pk]:
            _cache.pop(digest, None)


def _lookup(digest: str) -> ApiToken | None:
    ttl = cache_seconds()
    now = _clock()
    hit = _cache.get(digest)
    if hit is not None and now - hit[0] < ttl:
        return hit[1]
    token = ApiToken.objects.select_related("user").filter(digest=digest).first()
    if token is not None and ttl > 0:
        with _lock:
            if len(_cache) >= _MAX_ENTRIES:
                _cache.clear()
            _cache[digest] = (now, token)
    return token


def _request_user(user):
    """A per-request copy of the cached user, without the role caches."""
    user = copy.copy(user)
    for name in _ROLE_CACHES:
        user.__dict__.pop(name, None)
    return user


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"
    prefix = "cpu_"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, secret = header.partition(" ")
        if scheme != self.keyword or not secret.startswith(self.prefix):
            return None  # not ours; another authenticator (node credential, session) may match
        digest = token_digest(secret.strip())
        token = _lookup(digest)
        now = timezone.now()
        if token is None or not token.is_valid(now) or not token.user.is_active:
            with _lock:
                _cache.pop(digest, None)
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        # Update last use at most once a minute, so a busy token does not write every request.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return _request_user(token.user), token

    def authenticate_header(self, request):
        return self.keyword
