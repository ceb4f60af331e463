"""GET /api/v1/quotas/: a tenant's quotas, usage per dimension and credit balance; another
tenant's are never listed; a quota refusal through the API names its dimension."""

from decimal import Decimal

from config.builders import SYSTEM, build_node, build_person, gpu_request
from leases import services
from pools.models import CreditAccount, Quota

URL = "/api/v1/quotas/"


def rows(response):
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_a_tenant_sees_its_own_quotas_usage_and_balance(
    api, pool, tenant, other_tenant, member, outsider
):
    build_node(pool, "g", cpu=16000, memory=65536, gpus=[{"sharing_mode": "timeslice"}])
    Quota.objects.create(
        tenant=tenant, pool=pool, cpu_millicores=8000, memory_mib=8192, gpus=1, egress_mib=100
    )
    Quota.objects.create(tenant=other_tenant, pool=pool, cpu_millicores=1, memory_mib=1)
    CreditAccount.objects.create(tenant=tenant, pool=pool, balance=Decimal("12.5"))
    services.lease_reserve(
        pool=pool,
        tenant=tenant,
        request=gpu_request("timeslice", 1, 250),
        actor=SYSTEM,
        duration=3600,
    )
    mine = rows(api(member).get(URL))
    assert [(r["tenant"], r["pool"]) for r in mine] == [(tenant.slug, pool.slug)]
    row = mine[0]
    assert row["balance"] == "12.5000" and row["period_days"] == 30
    dims = row["dimensions"]
    assert dims["gpus"] == {"limit": 1, "used": 0.25}
    assert dims["cpu_millicores"] == {"limit": 8000, "used": 1000}
    assert dims["leases"]["used"] == 1 and dims["egress_mib"] == {"limit": 100, "used": 0}
    assert dims["gpu_hours"]["limit"] is None and dims["storage_mib"]["limit"] is None
    theirs = rows(api(outsider).get(URL))
    assert [r["tenant"] for r in theirs] == [other_tenant.slug]
    assert theirs[0]["balance"] is None  # no account: not credit-limited


def test_policy_admins_and_operators_see_every_row_a_stranger_none(
    api, pool, tenant, other_tenant, policy_admin, operator
):
    Quota.objects.create(tenant=tenant, pool=pool, cpu_millicores=1, memory_mib=1)
    CreditAccount.objects.create(tenant=other_tenant, pool=pool, balance=0)
    everything = rows(api(policy_admin).get(URL))
    assert {r["tenant"] for r in everything} == {tenant.slug, other_tenant.slug}
    assert len(rows(api(operator).get(URL))) == 2  # operators see every row (visibility)
    assert rows(api(build_person("nobody")).get(URL)) == []  # in no tenant: nothing
    assert api(None).get(URL).status_code in (401, 403)


def test_a_refusal_through_the_api_names_its_dimension(api, pool, tenant, member):
    build_node(pool, "n", cpu=16000, memory=65536)
    Quota.objects.create(tenant=tenant, pool=pool, cpu_millicores=10**6, memory_mib=1500)
    resources = {"cpu_millicores_min": 1000, "memory_mib_min": 1024}
    body = {"pool": pool.slug, "tenant": tenant.slug, "resources": resources, "duration_s": 300}
    client = api(member)
    assert client.post("/api/v1/compute-leases", body, format="json").status_code == 201
    response = client.post("/api/v1/compute-leases", body, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "quota_exceeded"
    assert response.json()["dimension"] == "memory_mib"
