"""The leases API: every endpoint anonymous, wrong role, right role; refusals are 4xx, never 500."""

from datetime import timedelta

import pytest
from django.utils import timezone

from pools.models import ResourceShape
from scheduling.choices import LeaseState
from scheduling.models import Lease

from .conftest import api_client, assert_ledger_ok, make_node

URL = "/api/v1/compute-leases"


def body(pool, tenant, **extra):
    data = {
        "pool": pool.slug,
        "tenant": tenant.slug,
        "resources": {"cpu_millicores_min": 1000, "memory_mib_min": 1024},
        "duration_s": 300,
    }
    data.update(extra)
    return data


@pytest.fixture
def granted(lpool, ltenant, lnode, lmember):
    response = api_client(lmember).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_create_anonymous_wrong_role_right_role(lpool, ltenant, lnode, lmember, loutsider):
    assert api_client().post(URL, body(lpool, ltenant), format="json").status_code in (401, 403)
    # a member of another tenant: the tenant is invisible to them
    response = api_client(loutsider).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 400 and "tenant" in response.json()
    # a read-only token may not reserve
    response = api_client(lmember, scopes=("read",)).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 403
    # a node's agent may not reserve
    response = api_client(node=lnode).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code in (401, 403)
    response = api_client(lmember).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 201
    lease = response.json()
    assert lease["state"] == "reserved" and lease["node"] == "n1"
    assert lease["cpu_millicores"] == 1000 and lease["fencing_token"]
    assert lease["held"]["cpu_millicores"] == 1000 and lease["consumed"] is None
    assert_ledger_ok(lpool)


def test_create_trailing_slash_and_catalogue_shape(lpool, ltenant, lnode, lmember):
    ResourceShape.objects.create(
        pool=lpool, name="small", cpu_millicores_min=500, memory_mib_min=512
    )
    data = body(lpool, ltenant, shape="small")
    del data["resources"]
    response = api_client(lmember).post(URL + "/", data, format="json")
    assert response.status_code == 201 and response.json()["cpu_millicores"] == 500


def test_operator_may_reserve_for_any_tenant(lpool, ltenant, lnode, loperator):
    response = api_client(loperator).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 201


@pytest.mark.parametrize(
    "change, field",
    [
        ({"pool": "nope"}, "pool"),
        ({"tenant": "nope"}, "tenant"),
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": "x"}, "duration_s"),
        ({"resources": {"cpu_millicores_min": 0, "memory_mib_min": 1}}, "resources"),
        ({"resources": {"memory_mib_min": 1}}, "resources"),
        (
            {"resources": {"cpu_millicores_min": 1, "memory_mib_min": 1, "gpu_count": 1}},
            "resources",
        ),
        ({"resources": "lots"}, "resources"),
        ({"shape": "missing"}, "shape"),
        ({"window": {"start": "2030-01-01T00:00:00Z", "end": "2029-01-01T00:00:00Z"}}, "window"),
        ({"window": "tomorrow"}, "window"),
    ],
)
def test_bad_input_is_400_with_field_errors(lpool, ltenant, lnode, lmember, change, field):
    data = {**body(lpool, ltenant), **change}
    response = api_client(lmember).post(URL, data, format="json")
    assert response.status_code == 400, response.content
    payload = response.json()
    assert field in payload or "shape" in payload or "non_field_errors" in payload


def test_no_body_and_garbage_are_400(lpool, ltenant, lnode, lmember):
    client = api_client(lmember)
    assert client.post(URL, {}, format="json").status_code == 400
    response = client.post(URL, "{not json", content_type="application/json")
    assert response.status_code == 400


def test_409_with_reasons_and_422_never_fits(lpool, ltenant, lnode, lmember):
    client = api_client(lmember)
    big = {"cpu_millicores_min": 4000, "memory_mib_min": 1024}
    assert client.post(URL, body(lpool, ltenant, resources=big), format="json").status_code == 201
    response = client.post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 409
    payload = response.json()
    assert payload["code"] == "no_capacity"
    assert payload["reasons"] == {"insufficient_cpu": 1}
    assert payload["message"].startswith("0 of 1 nodes")
    huge = {"cpu_millicores_min": 400_000, "memory_mib_min": 1024}
    response = client.post(URL, body(lpool, ltenant, resources=huge), format="json")
    assert response.status_code == 422 and response.json()["code"] == "never_fits"


def test_quota_refusal_is_409(lpool, ltenant, lnode, lmember):
    from pools.models import Quota

    Quota.objects.create(tenant=ltenant, pool=lpool, cpu_millicores=1000, memory_mib=10**6)
    client = api_client(lmember)
    assert client.post(URL, body(lpool, ltenant), format="json").status_code == 201
    response = client.post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 409 and response.json()["code"] == "quota_exceeded"


def test_idempotency_key_returns_the_same_lease(lpool, ltenant, lnode, lmember):
    client = api_client(lmember)
    first = client.post(URL, body(lpool, ltenant), format="json", HTTP_IDEMPOTENCY_KEY="k1")
    second = client.post(URL, body(lpool, ltenant), format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 201 and second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert Lease.objects.count() == 1


def test_window_creates_a_reservation(lpool, ltenant, lnode, lmember):
    start = timezone.now() + timedelta(hours=1)
    window = {
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
        "tolerance_s": 120,
    }
    response = api_client(lmember).post(URL, body(lpool, ltenant, window=window), format="json")
    assert response.status_code == 201
    assert response.json()["window_start"] and response.json()["tolerance_s"] == 120
    far = {
        "start": (timezone.now() + timedelta(days=60)).isoformat(),
        "end": (timezone.now() + timedelta(days=60, hours=1)).isoformat(),
    }
    response = api_client(lmember).post(URL, body(lpool, ltenant, window=far), format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "reservation_horizon_exceeded"


def test_list_and_detail_visibility(granted, lmember, loutsider, loperator, lnode, lpool):
    lease_url = f"{URL}/{granted['id']}"
    assert api_client().get(URL).status_code in (401, 403)
    assert api_client(loutsider).get(URL).json()["count"] == 0
    assert api_client(loutsider).get(lease_url).status_code == 404
    assert api_client(lmember).get(URL).json()["count"] == 1
    assert api_client(lmember).get(lease_url).json()["id"] == granted["id"]
    assert api_client(loperator).get(lease_url).status_code == 200
    assert api_client(node=lnode).get(lease_url).status_code == 200
    other = make_node(lpool, "n2")
    assert api_client(node=other).get(lease_url).status_code == 404
    events = api_client(lmember).get(f"{lease_url}/events").json()
    assert [e["reason"] for e in events] == ["reserved"]


def test_commit_renew_release_roles(granted, lmember, loutsider, lnode, lpool):
    lease_url = f"{URL}/{granted['id']}"
    token = {"fencing_token": granted["fencing_token"]}
    other = make_node(lpool, "n2")
    for action in ("commit", "renew", "release"):
        assert api_client().post(f"{lease_url}/{action}", token).status_code in (401, 403)
        assert api_client(loutsider).post(f"{lease_url}/{action}", token).status_code == 404
        assert api_client(node=other).post(f"{lease_url}/{action}", token).status_code == 404
    read_only = api_client(lmember, scopes=("read",))
    assert read_only.post(f"{lease_url}/commit", token).status_code == 403
    stale = api_client(node=lnode).post(f"{lease_url}/commit", {"fencing_token": 1})
    assert stale.status_code == 409 and stale.json()["code"] == "fencing_token_mismatch"
    assert api_client(node=lnode).post(f"{lease_url}/commit", {}).status_code == 400
    committed = api_client(node=lnode).post(f"{lease_url}/commit", token)
    assert committed.status_code == 200 and committed.json()["state"] == "committed"
    renewed = api_client(lmember).post(f"{lease_url}/renew", {**token, "duration_s": 900})
    assert renewed.status_code == 200
    again = api_client(node=lnode).post(f"{lease_url}/commit", token)
    assert again.status_code == 409 and again.json()["code"] == "transition_not_allowed"
    usage = {"cpu_millicores": 700, "memory_mib": 512}
    assert api_client(lmember).post(f"{lease_url}/usage", usage).status_code == 403
    reported = api_client(node=lnode).post(f"{lease_url}/usage", usage)
    assert reported.status_code == 200 and reported.json()["consumed"]["cpu_millicores"] == 700
    released = api_client(lmember).post(f"{lease_url}/release", {})
    assert released.status_code == 200 and released.json()["state"] == "released"
    # idempotent
    assert api_client(node=lnode).post(f"{lease_url}/release", {}).status_code == 200
    assert Lease.objects.get(pk=granted["id"]).state == LeaseState.RELEASED
    assert_ledger_ok(lpool)


def test_accounting_and_capacity(granted, lmember, loutsider, loperator, lpool):
    own = api_client(lmember).get(f"{URL}/accounting").json()
    assert [row["tenant"] for row in own] == ["lt"]
    assert own[0]["held"]["cpu_millicores"] == 1000
    assert api_client(loutsider).get(f"{URL}/accounting").json()[0]["held"]["leases"] == 0
    capacity_url = f"/api/v1/pools/{lpool.slug}/capacity"
    assert api_client().get(capacity_url).status_code in (401, 403)
    assert api_client(lmember).get(capacity_url).status_code == 403
    response = api_client(loperator).get(capacity_url)
    assert response.status_code == 200
    totals = response.json()["totals"]
    assert totals["reserved"]["cpu_millicores"] == 1000
    assert totals["allocatable"]["cpu_millicores"] == 4000
    assert api_client(loperator).get("/api/v1/pools/none/capacity").status_code == 404
