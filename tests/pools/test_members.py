"""Removing members and changing their roles (issue 22): `DELETE` and `PATCH
/api/v1/tenants/{slug}/members/{username}`, and the console's members page. Who may is in
tests/api/test_matrix.py; here, what each answer says and what it leaves behind."""

from pools.choices import TenantRole
from pools.models import Membership

URL = "/api/v1/tenants/{}/members/{}"


def role_of(tenant, username):
    row = Membership.objects.filter(tenant=tenant, user__username=username).first()
    return row and row.role


def test_an_admin_changes_a_role_and_removes_a_member(api, tenant, tenant_admin, member):
    client = api(tenant_admin)
    response = client.patch(URL.format("vision", "member"), {"role": "admin"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"user": "member", "role": "admin"}
    assert role_of(tenant, "member") == TenantRole.ADMIN

    response = client.delete(URL.format("vision", "member"))
    assert response.status_code == 204
    assert role_of(tenant, "member") is None
    # the person is gone from the tenant: its list no longer names them, and they see nothing
    listed = client.get("/api/v1/tenants/vision/members").json()
    assert [m["user"] for m in listed] == ["tadmin"]
    assert api(member).get("/api/v1/tenants/vision").status_code == 404


def test_a_bad_role_is_a_400_with_the_fields_error(api, tenant_admin, member):
    client = api(tenant_admin)
    response = client.patch(URL.format("vision", "member"), {"role": "owner"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid" and "role" in body["errors"]
    response = client.patch(URL.format("vision", "member"), {}, format="json")
    assert response.status_code == 400 and "role" in response.json()["errors"]
    response = client.patch(
        URL.format("vision", "member"), {"role": "admin", "rank": 1}, format="json"
    )
    assert response.status_code == 400 and "rank" in response.json()["errors"]


def test_another_tenants_member_or_nobody_is_a_404(api, tenant_admin, member, outsider):
    client = api(tenant_admin)
    for username in ("outsider", "nobody"):
        assert client.delete(URL.format("vision", username)).status_code == 404
        response = client.patch(URL.format("vision", username), {"role": "admin"}, format="json")
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    # and another tenant's path altogether, as for every object of another tenant
    assert client.delete(URL.format("nlp", "outsider")).status_code == 404
    assert role_of(outsider.memberships.get().tenant, "outsider") == TenantRole.MEMBER


def test_the_last_admin_can_be_neither_removed_nor_demoted(api, tenant, tenant_admin, member):
    client = api(tenant_admin)
    response = client.delete(URL.format("vision", "tadmin"))
    assert response.status_code == 409
    assert response.json()["code"] == "last_admin"
    assert "tadmin" in response.json()["message"]
    response = client.patch(URL.format("vision", "tadmin"), {"role": "member"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "last_admin"
    assert role_of(tenant, "tadmin") == TenantRole.ADMIN

    # with a second admin, either may step down, but not both
    client.patch(URL.format("vision", "member"), {"role": "admin"}, format="json")
    response = client.patch(URL.format("vision", "tadmin"), {"role": "member"}, format="json")
    assert response.status_code == 200
    second = api(member)
    assert second.delete(URL.format("vision", "member")).status_code == 409
    assert second.delete(URL.format("vision", "tadmin")).status_code == 204
    assert role_of(tenant, "member") == TenantRole.ADMIN


def test_an_unchanged_role_is_a_200_that_changes_nothing(api, tenant, tenant_admin):
    response = api(tenant_admin).patch(
        URL.format("vision", "tadmin"), {"role": "admin"}, format="json"
    )
    assert response.status_code == 200 and response.json()["role"] == "admin"


# --- the console ------------------------------------------------------------------------------


def test_the_console_changes_a_role_and_removes_a_member(client, tenant, tenant_admin, member):
    client.force_login(tenant_admin)
    page = client.get("/console/members")
    assert b'data-member="member"' in page.content
    membership = Membership.objects.get(tenant=tenant, user=member)
    response = client.post(f"/console/members/{membership.pk}/role", {"role": "admin"})
    assert response.status_code == 302
    assert role_of(tenant, "member") == TenantRole.ADMIN
    response = client.post(f"/console/members/{membership.pk}/remove")
    assert response.status_code == 302
    assert role_of(tenant, "member") is None


def test_the_console_refuses_the_last_admin_with_the_reason(client, tenant, tenant_admin):
    client.force_login(tenant_admin)
    membership = Membership.objects.get(tenant=tenant, user=tenant_admin)
    response = client.post(f"/console/members/{membership.pk}/remove")
    assert response.status_code == 409
    assert b"last admin" in response.content
    assert role_of(tenant, "tadmin") == TenantRole.ADMIN
    response = client.post(f"/console/members/{membership.pk}/role", {"role": "member"})
    assert response.status_code == 409
    assert role_of(tenant, "tadmin") == TenantRole.ADMIN


def test_the_console_hides_other_tenants_and_refuses_members(
    client, tenant_admin, member, outsider
):
    client.force_login(tenant_admin)
    theirs = outsider.memberships.get()
    assert client.post(f"/console/members/{theirs.pk}/remove").status_code == 404
    client.force_login(member)
    mine = member.memberships.get()
    assert client.post(f"/console/members/{mine.pk}/remove").status_code == 404
    assert client.post(f"/console/members/{mine.pk}/role", {"role": "admin"}).status_code == 404
