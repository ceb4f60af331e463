"""Retention per pool and tenant (jobs/retention.py, jobs/artifacts.py `expire_artifacts`): the
tenant's days for the pool, else its days for every pool, else the pool's knob. The sweep
removes what expired and nothing else, one job per transaction; a job whose file cannot be
deleted is recorded and the others go on. Tenant admins set their tenant's days through
/api/v1/output-retention/; policy admins see them in the admin."""

import os
from datetime import timedelta

import pytest
from django.test import Client

from config.builders import SYSTEM, build_pool, build_tenant
from jobs import artifacts, retention
from jobs.models import JobOutput, TenantRetention
from pools.reasons import Reason
from tests.jobs.test_retention import ended_job, kept, later, set_retention


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


@pytest.fixture
def two_pools(pool):
    short = build_pool("short")
    set_retention(short, 7)  # `pool` keeps the default, 30
    return pool, short


def test_two_tenants_two_pools_each_job_by_its_own_retention(two_pools, tenant, other_tenant):
    long_pool, short_pool = two_pools
    retention.retention_set(tenant=tenant, pool=long_pool, days=3, actor=SYSTEM)
    retention.retention_set(tenant=other_tenant, pool=None, days=10, actor=SYSTEM)
    third = build_tenant("third")  # no row: the pools' knobs
    jobs = {
        ("mine", "long"): ended_job(long_pool, tenant),  # its row for this pool: 3
        ("mine", "short"): ended_job(short_pool, tenant),  # no row there: the knob, 7
        ("theirs", "long"): ended_job(long_pool, other_tenant),  # every pool: 10
        ("theirs", "short"): ended_job(short_pool, other_tenant),  # every pool: 10 (not 7)
        ("third", "long"): ended_job(long_pool, third),  # the knob: 30
        ("third", "short"): ended_job(short_pool, third),  # the knob: 7
    }
    files = {key: job.outputs.get().file.path for key, job in jobs.items()}
    expected = {
        ("mine", "long"): 3,
        ("mine", "short"): 7,
        ("theirs", "long"): 10,
        ("theirs", "short"): 10,
        ("third", "long"): 30,
        ("third", "short"): 7,
    }
    for key, job in jobs.items():
        assert retention.effective(job.tenant_id, job.pool).days == expected[key]

    gone: set = set()
    for day in (2, 3, 7, 10, 29, 30):
        artifacts.expire_artifacts(now=later(day))
        gone |= {key for key, days in expected.items() if days <= day}
        for key, job in jobs.items():
            assert kept(job) == (key not in gone), (day, key)
            assert JobOutput.objects.filter(job=job).exists() == (key not in gone)
            assert os.path.exists(files[key]) == (key not in gone), (day, key)
    message = jobs[("theirs", "short")].events.get(reason=Reason.ARTIFACTS_EXPIRED).message
    assert message == "outputs and log deleted 10 days after the job ended"


def test_the_pool_row_wins_over_the_every_pool_row(pool, tenant):
    retention.retention_set(tenant=tenant, pool=None, days=20, actor=SYSTEM)
    retention.retention_set(tenant=tenant, pool=pool, days=5, actor=SYSTEM)
    assert retention.effective(tenant.pk, pool) == retention.Retention(5, "tenant pool")
    assert retention.tenants_days(pool) == {tenant.pk: 5}
    job = ended_job(pool, tenant)
    assert artifacts.expire_artifacts(now=later(4)) == 0 and kept(job)
    assert artifacts.expire_artifacts(now=later(5)) == 1 and not kept(job)


def test_a_longer_tenant_retention_keeps_past_the_pool_knob(pool, tenant, other_tenant):
    retention.retention_set(tenant=tenant, pool=pool, days=90, actor=SYSTEM)
    mine, theirs = ended_job(pool, tenant), ended_job(pool, other_tenant)
    assert artifacts.expire_artifacts(now=later(31)) == 1
    assert kept(mine) and not kept(theirs)
    assert retention.expires_at(mine) == mine.state_changed_at + timedelta(days=90)


def test_a_file_that_cannot_be_deleted_is_recorded_and_the_others_go_on(
    two_pools, tenant, other_tenant, media
):
    long_pool, short_pool = two_pools
    retention.retention_set(tenant=tenant, pool=None, days=2, actor=SYSTEM)
    stuck, fine = ended_job(long_pool, tenant, "stuck"), ended_job(short_pool, tenant, "fine")
    other = ended_job(short_pool, other_tenant, "other")  # 7 days
    path = media / stuck.outputs.get().file.name
    path.unlink()
    path.mkdir()  # a folder with something inside: the storage cannot delete it
    (path / "inside").write_text("x")

    assert artifacts.expire_artifacts(now=later(3)) == 1
    assert kept(stuck) and not kept(fine) and kept(other)
    failure = stuck.events.order_by("-id").first()
    assert failure.reason == Reason.SWEEP_FAILED
    assert artifacts.expire_artifacts(now=later(8)) == 1  # the other tenant's, on its day
    assert not kept(other) and kept(stuck)
    (path / "inside").unlink()
    assert artifacts.expire_artifacts(now=later(9)) == 1 and not kept(stuck)


def test_an_object_store_output_loses_its_row_not_a_storage_file(pool, tenant):
    job = ended_job(pool, tenant)
    JobOutput.objects.create(
        job=job, attempt=1, name="remote.bin", size=1, sha256="0" * 64,
        location="s3://bucket/prefix/remote.bin",
    )  # fmt: skip
    assert artifacts.expire_artifacts(now=later(31)) == 1
    assert not JobOutput.objects.filter(job=job).exists()


# --- the API and the admin ---------------------------------------------------------------


def test_a_tenant_admin_sets_lists_and_clears_its_retention(api, tenant_admin, tenant, pool):
    client = api(tenant_admin)
    body = {"tenant": tenant.slug, "pool": pool.slug, "output_retention_days": 14}
    response = client.post("/api/v1/output-retention/", body, format="json")
    assert response.status_code == 200, response.content
    row = response.json()
    assert (row["tenant"], row["pool"], row["output_retention_days"]) == (
        tenant.slug,
        pool.slug,
        14,
    )
    assert row["updated_by"] == f"user:{tenant_admin.username}"
    again = client.post("/api/v1/output-retention/", body | {"output_retention_days": 60})
    assert again.json()["id"] == row["id"] and again.json()["output_retention_days"] == 60
    every = client.post(
        "/api/v1/output-retention/", {"tenant": tenant.slug, "output_retention_days": 5}
    )
    assert every.status_code == 200 and every.json()["pool"] is None
    listing = client.get("/api/v1/output-retention/").json()
    assert sorted((r["pool"] or "", r["output_retention_days"]) for r in listing) == [
        ("", 5),
        (pool.slug, 60),
    ]
    assert client.delete(f"/api/v1/output-retention/{row['id']}").status_code == 204
    assert retention.effective(tenant.pk, pool) == retention.Retention(5, "tenant")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"output_retention_days": 0}, "output_retention_days"),
        ({"output_retention_days": 3651}, "output_retention_days"),
        ({"output_retention_days": "many"}, "output_retention_days"),
        ({"pool": "nowhere"}, "pool"),
        ({"tenant": "nobody"}, "tenant"),
    ],
)
def test_bad_values_are_400_with_the_field(api, tenant_admin, tenant, change, field):
    body = {"tenant": tenant.slug, "output_retention_days": 10} | change
    response = api(tenant_admin).post("/api/v1/output-retention/", body, format="json")
    assert response.status_code == 400 and field in response.json()["errors"]


def test_members_read_others_are_refused(api, member, outsider, tenant_admin, tenant):
    row = retention.retention_set(tenant=tenant, pool=None, days=9, actor=SYSTEM)
    body = {"tenant": tenant.slug, "output_retention_days": 1}
    assert api(member).get("/api/v1/output-retention/").json()[0]["id"] == row.pk
    assert api(member).post("/api/v1/output-retention/", body).status_code == 403
    assert api(member).delete(f"/api/v1/output-retention/{row.pk}").status_code == 403
    assert api(outsider).get("/api/v1/output-retention/").json() == []
    refused = api(outsider).post("/api/v1/output-retention/", body)
    assert refused.status_code == 400 and "tenant" in refused.json()["errors"]
    assert api(outsider).delete(f"/api/v1/output-retention/{row.pk}").status_code == 404
    assert TenantRetention.objects.get(pk=row.pk).output_retention_days == 9


def test_policy_admins_see_the_rows_in_the_admin(policy_admin, tenant, pool):
    retention.retention_set(tenant=tenant, pool=pool, days=12, actor=SYSTEM)
    browser = Client()
    browser.force_login(policy_admin)
    page = browser.get("/admin/jobs/tenantretention/")
    assert page.status_code == 200
    assert tenant.slug in page.content.decode() or tenant.name in page.content.decode()
    assert browser.get("/admin/jobs/tenantretention/add/").status_code == 403
