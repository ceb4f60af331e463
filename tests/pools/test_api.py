from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from pools.choices import TokenScope
from pools.models import ApiToken
from pools.services import api_token_issue


def test_anonymous_is_refused_everywhere(db):
    client = APIClient()
    for url in (
        "/api/v1/me",
        "/api/v1/tenants/",
        "/api/v1/pools/",
        "/api/v1/tokens/",
        "/api/v1/jobs/",
        "/api/v1/shapes/",
    ):
        assert client.get(url).status_code in (401, 403), url


def test_me_lists_roles(api, member, tenant):
    body = api(member).get("/api/v1/me").json()
    assert body == {
        "username": "member",
        "tenants": [{"slug": "vision", "role": "member"}],
        "platform_roles": [],
    }


def test_tenants_never_leak_to_other_tenants(api, member, outsider, operator):
    assert [t["slug"] for t in api(member).get("/api/v1/tenants/").json()["results"]] == ["vision"]
    assert [t["slug"] for t in api(outsider).get("/api/v1/tenants/").json()["results"]] == ["nlp"]
    assert api(member).get("/api/v1/tenants/nlp/").status_code == 404
    assert {t["slug"] for t in api(operator).get("/api/v1/tenants/").json()["results"]} == {
        "vision",
        "nlp",
    }


def test_token_secret_is_shown_once_and_stored_as_digest(api, member):
    client = api(member)
    response = client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["read"]}, format="json")
    assert response.status_code == 201
    secret = response.json()["secret"]
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert secret not in (token.digest, token.prefix) and secret.startswith(token.prefix)
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert all("secret" not in row for row in listed)
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert reader.get("/api/v1/me").status_code == 200


def test_read_scope_cannot_write(api, member, pool):
    client = api(member, scopes=[TokenScope.READ])
    assert client.get("/api/v1/jobs/").status_code == 200
    response = client.post("/api/v1/tokens/", {"name": "x"}, format="json")
    assert response.status_code == 403


@pytest.mark.parametrize("state", ["expired", "revoked", "garbage"])
def test_expired_revoked_or_unknown_tokens_are_refused(member, state):
    token, secret = api_token_issue(user=member, name="t")
    if state == "expired":
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(1))
    elif state == "revoked":
        ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    else:
        secret = "cpu_not-a-real-token"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/me").status_code == 401


def test_revoke_own_token_only(api, member, outsider):
    token, _ = api_token_issue(user=member, name="mine")
    assert api(outsider).post(f"/api/v1/tokens/{token.pk}/revoke/").status_code == 404
    response = api(member).post(f"/api/v1/tokens/{token.pk}/revoke/")
    assert response.status_code == 200 and response.json()["revoked_at"]


def test_policy_versions_only_policy_admins_publish(api, member, policy_admin, pool):
    url = f"/api/v1/pools/{pool.slug}/policy-versions/"
    assert api(member).get(url).status_code == 200
    body = {"weights": {"bin_pack": 1.5}, "comment": "more packing"}
    assert api(member).post(url, body, format="json").status_code == 403
    response = api(policy_admin).post(url, body, format="json")
    assert response.status_code == 201 and response.json()["number"] == 2
    bad = api(policy_admin).post(url, {"weights": {"bin_pack": -1}}, format="json")
    assert bad.status_code == 400 and "weights" in bad.json()


def test_tenant_admins_manage_members_and_nobody_else_does(
    api, tenant_admin, member, outsider, operator
):
    url = "/api/v1/tenants/vision/members/"
    body = {"user": "outsider", "role": "member"}
    assert APIClient().get(url).status_code in (401, 403)
    assert api(member).get(url).status_code == 403
    assert api(member).post(url, body, format="json").status_code == 403
    assert api(outsider).get(url).status_code == 404  # another tenant is invisible
    response = api(tenant_admin).post(url, body, format="json")
    assert response.status_code == 202  # the same answer for any username (issue 9)
    assert {"user": "outsider", "role": "member"} in api(tenant_admin).get(url).json()
    assert [t["slug"] for t in api(outsider).get("/api/v1/tenants/").json()["results"]] == [
        "nlp",
        "vision",
    ]
    # operators read the list; only the tenant's admins change it (#17: an operator who could
    # add an account of theirs as admin would grant themselves the tenant's logs)
    refused = api(operator).post(url, {"user": "member", "role": "admin"}, format="json")
    assert refused.status_code == 403
    assert {"user": "member", "role": "member"} in api(operator).get(url).json()
    bad_role = api(tenant_admin).post(url, {"user": "member", "role": "owner"}, format="json")
    assert bad_role.status_code == 400 and "role" in bad_role.json()


def test_compute_pools_by_number_or_slug_with_their_shape_catalogue(api, member, pool, cpu_shape):
    client = api(member)
    listed = client.get("/api/v1/compute-pools").json()["results"]
    assert [p["slug"] for p in listed] == [pool.slug]
    by_number = client.get(f"/api/v1/compute-pools/{pool.pk}").json()
    assert by_number == client.get(f"/api/v1/compute-pools/{pool.slug}/").json()
    assert by_number["slug"] == pool.slug
    shapes = client.get(f"/api/v1/compute-pools/{pool.pk}/shapes").json()
    assert [s["name"] for s in shapes] == [cpu_shape.name]
    missing = client.get("/api/v1/compute-pools/999999/shapes")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert APIClient().get("/api/v1/compute-pools").status_code in (401, 403)
