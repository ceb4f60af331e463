"""The tokens and members pages: in a real browser a secret is shown once, works, and its
revocation sticks; through the test client, who sees and manages what."""

import pytest
from playwright.sync_api import expect
from rest_framework.test import APIClient

from config.builders import build_person, build_tenant, build_token
from pools.choices import TenantRole
from pools.models import ApiToken, Membership
from tests.browser import chromium_page, sign_in


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_create_use_and_revoke_a_token(live_server):
    build_person("carol")
    with chromium_page() as page:
        sign_in(page, live_server.url, "carol", "pw-carol")
        page.click("text=Tokens")
        page.fill("input[name=name]", "laptop")
        page.uncheck("input[value=write]")
        page.click("button:has-text('Create token')")
        secret = page.locator("#new-secret").inner_text().strip()
        row = page.locator("tr[data-token='laptop']")
        expect(row).to_contain_text("read")
        expect(row).not_to_contain_text("write")

        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        assert api.get("/api/v1/me").json()["username"] == "carol"

        page.reload()
        expect(page.locator("#new-secret")).to_have_count(0)  # shown once only

        # revoking asks first; the revoked token's secret, still on screen, leaves it
        page.fill("input[name=name]", "phone")
        page.click("button:has-text('Create token')")
        expect(page.locator("#new-secret")).to_have_count(1)
        phone = page.locator("tr[data-token='phone']")
        phone.locator("summary:has-text('Revoke')").click()
        confirm = phone.locator("button:has-text('Yes, revoke phone')")
        expect(confirm).to_be_visible()
        assert ApiToken.objects.get(name="phone").revoked_at is None  # nothing happens yet
        confirm.click()
        expect(phone).to_contain_text("revoked")
        expect(page.locator("#new-secret")).to_have_count(0)
        assert ApiToken.objects.get(name="phone").revoked_at is not None

        row.locator("summary:has-text('Revoke')").click()
        row.locator("button:has-text('Yes, revoke laptop')").click()
        expect(row).to_contain_text("revoked")
        assert ApiToken.objects.get(name="laptop").revoked_at is not None
        assert api.get("/api/v1/me").status_code == 401


# --- the tokens and members pages through Django's test client ------------------------------


@pytest.fixture
def tenant(db):
    return build_tenant("vision", name="Vision")


@pytest.mark.django_db
def test_tokens_page_lists_only_mine_with_bounded_queries(client, django_assert_max_num_queries):
    mine, theirs = build_person("dora"), build_person("erin")
    for index in range(5):
        build_token(mine, name=f"mine-{index}")
    build_token(theirs, name="theirs")
    client.force_login(mine)
    with django_assert_max_num_queries(8):
        html = client.get("/console/tokens").content.decode()
    assert html.count("<tr data-token=") == 5 and "theirs" not in html


def test_a_tenant_admin_adds_a_member(client, tenant):
    admin = build_person("ada", tenant=tenant, role=TenantRole.ADMIN)
    build_person("bob")
    client.force_login(admin)
    response = client.post(
        "/console/members", {"tenant": "vision", "username": "bob", "role": "member"}
    )
    assert response.status_code == 302 and response["Location"] == "/console/members?added=1"
    assert Membership.objects.get(user__username="bob").tenant == tenant
    html = client.get("/console/members?added=1").content.decode()
    assert '<tr data-member="bob">' in html and '<tr data-member="ada">' in html
    # an unknown name answers alike: no one is told who exists
    response = client.post("/console/members", {"tenant": "vision", "username": "nobody"})
    assert response.status_code == 302
    refused = client.post("/console/members", {"tenant": "vision", "username": ""})
    assert refused.status_code == 200 and 'id="e-username"' in refused.content.decode()


def test_members_page_is_for_tenant_admins_of_their_own_tenants(
    client, tenant, django_assert_max_num_queries
):
    other = build_tenant("nlp", name="Lang")
    build_person("zed", tenant=other)
    member = build_person("mo", tenant=tenant)
    client.force_login(member)
    with django_assert_max_num_queries(8):
        html = client.get("/console/members").content.decode()
    assert "you are not an admin of any tenant" in html and "zed" not in html
    response = client.post("/console/members", {"tenant": "vision", "username": "zed"})
    assert response.status_code == 404
    admin = build_person("ada", tenant=tenant, role=TenantRole.ADMIN)
    client.force_login(admin)
    assert client.post("/console/members", {"tenant": "nlp", "username": "mo"}).status_code == 404
    assert not Membership.objects.filter(tenant=other, user=member).exists()
    assert "zed" not in client.get("/console/members").content.decode()
