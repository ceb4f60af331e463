"""Headless Chromium (Debian's) driven by Playwright, for console tests."""

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connections

CHROMIUM = "/usr/bin/chromium"
# Closed network here: keep Chromium from reaching out (it would be refused, many at a time).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium_page():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{CHROMIUM} is required in CI (make services installs it)")
        pytest.skip(f"{CHROMIUM} is not installed")
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # still plain synchronous code.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import expect, sync_playwright

    # what a page shows live (a websocket event, then an htmx fetch) may take seconds on a
    # loaded 2-core CI machine running the agent's containers beside the browser
    expect.set_options(timeout=15_000)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()
            # Inside Playwright's context the test's ORM calls got their own connection
            # (Django keeps connections per context); close it here, or the test database
            # could not be dropped at the end of the session.
            connections.close_all()


def sign_in(page, base_url: str, username: str, password: str):
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")
