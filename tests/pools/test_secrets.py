"""Tenant secrets: members see the names, tenant admins set and delete them, nobody ever gets a
value back (secrets API, job listings, events)."""

import pytest

from config.builders import build_secret, submit_job
from pools.models import TenantSecret

VALUE = "ghp_this-must-never-be-shown"


def url(slug="vision", name=""):
    return f"/api/v1/tenants/{slug}/secrets" + (f"/{name}" if name else "")


def test_admin_creates_and_replaces_and_nobody_sees_the_value(api, tenant_admin, member, tenant):
    admin = api(tenant_admin)
    created = admin.post(url(), {"name": "gh-token", "value": VALUE}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["name"] == "gh-token" and "value" not in created.json()
    replaced = admin.post(url(), {"name": "gh-token", "value": VALUE + "2"}, format="json")
    assert replaced.status_code == 201
    assert TenantSecret.objects.get(tenant=tenant, name="gh-token").reveal() == VALUE + "2"
    for client in (admin, api(member)):
        listing = client.get(url())
        assert listing.status_code == 200
        assert [s["name"] for s in listing.json()] == ["gh-token"]
        assert VALUE not in listing.content.decode()


def test_members_cannot_set_or_delete(api, member, tenant):
    build_secret(tenant, "kept")
    client = api(member)
    assert client.post(url(), {"name": "x", "value": "y"}, format="json").status_code == 403
    assert client.delete(url(name="kept")).status_code == 403
    assert TenantSecret.objects.filter(name="kept").exists()


def test_admin_deletes_one_by_name(api, tenant_admin, tenant):
    build_secret(tenant, "old")
    build_secret(tenant, "kept")
    client = api(tenant_admin)
    assert client.delete(url(name="old")).status_code == 204
    assert client.delete(url(name="old")).status_code == 404
    assert [s["name"] for s in client.get(url()).json()] == ["kept"]


def test_other_tenants_see_nothing(api, outsider, tenant):
    build_secret(tenant, "theirs")
    client = api(outsider)
    assert client.get(url()).status_code == 404
    assert client.post(url(), {"name": "x", "value": "y"}, format="json").status_code == 404
    assert client.delete(url(name="theirs")).status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"name": "has space", "value": "v"},
        {"name": "a" * 101, "value": "v"},
        {"name": "ok", "value": ""},
        {"name": "ok", "value": "x" * (64 * 1024 + 1)},
        {"name": "ok", "value": ["not", "text"]},
        {"name": "ok"},
    ],
)
def test_bad_secrets_get_field_errors(api, tenant_admin, body):
    response = api(tenant_admin).post(url(), body, format="json")
    assert response.status_code == 400, response.json()
    assert set(response.json()) & {"name", "value"}
    assert not TenantSecret.objects.exists()


def test_a_value_at_the_limit_is_accepted(api, tenant_admin):
    body = {"name": "big", "value": "x" * (64 * 1024)}
    assert api(tenant_admin).post(url(), body, format="json").status_code == 201


def test_jobs_and_their_events_show_the_name_not_the_value(api, member, pool, tenant):
    build_secret(tenant, "gh-token", VALUE)
    job = submit_job(pool, tenant, secrets={"GH_TOKEN": "gh-token"})
    client = api(member)
    for path in ("/api/v1/jobs/", f"/api/v1/jobs/{job.pk}/", f"/api/v1/jobs/{job.pk}/events/"):
        response = client.get(path)
        assert response.status_code == 200
        assert VALUE not in response.content.decode(), path
    assert client.get(f"/api/v1/jobs/{job.pk}/").json()["secrets"] == {"GH_TOKEN": "gh-token"}


def test_the_admin_shows_names_only(client, operator, tenant):
    secret = build_secret(tenant, "gh-token", VALUE)
    operator.is_staff = operator.is_superuser = True
    operator.save()
    client.force_login(operator)
    page = client.get(f"/admin/pools/tenantsecret/{secret.pk}/change/")
    assert page.status_code == 200
    assert "gh-token" in page.content.decode() and VALUE not in page.content.decode()
