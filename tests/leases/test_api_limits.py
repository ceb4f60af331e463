"""Leases from the lease API (`POST /api/v1/compute-leases`, a reserve without a job) are bounded
like jobs: the tenant's quota and credit are re-checked under the quota rows' locks in the
ledger's one write (`ledger.apply` → `quota.recheck`), so a tenant at its quota or without
credit is refused with its reason code, and what its lease-API leases hold leaves that much less
room for its jobs (one quota for both)."""

from decimal import Decimal

from config.builders import submit_job
from jobs.choices import JobState
from pools.models import CreditAccount, Quota
from pools.services import credit_top_up
from scheduling.passes import scheduling_pass
from tests.clients import client_for

URL = "/api/v1/compute-leases"


def body(pool, tenant, cpu=1000):
    return {
        "pool": pool.slug,
        "tenant": tenant.slug,
        "resources": {"cpu_millicores_min": cpu, "memory_mib_min": 512},
        "duration_s": 300,
    }


def test_a_tenant_at_its_quota_is_refused_a_lease_naming_the_dimension(
    lpool, ltenant, lnode, lmember
):
    Quota.objects.create(tenant=ltenant, pool=lpool, cpu_millicores=2000, memory_mib=10**6)
    client = client_for(lmember)
    for _ in range(2):  # up to the quota
        assert client.post(URL, body(lpool, ltenant), format="json").status_code == 201

    response = client.post(URL, body(lpool, ltenant, cpu=1), format="json")

    assert response.status_code == 409
    payload = response.json()
    assert (payload["code"], payload["dimension"]) == ("quota_exceeded", "cpu_millicores")
    assert lpool.leases.filter(tenant=ltenant).count() == 2


def test_a_tenant_without_credit_is_refused_a_lease_until_a_top_up(lpool, ltenant, lnode, lmember):
    account = CreditAccount.objects.create(tenant=ltenant, pool=lpool, balance=Decimal(0))
    client = client_for(lmember)

    response = client.post(URL, body(lpool, ltenant), format="json")

    assert response.status_code == 409 and response.json()["code"] == "credit_exhausted"
    assert not lpool.leases.filter(tenant=ltenant).exists()
    credit_top_up(account, Decimal(5), by="padmin", note="top-up")
    assert client.post(URL, body(lpool, ltenant), format="json").status_code == 201


def test_what_lease_api_leases_hold_counts_against_the_quota_of_the_tenants_jobs(
    lpool, ltenant, lnode, lmember
):
    Quota.objects.create(tenant=ltenant, pool=lpool, cpu_millicores=2000, memory_mib=10**6)
    assert client_for(lmember).post(URL, body(lpool, ltenant, 2000), format="json").status_code
    job = submit_job(lpool, ltenant, cpu=500)

    result = scheduling_pass(pool_id=lpool.pk)

    assert job.pk not in result.placed
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.pending_reason["code"] == "quota_exceeded"
    assert job.pending_reason["dimension"] == "cpu_millicores"
