"""Issue 9, high: a token never holds more than what minted it (scopes, lifetime, roles)."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from pools.choices import TokenScope
from pools.models import ApiToken
from pools.services import api_token_issue

READ, WRITE, OPERATE = TokenScope.READ, TokenScope.WRITE, TokenScope.OPERATE


def bearer(secret):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def mint(client, **body):
    return client.post("/api/v1/tokens/", {"name": "child"} | body, format="json")


def session_client(user):
    client = APIClient()
    client.force_login(user)
    return client


def test_a_write_only_token_cannot_mint_wider_scopes(operator, pool):
    _, secret = api_token_issue(user=operator, name="ci", scopes=[WRITE])
    response = mint(bearer(secret), scopes=[READ, WRITE, OPERATE], ttl_days=30)
    assert response.status_code == 400
    assert "operate" in response.json()["scopes"][0] and "read" in response.json()["scopes"][0]
    assert ApiToken.objects.filter(user=operator).count() == 1
    # The derived token cannot drain nodes either: no token with operate exists to do it.
    narrower = mint(bearer(secret), scopes=[WRITE], ttl_days=1)
    assert narrower.status_code == 201 and narrower.json()["scopes"] == [WRITE]


def test_a_token_minted_by_a_token_cannot_outlive_it(member):
    parent, secret = api_token_issue(
        user=member, name="short", scopes=[READ, WRITE], ttl=timedelta(days=10)
    )
    too_long = mint(bearer(secret), ttl_days=365)
    assert too_long.status_code == 400 and "ttl_days" in too_long.json()
    assert ApiToken.objects.filter(user=member).count() == 1
    ok = mint(bearer(secret), ttl_days=5)
    assert ok.status_code == 201
    child = ApiToken.objects.get(pk=ok.json()["id"])
    assert child.expires_at <= parent.expires_at
    # No lifetime asked for: the default, but never beyond the parent (the response says when).
    default = mint(bearer(secret))
    assert default.status_code == 201
    assert ApiToken.objects.get(pk=default.json()["id"]).expires_at == parent.expires_at


def test_default_scopes_are_narrowed_to_the_parent(member):
    _, secret = api_token_issue(user=member, name="w", scopes=[WRITE])
    response = mint(bearer(secret))
    assert response.status_code == 201 and response.json()["scopes"] == [WRITE]


def test_non_operators_cannot_mint_operate_with_a_session_or_a_token(member, operator):
    refused = mint(session_client(member), scopes=[READ, OPERATE])
    assert refused.status_code == 400
    assert "operators" in refused.json()["scopes"][0]
    with pytest.raises(ValidationError):
        api_token_issue(user=member, name="x", scopes=[OPERATE])
    assert not ApiToken.objects.filter(user=member).exists()
    allowed = mint(session_client(operator), scopes=[READ, OPERATE])
    assert allowed.status_code == 201 and allowed.json()["scopes"] == [OPERATE, READ]


def test_empty_scopes_are_refused_and_duplicates_collapse(member):
    client = session_client(member)
    empty = mint(client, scopes=[])
    assert empty.status_code == 400 and "scopes" in empty.json()
    assert not ApiToken.objects.filter(user=member).exists()
    twice = mint(client, scopes=[READ, READ])
    assert twice.status_code == 201 and twice.json()["scopes"] == [READ]
    absent = mint(client)
    # absent: every scope but operate, logs:read and outputs:read named (#17)
    assert absent.status_code == 201
    assert absent.json()["scopes"] == ["logs:read", "outputs:read", READ, WRITE]


def test_console_offers_operate_to_operators_only(member, operator):
    body = {"name": "ops", "scopes": [OPERATE], "ttl_days": 7}
    client = Client()
    client.force_login(member)
    page = client.post("/console/tokens", body)
    assert page.status_code == 200 and 'value="operate"' not in page.content.decode()
    assert not ApiToken.objects.filter(user=member).exists()
    client.force_login(operator)
    assert 'value="operate"' in client.get("/console/tokens").content.decode()
    page = client.post("/console/tokens", body)
    assert page.status_code == 200 and 'id="new-secret"' in page.content.decode()
    assert ApiToken.objects.get(user=operator, name="ops").scopes == [OPERATE]
