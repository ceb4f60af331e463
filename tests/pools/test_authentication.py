"""API token authentication is cached per process for a few seconds (API_TOKEN_AUTH_CACHE_SECONDS):
a token revoked elsewhere (another process, a plain UPDATE) is refused at the latest after that."""

from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.test import APIClient

from pools import authentication
from pools.models import ApiToken
from pools.services import api_token_issue, api_token_revoke

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_cache(settings):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 5
    authentication.forget_tokens()
    yield
    authentication.forget_tokens()


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(authentication, "_clock", lambda: now[0])
    return now


def client_with(secret):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_revoked_elsewhere_is_refused_after_the_ttl(member, clock):
    token, secret = api_token_issue(user=member, name="t")
    client = client_with(secret)
    assert client.get("/api/v1/me").status_code == 200
    # revoked by another process: no signal here, the cached entry stays until its TTL ends
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    clock[0] += 4.9
    assert client.get("/api/v1/me").status_code == 200
    clock[0] += 0.2
    assert client.get("/api/v1/me").status_code == 401
    assert client.get("/api/v1/me").status_code == 401  # refusals are never cached


def test_revoked_in_this_process_is_refused_at_once(member, clock):
    token, secret = api_token_issue(user=member, name="t")
    client = client_with(secret)
    assert client.get("/api/v1/me").status_code == 200
    api_token_revoke(token=token)
    assert client.get("/api/v1/me").status_code == 401


def test_expiry_is_checked_on_every_request(member, clock):
    token, secret = api_token_issue(user=member, name="t", ttl=timedelta(seconds=60))
    client = client_with(secret)
    assert client.get("/api/v1/me").status_code == 200
    cached = authentication._cache[token.digest][1]
    cached.expires_at = timezone.now() - timedelta(seconds=1)  # as if time had passed
    assert client.get("/api/v1/me").status_code == 401


def test_deactivated_user_is_refused_after_the_ttl(member, clock):
    _, secret = api_token_issue(user=member, name="t")
    client = client_with(secret)
    assert client.get("/api/v1/me").status_code == 200
    type(member).objects.filter(pk=member.pk).update(is_active=False)  # no signal
    clock[0] += 5.1
    assert client.get("/api/v1/me").status_code == 401


def test_user_saved_in_this_process_is_reloaded(member, clock):
    _, secret = api_token_issue(user=member, name="t")
    client = client_with(secret)
    assert client.get("/api/v1/me").status_code == 200
    member.is_active = False
    member.save()
    assert client.get("/api/v1/me").status_code == 401


def test_each_request_gets_its_own_user_without_role_caches(member, clock):
    _, secret = api_token_issue(user=member, name="t")
    auth = authentication.ApiTokenAuthentication()

    request = RequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    first, token = auth.authenticate(request)
    first._platform_roles = frozenset({"operator"})
    second, same_token = auth.authenticate(request)
    assert second is not first and same_token is token
    assert not hasattr(second, "_platform_roles")


def test_unknown_and_disabled_cache_look_up_every_time(member, settings):
    client = client_with("cpu_not-a-real-token")
    assert client.get("/api/v1/me").status_code == 401
    assert authentication._cache == {}
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 0
    _, secret = api_token_issue(user=member, name="t")
    assert client_with(secret).get("/api/v1/me").status_code == 200
    assert authentication._cache == {}
