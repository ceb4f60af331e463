"""Removing members and changing their roles (issue 22): `DELETE` and `PATCH
/api/v1/tenants/{slug}/members/{username}`, and the console's members page. Who may is in
tests/api/test_matrix.py; here, what each answer says and what it leaves behind, including
the MembershipEvent each add, role change and removal writes (`GET …/member-events`)."""

from config.builders import build_person
from pools.choices import TenantRole
from pools.models import Membership, MembershipEvent

URL = "/api/v1/tenants/{}/members/{}"
EVENTS = "/api/v1/tenants/{}/member-events"


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


# --- the members' history: MembershipEvent ----------------------------------------------------


def history(tenant, username):
    """(reason, from role, to role, actor) of `username`'s events in `tenant`, oldest first."""
    return [
        (e.reason, e.from_state, e.to_state, e.actor_label)
        for e in MembershipEvent.objects.filter(tenant=tenant, username=username)
    ]


def test_add_role_change_and_removal_each_write_an_event_kept_after_removal(
    api, tenant, tenant_admin, member
):
    newcomer = build_person("newcomer")
    client = api(tenant_admin)
    added = client.post(
        "/api/v1/tenants/vision/members", {"user": "newcomer", "role": "member"}, format="json"
    )
    assert added.status_code == 202
    assert (
        client.patch(URL.format("vision", "newcomer"), {"role": "admin"}, format="json").status_code
        == 200
    )
    assert client.delete(URL.format("vision", "newcomer")).status_code == 204
    assert role_of(tenant, "newcomer") is None

    by = "user:tadmin"
    assert history(tenant, "newcomer") == [
        ("member_added", "", "member", by),
        ("member_role_changed", "member", "admin", by),
        ("member_removed", "admin", "removed", by),
    ]
    removed = MembershipEvent.objects.get(
        tenant=tenant, username="newcomer", reason="member_removed"
    )
    assert removed.data == {"member": "newcomer", "from_role": "admin", "to_role": "removed"}
    assert removed.actor_user == tenant_admin and removed.user == newcomer

    # the tenant's admin reads them, newest first, the removed member's included
    body = client.get(EVENTS.format("vision")).json()
    theirs = [e for e in body["results"] if e["member"] == "newcomer"]
    assert [(e["reason"], e["from_role"], e["to_role"], e["actor"]) for e in theirs] == [
        ("member_removed", "admin", "removed", by),
        ("member_role_changed", "member", "admin", by),
        ("member_added", "", "member", by),
    ]
    assert body["count"] == 5  # and the fixtures' two adds, by the builders
    assert body["results"][-1]["actor"] == "system:builders"


def test_the_history_outlives_the_person(api, tenant, tenant_admin, member):
    api(tenant_admin).delete(URL.format("vision", "member"))
    member.delete()
    assert [r for r, *_ in history(tenant, "member")] == ["member_added", "member_removed"]
    assert MembershipEvent.objects.filter(username="member", user=None).count() == 2


def test_nothing_changed_or_refused_writes_no_event(api, tenant, tenant_admin, member, operator):
    client = api(tenant_admin)
    before = MembershipEvent.objects.count()
    # an unchanged role, a refused last admin, and adds that are silently skipped
    assert (
        client.patch(URL.format("vision", "member"), {"role": "member"}, format="json").status_code
        == 200
    )
    assert client.delete(URL.format("vision", "tadmin")).status_code == 409
    response = client.patch(URL.format("vision", "tadmin"), {"role": "member"}, format="json")
    assert response.status_code == 409
    for name in ("nobody", "operator", "member"):  # unknown, platform role, already a member
        response = client.post(
            "/api/v1/tenants/vision/members", {"user": name, "role": "member"}, format="json"
        )
        assert response.status_code == 202
    assert MembershipEvent.objects.count() == before


def test_adding_a_member_again_with_another_role_is_a_role_change(
    api, tenant, tenant_admin, member
):
    client = api(tenant_admin)
    members = "/api/v1/tenants/vision/members"
    response = client.post(members, {"user": "member", "role": "admin"}, format="json")
    assert response.status_code == 202
    assert role_of(tenant, "member") == TenantRole.ADMIN
    assert history(tenant, "member")[-1] == (
        "member_role_changed",
        "member",
        "admin",
        "user:tadmin",
    )
    # and re-adding can no more demote the last admin than PATCH can
    client.delete(URL.format("vision", "member"))
    response = client.post(members, {"user": "tadmin", "role": "member"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "last_admin"
    assert role_of(tenant, "tadmin") == TenantRole.ADMIN


def test_admins_and_operators_read_the_history_members_do_not(
    api, tenant, tenant_admin, member, operator, outsider
):
    assert api(tenant_admin).get(EVENTS.format("vision")).status_code == 200
    seen = api(operator).get(EVENTS.format("vision")).json()["results"]
    assert {e["member"] for e in seen} == {"tadmin", "member"}
    assert api(member).get(EVENTS.format("vision")).status_code == 403
    assert api(outsider).get(EVENTS.format("vision")).status_code == 404
    # another tenant's history is never mixed in
    assert all(e["member"] != "outsider" for e in seen)


def test_the_console_writes_the_same_events(client, tenant, tenant_admin, member):
    client.force_login(tenant_admin)
    build_person("newcomer")
    response = client.post(
        "/console/members", {"tenant": "vision", "username": "newcomer", "role": "member"}
    )
    assert response.status_code == 302
    membership = Membership.objects.get(tenant=tenant, user=member)
    client.post(f"/console/members/{membership.pk}/role", {"role": "admin"})
    client.post(f"/console/members/{membership.pk}/remove")
    assert history(tenant, "newcomer") == [("member_added", "", "member", "user:tadmin")]
    assert history(tenant, "member")[1:] == [
        ("member_role_changed", "member", "admin", "user:tadmin"),
        ("member_removed", "admin", "removed", "user:tadmin"),
    ]


def test_the_console_refuses_re_adding_the_last_admin_with_a_lower_role(
    client, tenant, tenant_admin
):
    client.force_login(tenant_admin)
    response = client.post(
        "/console/members", {"tenant": "vision", "username": "tadmin", "role": "member"}
    )
    assert response.status_code == 409
    assert b"last admin" in response.content
    assert role_of(tenant, "tadmin") == TenantRole.ADMIN


def test_the_django_admin_changes_memberships_through_the_services(
    client, tenant, tenant_admin, member, django_user_model
):
    """A superuser's admin edits write the same events and keep the tenant's last admin."""
    root = django_user_model.objects.create_superuser("root", "root@example.org", "pw")
    client.force_login(root)
    row = Membership.objects.get(tenant=tenant, user=member)
    change = f"/admin/pools/membership/{row.pk}/change/"
    client.post(change, {"role": TenantRole.ADMIN})
    assert role_of(tenant, "member") == TenantRole.ADMIN
    event = MembershipEvent.objects.filter(tenant=tenant, username="member").latest("id")
    assert event.reason == "member_role_changed" and event.actor_label == "user:root"
    # two admins now: one may go; the last one may not
    client.post(f"/admin/pools/membership/{row.pk}/delete/", {"post": "yes"})
    assert role_of(tenant, "member") is None
    assert MembershipEvent.objects.filter(tenant=tenant, reason="member_removed").count() == 1
    last = Membership.objects.get(tenant=tenant, user=tenant_admin)
    client.post(f"/admin/pools/membership/{last.pk}/delete/", {"post": "yes"})
    assert role_of(tenant, "tadmin") == TenantRole.ADMIN
