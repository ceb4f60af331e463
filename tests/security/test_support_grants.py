"""Issue #17: operators see jobs' metadata, not a tenant's logs, outputs or secrets. They read
logs and outputs only under a support grant from one of the tenant's admins, which expires,
can be revoked, is checked on every read (API and console) and is recorded as events."""

from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from config.builders import build_person, build_secret, submit_job
from jobs import artifacts
from pools.actors import Actor
from pools.choices import PlatformRole
from pools.models import SupportGrant, SupportGrantEvent, TenantSecret
from pools.services import support_grant_create, support_grants_expire
from tests.clients import client_for

LOG_LINE = "token=tenant-private-log-line\n"
GRANTS = "/api/v1/tenants/vision/support-grants"


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")


def with_data(job):
    artifacts.job_log_append(job=job, attempt=1, text=LOG_LINE)
    upload = SimpleUploadedFile("result.txt", b"tenant-private-output\n")
    artifacts.job_output_store(job=job, attempt=1, name="result.txt", fileobj=upload)
    return job


@pytest.fixture
def job(pool, tenant):
    return with_data(submit_job(pool, tenant))


def api_reads(client, job) -> dict:
    base = f"/api/v1/jobs/{job.pk}"
    return {
        "logs": client.get(f"{base}/logs"),
        "outputs": client.get(f"{base}/outputs"),
        "file": client.get(f"{base}/outputs/result.txt"),
    }


def console_reads(client, job) -> dict:
    client.force_login(job._reader)
    return {
        "page": client.get(f"/console/jobs/{job.pk}"),
        "log": client.get(f"/console/jobs/{job.pk}/log"),
    }


def assert_refused(api, console, job):
    for name, response in api.items():
        assert response.status_code == 403, name
        assert response.json()["code"] == "support_grant_required", name
    assert console["page"].status_code == 200  # the metadata
    page = console["page"].content.decode()
    assert f"#{job.pk}" in page and job.name in page
    assert "result.txt" not in page and "support grant" in page
    assert console["log"].status_code == 403
    assert LOG_LINE.strip() not in console["log"].content.decode()


def assert_open(api, console):
    assert {k: r.status_code for k, r in api.items()} == dict.fromkeys(api, 200)
    assert api["logs"].content.decode() == LOG_LINE
    assert [o["name"] for o in api["outputs"].json()] == ["result.txt"]
    assert b"".join(api["file"].streaming_content) == b"tenant-private-output\n"
    assert "result.txt" in console["page"].content.decode()
    assert console["log"].status_code == 200
    assert LOG_LINE.strip() in console["log"].content.decode()


def test_an_operator_without_a_grant_sees_metadata_only(api, operator, job, client):
    reader = api(operator)
    assert reader.get(f"/api/v1/jobs/{job.pk}").status_code == 200
    assert reader.get(f"/api/v1/jobs/{job.pk}/events").status_code == 200
    job._reader = operator
    assert_refused(api_reads(reader, job), console_reads(client, job), job)


def test_a_grant_opens_logs_and_outputs_until_it_is_revoked(
    api, operator, tenant_admin, job, client
):
    admin = api(tenant_admin)
    made = admin.post(GRANTS, {"operator": "operator", "reason": "ticket 42", "ttl_hours": 2})
    assert made.status_code == 201, made.json()
    grant = made.json()
    assert grant["state"] == "active" and grant["operator"] == "operator"
    assert grant["granted_by"] == "tadmin" and grant["reason"] == "ticket 42"
    assert [e["reason"] for e in grant["events"]] == ["support_granted"]
    job._reader = operator
    reader = api(operator)
    assert_open(api_reads(reader, job), console_reads(client, job))
    # the operator sees the grants of the tenant too
    assert [g["id"] for g in reader.get(GRANTS).json()] == [grant["id"]]

    revoked = admin.delete(f"{GRANTS}/{grant['id']}")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    assert_refused(api_reads(reader, job), console_reads(client, job), job)
    assert admin.delete(f"{GRANTS}/{grant['id']}").status_code == 409  # it has ended
    events = SupportGrantEvent.objects.filter(grant_id=grant["id"]).order_by("pk")
    assert [(e.reason, e.actor_label, e.to_state) for e in events] == [
        ("support_granted", "user:tadmin", "active"),
        ("support_revoked", "user:tadmin", "revoked"),
    ]
    assert events[0].data == {"operator": "operator", "reason": "ticket 42"}


def test_an_expired_grant_is_refused_at_once_and_its_expiry_recorded(
    api, operator, tenant_admin, tenant, job, client
):
    now = timezone.now()
    grant = support_grant_create(
        tenant=tenant,
        operator="operator",
        ttl=timedelta(hours=1),
        reason="last night's incident",
        actor=Actor.for_user(tenant_admin),
        now=now - timedelta(hours=1, seconds=1),
    )
    job._reader = operator
    # refused before any sweep ran: the expiry is checked on every read
    assert_refused(api_reads(api(operator), job), console_reads(client, job), job)
    assert api(tenant_admin).get(GRANTS).json()[0]["state"] == "expired"
    assert support_grants_expire(now=now) == 1
    assert support_grants_expire(now=now) == 0  # once
    grant.refresh_from_db()
    assert grant.state == "expired"
    assert list(grant.events.values_list("reason", "actor_kind")) == [
        ("support_granted", "user"),
        ("support_expired", "system"),
    ]


def test_a_grant_opens_one_tenant_to_one_operator(
    api, operator, tenant_admin, tenant, other_tenant, pool, client
):
    support_grant_create(
        tenant=tenant,
        operator="operator",
        ttl=timedelta(hours=1),
        reason="ticket",
        actor=Actor.for_user(tenant_admin),
    )
    other_job = with_data(submit_job(pool, other_tenant, name="nlp-job"))
    other_job._reader = operator
    assert_refused(api_reads(api(operator), other_job), console_reads(client, other_job), other_job)
    colleague = build_person("colleague", platform_role=PlatformRole.OPERATOR)
    mine = with_data(submit_job(pool, tenant, name="vision-job"))
    mine._reader = colleague
    assert_refused(api_reads(api(colleague), mine), console_reads(client, mine), mine)


def test_only_the_tenants_admins_grant_and_revoke(
    api, operator, tenant_admin, member, outsider, policy_admin, tenant
):
    body = {"operator": "operator", "reason": "ticket"}
    assert api(operator).post(GRANTS, body).status_code == 403  # never to itself
    assert api(member).post(GRANTS, body).status_code == 403
    assert api(policy_admin).post(GRANTS, body).status_code == 403
    assert api(outsider).post(GRANTS, body).status_code == 404
    assert api(member).get(GRANTS).status_code == 403
    assert not SupportGrant.objects.exists()
    grant = api(tenant_admin).post(GRANTS, body).json()
    for who in (operator, member, policy_admin):
        assert api(who).delete(f"{GRANTS}/{grant['id']}").status_code == 403
    assert api(outsider).delete(f"{GRANTS}/{grant['id']}").status_code == 404
    assert SupportGrant.objects.get().state == "active"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"operator": "member", "reason": "x"}, "operator"),  # not an operator
        ({"operator": "nobody", "reason": "x"}, "operator"),
        ({"operator": "operator", "reason": "x", "ttl_hours": 0}, "ttl_hours"),
        ({"operator": "operator", "reason": "x", "ttl_hours": 169}, "ttl_hours"),
        ({"operator": "operator"}, "reason"),
        ({"operator": "operator", "reason": "a\x1bb"}, "reason"),
        ({"operator": "operator", "reason": "x", "job": 1}, "job"),
    ],
)
def test_a_bad_grant_is_a_400_naming_the_field(api, operator, member, tenant_admin, body, field):
    response = api(tenant_admin).post(GRANTS, body, format="json")
    assert response.status_code == 400 and field in response.json()["errors"], response.json()
    assert not SupportGrant.objects.exists()


def test_an_operator_never_sets_replaces_or_deletes_a_tenants_secret(api, operator, tenant):
    build_secret(tenant, "db-pass", "the-tenants-value")
    url = "/api/v1/tenants/vision/secrets"
    replaced = api(operator).post(url, {"name": "db-pass", "value": "operator's"})
    assert replaced.status_code == 403  # it was a 201
    created = api(operator).post(url, {"name": "new-one", "value": "operator's"})
    assert created.status_code == 403
    assert api(operator).delete(f"{url}/db-pass").status_code == 403
    assert api(operator).get(url).status_code == 403  # not even the names
    assert [(s.name, s.reveal()) for s in TenantSecret.objects.all()] == [
        ("db-pass", "the-tenants-value")
    ]


def test_an_operator_cannot_join_a_tenant_through_its_member_list(api, operator, tenant):
    """An operator who could add an account of theirs as admin would grant itself access."""
    build_person("puppet")
    url = "/api/v1/tenants/vision/members"
    response = api(operator).post(url, {"user": "puppet", "role": "admin"})
    assert response.status_code == 403
    assert not tenant.memberships.filter(user__username="puppet").exists()


def test_the_console_grants_and_revokes_support_access(client, operator, tenant_admin, job):
    client.force_login(tenant_admin)
    page = "/console/support-grants"
    assert client.get(page).status_code == 200
    refused = client.post(page, {"tenant": "vision", "operator": "tadmin", "reason": "x"})
    assert "Name an active operator" in refused.content.decode()
    made = client.post(
        page, {"tenant": "vision", "operator": "operator", "reason": "ticket 9", "ttl_hours": 3}
    )
    assert made.status_code == 302
    grant = SupportGrant.objects.get()
    assert grant.reason == "ticket 9" and grant.granted_by == tenant_admin
    assert round((grant.expires_at - grant.created_at).total_seconds()) == 3 * 3600
    assert (
        client.post(page, {"tenant": "nlp", "operator": "operator", "reason": "x"}).status_code
        == 404
    )

    reader = client_for(operator)
    assert reader.get(f"/api/v1/jobs/{job.pk}/logs").status_code == 200
    operator_view = client_class_for(operator).get(page).content.decode()
    assert "ticket 9" in operator_view and "Revoke" not in operator_view
    assert client_class_for(operator).post(f"{page}/{grant.pk}/revoke").status_code == 404

    client.force_login(tenant_admin)
    assert client.post(f"{page}/{grant.pk}/revoke").status_code == 302
    grant.refresh_from_db()
    assert grant.state == "revoked"
    assert reader.get(f"/api/v1/jobs/{job.pk}/logs").status_code == 403


def client_class_for(user):
    browser = Client()
    browser.force_login(user)
    return browser
