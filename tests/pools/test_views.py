"""Token console in a real browser: a secret is shown once, works, and revocation sticks."""

import pytest
from playwright.sync_api import expect
from rest_framework.test import APIClient

from config.builders import build_person
from pools.models import ApiToken
from tests.browser import chromium_page, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


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
        row.locator("button:has-text('Revoke')").click()
        expect(row).to_contain_text("revoked")
        assert ApiToken.objects.get(name="laptop").revoked_at is not None
        assert api.get("/api/v1/me").status_code == 401
