"""Accessibility (issue 22): axe-core's rules (axe-playwright-python bundles axe-core) in
headless Chromium on every console page — the tenant's, the operator's and the policy admin's,
listed from the URLconfs (`test_every_console_page_is_checked` fails on a page route this list
does not name) — with 0 serious or critical violations; and the journeys of the safety issue in
the browser: a member removed after a confirmation, the styled 404, the favicon. Screenshots at
1280 and 390 px go to test-artifacts/ (gitignored). Served by Django's live server (WSGI: the
pages' websockets stay closed, which changes nothing axe checks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from playwright.sync_api import expect

from config.builders import (
    build_node,
    build_person,
    build_pool,
    build_tenant,
    build_token,
    submit_job,
)
from pools.choices import PlatformRole, TenantRole
from pools.models import Membership
from scheduling.passes import scheduling_pass
from tests.browser import chromium_page, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BLOCKING = {"serious", "critical"}

# Every named console route that answers a GET with a page, by who sees it ({job}, {lease},
# {node}, {policy}: the world's). Routes that are fragments of a page (htmx parts), downloads or
# POST-only actions are in NOT_PAGES with why.
TENANT_PAGES = {
    "console-dashboard": "/",
    "console-jobs": "/console/jobs",
    "console-job-new": "/console/jobs/new",
    "console-job": "/console/jobs/{job}",
    "console-leases": "/console/leases",
    "console-tokens": "/console/tokens",
    "console-members": "/console/members",
    "console-support-grants": "/console/support-grants",
    "console-queue": "/console/queue",
}
OPERATOR_PAGES = {
    "console-nodes": "/console/nodes",
    "console-node": "/console/nodes/{node}",
    "console-enrollment-tokens": "/console/nodes/tokens",
    "ops-capacity": "/console/ops/capacity",
    "ops-queue": "/console/ops/queue",
    "ops-health": "/console/ops/health",
    "ops-lease-decision": "/console/ops/leases/{lease}/decision",
    "ops-job-decision": "/console/ops/jobs/{job}/decision",
}
POLICY_ADMIN_PAGES = [
    "/admin/",
    "/admin/pools/schedulingpolicy/",
    "/admin/pools/schedulingpolicy/{policy}/change/",
    "/admin/pools/schedulingpolicyversion/",
    "/admin/pools/schedulingpolicyversion/add/",
    "/admin/pools/schedulingpolicyversion/add/?policy={policy}",
    "/admin/pools/quota/",
    "/admin/pools/priorityclass/",
    "/admin/pools/creditaccount/",
    "/admin/pools/allowedregistry/",
]
NOT_PAGES = {
    "ops": "redirects to the capacity page",
    "console-dashboard-live": "a fragment of the dashboard",
    "console-job-table": "a fragment of the jobs page",
    "console-job-priorities": "a fragment of the submit form",
    "console-job-shapes": "a fragment of the submit form",
    "console-job-preview": "a fragment of the submit form",
    "console-job-timeline": "a fragment of the job page",
    "console-job-log": "a fragment of the job page",
    "console-job-log-download": "a download",
    "console-job-explain": "a fragment of the job page",
    "console-job-cancel": "the cancel confirmation, checked in its own test below",
    "console-lease-release": "POST only",
    "console-node-row": "a fragment of the node list",
    "console-node-events": "a fragment of the node page",
    "console-node-action": "POST only",
    "console-enrollment-token-revoke": "POST only",
    "console-token-revoke": "POST only",
    "console-member-role": "POST only",
    "console-member-remove": "POST only",
    "console-support-grant-revoke": "POST only",
    "ops-node-leases": "a fragment of the node page",
    "ops-node-usage": "a fragment of the node page",
}


def _console_routes() -> set[str]:
    def walk(patterns):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns)
            elif isinstance(pattern, URLPattern) and pattern.name:
                yield pattern.name

    return {n for n in walk(get_resolver().url_patterns) if n.startswith(("console", "ops"))}


def test_every_console_page_is_checked():
    listed = set(TENANT_PAGES) | set(OPERATOR_PAGES) | set(NOT_PAGES)
    assert _console_routes() - listed == set(), "add each new console page to a list above"
    assert listed - _console_routes() == set(), "pages that no longer exist"


@pytest.fixture
def world(live_server):
    pool = build_pool("lab", name="Lab")
    vision = build_tenant("vision", name="Vision")
    alice = build_person("alice", tenant=vision, role=TenantRole.ADMIN)
    build_person("bob", tenant=vision)
    build_person("olga", platform_role=PlatformRole.OPERATOR)
    build_person("paula", platform_role=PlatformRole.POLICY_ADMIN)
    build_token(alice, name="laptop")
    node = build_node(pool, "cpu-1", cpu=4000, memory=8192)
    job = submit_job(pool, vision, name="train", cpu=3000)
    submit_job(pool, vision, name="waits", cpu=2000)  # fits, not now: a queued job
    scheduling_pass(pool_id=pool.pk)
    job.refresh_from_db()
    return {
        "url": live_server.url,
        "job": job.pk,
        "lease": job.leases.get().pk,
        "node": node.pk,
        "policy": pool.scheduling_policy.pk,
    }


def blocking_violations(page) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — "
        + "; ".join(node["target"][0] for node in v["nodes"][:3])
        for v in results.response["violations"]
        if v["impact"] in BLOCKING
    ]


def check_pages(page, world, urls, label) -> list[str]:
    found = []
    for url in urls:
        address = world["url"] + url.format(**world)
        response = page.goto(address)
        assert response.status == 200, f"{url}: {response.status}"
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 900})
            found += [f"{url} at {width} px: {v}" for v in blocking_violations(page)]
            # no console page is wider than the screen, on a desktop or a phone (a table that
            # is not cards scrolls inside itself); Django's admin is left to Django
            wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            if label != "admin" and wide > 0:
                found.append(f"{url} at {width} px: {wide} px wider than the screen")
        name = url.strip("/").replace("/", "-").replace("?", "-").replace("=", "-") or "home"
        screenshot(page, f"a11y-{label}-{name}")
    return found


# The tenant's tables laid out as cards on a phone (table.responsive: each row a card, each cell
# labelled with its column), beside the jobs and the dashboard's queued work.
CARD_PAGES = ["/console/leases", "/console/tokens", "/console/members"]
CARDS_JS = """() => [...document.querySelectorAll('main table')].map(t => ({
  responsive: t.classList.contains('responsive'),
  rows: [...t.tBodies[0].rows].filter(r => r.cells.length > 1).map(r => ({
    display: getComputedStyle(r).display,
    labelled: [...r.cells]
      .filter(c => c.textContent.trim()
        && !c.querySelector(':scope > :is(details, button):only-child'))
      .every(c => c.dataset.label
        && getComputedStyle(c, '::before').content.includes(c.dataset.label)),
  })),
  headHidden: t.tHead.getBoundingClientRect().width <= 1,
}))"""


def card_tables(page, world, urls) -> list[str]:
    """At 390 px every table of these pages is cards: rows are blocks, the head hidden, each
    cell with text shows its column's name."""
    found = []
    page.set_viewport_size({"width": 390, "height": 900})
    for url in urls:
        page.goto(world["url"] + url)
        tables = page.evaluate(CARDS_JS)
        assert tables, f"{url}: no table"
        for t in tables:
            if not (t["responsive"] and t["headHidden"] and t["rows"]):
                found.append(f"{url}: a table is not cards at 390 px: {t}")
            for row in t["rows"]:
                if row != {"display": "block", "labelled": True}:
                    found.append(f"{url}: a row is not a labelled card at 390 px: {row}")
    return found


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)


def test_no_serious_or_critical_violation_on_any_console_page(world):
    found = []
    with chromium_page() as page:
        sign_in(page, world["url"], "alice", "pw-alice")
        found += check_pages(page, world, TENANT_PAGES.values(), "tenant")
        found += card_tables(page, world, ["/", "/console/jobs", *CARD_PAGES])
        page.goto(f"{world['url']}/console/jobs/{world['job']}/cancel")
        found += [f"cancel: {v}" for v in blocking_violations(page)]
        page.goto(f"{world['url']}/console/no-such-page")
        found += [f"404: {v}" for v in blocking_violations(page)]
        page.goto(f"{world['url']}/console/ops/capacity")  # a tenant: the styled 403
        found += [f"403: {v}" for v in blocking_violations(page)]
    with chromium_page() as page:
        sign_in(page, world["url"], "olga", "pw-olga")
        found += check_pages(page, world, OPERATOR_PAGES.values(), "operator")
    with chromium_page() as page:
        page.goto(f"{world['url']}/admin/login/")
        found += [f"admin login: {v}" for v in blocking_violations(page)]
        page.fill("input[name=username]", "paula")
        page.fill("input[name=password]", "pw-paula")
        page.click("input[type=submit]")
        page.wait_for_url(f"{world['url']}/admin/")
        found += check_pages(page, world, POLICY_ADMIN_PAGES, "admin")
    assert found == [], "\n".join(found)


def test_an_admin_removes_a_member_after_confirming(world):
    with chromium_page() as page:
        sign_in(page, world["url"], "alice", "pw-alice")
        page.goto(f"{world['url']}/console/members")
        bob = page.locator("tr[data-member='bob']")
        bob.locator("summary:has-text('Remove')").click()
        confirm = bob.locator("button:has-text('Yes, remove bob')")
        expect(confirm).to_be_visible()
        screenshot(page, "members-remove-confirm")
        assert Membership.objects.filter(user__username="bob").exists()  # not yet
        confirm.click()
        expect(page.locator("#member-done")).to_contain_text("Removed")
        expect(page.locator("tr[data-member='bob']")).to_have_count(0)
        assert not Membership.objects.filter(user__username="bob").exists()

        # the last admin cannot remove themselves: the page says why
        alice = page.locator("tr[data-member='alice']")
        alice.locator("summary:has-text('Remove')").click()
        alice.locator("button:has-text('Yes, remove alice')").click()
        expect(page.locator("#member-refusal")).to_contain_text("last admin")
        screenshot(page, "members-last-admin")


def test_the_404_page_and_the_favicon(world):
    with chromium_page() as page:
        icons = []
        page.on("response", lambda r: icons.append(r.status) if "favicon" in r.url else None)
        sign_in(page, world["url"], "alice", "pw-alice")
        response = page.goto(f"{world['url']}/console/jobs/999999")
        assert response.status == 404
        expect(page.locator("h1")).to_contain_text("does not exist")
        nav = page.get_by_role("navigation", name="Where to go from here")
        nav.get_by_role("link", name="Jobs").click()
        page.wait_for_url(f"{world['url']}/console/jobs")
        screenshot(page, "jobs-after-404")
        page.goto(f"{world['url']}/console/jobs/999999")
        screenshot(page, "not-found")
        icon = page.evaluate("document.querySelector('link[rel=icon]').href")
        assert icon.endswith("/static/favicon.svg")
        assert page.request.get(icon).status == 200
        favicon = page.request.get(f"{world['url']}/favicon.ico")
        assert favicon.status == 200 and favicon.headers["content-type"] == "image/svg+xml"
        assert 404 not in icons, icons
