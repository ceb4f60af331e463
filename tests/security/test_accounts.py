"""Issue 9, low: sign-in is throttled; adding a member reveals nothing about who exists."""

import logging
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from config.builders import build_person
from pools.choices import TenantRole
from pools.models import Membership

MEMBERS_URL = "/api/v1/tenants/vision/members/"


# --- membership: no user enumeration, no platform roles in tenants -------------------------


def add_member(client, username, role=TenantRole.MEMBER):
    return client.post(MEMBERS_URL, {"user": username, "role": role}, format="json")


def test_adding_a_member_answers_the_same_whether_or_not_the_user_exists(
    api, tenant_admin, outsider
):
    client = api(tenant_admin)
    existing = add_member(client, "outsider")
    missing = add_member(client, "nobody-by-this-name")
    inactive_user = build_person("gone")
    get_user_model().objects.filter(pk=inactive_user.pk).update(is_active=False)
    inactive = add_member(client, "gone")
    assert existing.status_code == missing.status_code == inactive.status_code == 202
    assert existing.json()["detail"] == missing.json()["detail"] == inactive.json()["detail"]
    assert Membership.objects.filter(user=outsider, tenant__slug="vision").exists()
    assert not Membership.objects.filter(user=inactive_user).exists()


def test_platform_operators_and_policy_admins_are_not_added_and_that_does_not_show(
    api, tenant_admin, operator, policy_admin
):
    client = api(tenant_admin)
    missing = add_member(client, "nobody-by-this-name")
    for person in (operator, policy_admin):
        response = add_member(client, person.username, TenantRole.ADMIN)
        assert (response.status_code, response.json()) == (202, missing.json())
        assert not Membership.objects.filter(user=person).exists()


# --- sign-in throttle --------------------------------------------------------------------


@pytest.fixture
def person(db):
    """A person with a unique name, so counters left in Redis by earlier runs never match."""
    username = f"p-{uuid.uuid4().hex[:10]}"
    build_person(username)
    return username


def client_from(ip=None):
    return Client(REMOTE_ADDR=ip or f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.7")


def sign_in(client, url, username, password):
    return client.post(url, {"username": username, "password": password})


def signed_in(client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
def test_ten_wrong_passwords_lock_that_username_from_that_address(person, url):
    client = client_from()
    for _ in range(10):
        assert sign_in(client, url, person, "wrong").status_code == 200
    locked = sign_in(client, url, person, f"pw-{person}")
    assert locked.status_code == 429
    assert "Too many failed sign-ins" in locked.content.decode()
    assert int(locked["Retry-After"]) > 0
    assert not signed_in(client)
    # Another address is not locked out of the same account (no lock-out of the victim).
    other = client_from()
    assert sign_in(other, "/accounts/login/", person, f"pw-{person}").status_code == 302
    assert signed_in(other)


def test_a_looser_limit_per_address_across_usernames(person):
    client = client_from()
    for i in range(30):
        sign_in(client, "/accounts/login/", f"guess-{i}-{person}", "wrong")
    locked = sign_in(client, "/accounts/login/", person, f"pw-{person}")
    assert locked.status_code == 429 and not signed_in(client)


def test_a_successful_sign_in_before_the_limit_starts_the_count_again(person):
    client = client_from()
    for _ in range(9):
        sign_in(client, "/accounts/login/", person, "wrong")
    assert sign_in(client, "/accounts/login/", person, f"pw-{person}").status_code == 302
    client.logout()
    for _ in range(9):
        sign_in(client, "/accounts/login/", person, "wrong")
    assert sign_in(client, "/accounts/login/", person, f"pw-{person}").status_code == 302


def test_without_redis_sign_in_fails_open_with_a_warning(person, settings, caplog):
    settings.CACHES = settings.CACHES | {
        "throttle": settings.CACHES["throttle"] | {"LOCATION": "redis://127.0.0.1:1/0"}
    }
    client = client_from()
    with caplog.at_level(logging.WARNING):
        for _ in range(12):
            sign_in(client, "/accounts/login/", person, "wrong")
        assert sign_in(client, "/accounts/login/", person, f"pw-{person}").status_code == 302
    assert "throttle" in caplog.text.lower()
