"""The queue pages in headless Chromium against the whole stack (tests/e2e/conftest.py): the
operator's ordered queue of a pool (in the order the next pass considers it, with the health
conditions: the agent's ready node idles beside a backlog no pass has placed yet) and a
tenant's view (its own jobs; another tenant's work only as a count per class). Screenshots at
1280 and 390 px go to test-artifacts/."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from config.builders import build_person, build_priority_class, build_tenant, submit_job
from leases.services import tenants_at_quota
from pools.choices import PlatformRole
from scheduling import queue_selectors
from scheduling.pass_steps import plan
from scheduling.pass_steps.outcomes import PassResult
from scheduling.pass_steps.window import queued_jobs
from tests.browser import chromium_page, sign_in

from .conftest import screenshot

pytestmark = [pytest.mark.docker, pytest.mark.browser]


@pytest.fixture(scope="module")
def queued(stack, django_db_blocker):
    """Jobs of two tenants queued in the stack's pool, no pass run on them yet."""
    with django_db_blocker.unblock():
        build_person("e2e-qolga", platform_role=PlatformRole.OPERATOR)
        bob = build_tenant("e2e-bob")
        high = build_priority_class("e2e-high", 100, max_wait_s=3600)
        pool, alice = stack.pool, stack.tenant
        jobs = [
            submit_job(pool, alice, "alice-first", cpu=500, memory=256),
            submit_job(pool, bob, "bob-private-1", cpu=500, memory=256, priority=high),
            submit_job(pool, alice, "alice-second", cpu=500, memory=256, priority=high),
            submit_job(pool, bob, "bob-private-2", cpu=500, memory=256),
        ]
        yield jobs
        from jobs.models import Job

        Job.objects.filter(pk__in=[j.pk for j in jobs], state="queued").update(state="cancelled")


def next_pass_order(pool) -> list[int]:
    now = timezone.now()
    at_quota = set(tenants_at_quota(pool_id=pool.pk))
    limit = settings.SCHEDULER_PASS_MAX_JOBS
    ids = [pk for pk, _, _ in queued_jobs(pool_id=pool.pk, limit=limit, skip=at_quota, now=now)]
    return [job.pk for job in plan.read(pool, ids, now, PassResult()).jobs]


def test_the_operator_s_queue_page(console, stack, queued):
    order = next_pass_order(stack.pool)
    assert sorted(order) == sorted(j.pk for j in queued)
    assert [e["id"] for e in queue_selectors.pool_queue(stack.pool)["jobs"]] == order
    with chromium_page() as page:
        page.set_viewport_size({"width": 1280, "height": 900})
        sign_in(page, console, "e2e-qolga", "pw-e2e-qolga")
        page.goto(f"{console}/console/ops/queue?pool={stack.pool.slug}")
        rows = page.locator("#queue-table tbody tr")
        expect(rows).to_have_count(len(queued))
        shown = [int(rows.nth(i).get_attribute("data-job")) for i in range(len(queued))]
        assert shown == order  # the page's order is the next pass's
        expect(rows.first.locator('td[data-label="Position"]')).to_have_text("1")
        expect(page.locator("#queue-table")).to_contain_text("e2e-bob")  # operators see tenants
        idle = page.locator('[data-condition="idle-with-backlog"]')
        expect(idle).to_contain_text("Idle capacity with backlog")
        expect(page.locator('[data-condition="oldest-pending"]')).to_contain_text("e2e-high")
        screenshot(page, "ops-queue-1280")
        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        expect(rows.first).to_be_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 400, width
        screenshot(page, "ops-queue-390")


def test_the_tenant_s_view_of_the_queue(console, stack, queued):
    with chromium_page() as page:
        page.set_viewport_size({"width": 1280, "height": 900})
        sign_in(page, console, "e2e-alice", "pw-e2e-alice")
        page.goto(f"{console}/console/queue?pool={stack.pool.slug}")
        rows = page.locator("#my-queue tbody tr")
        own = [j.pk for j in queued if j.tenant_id == stack.tenant.pk]
        expect(rows).to_have_count(len(own))
        shown = [int(rows.nth(i).get_attribute("data-job")) for i in range(len(own))]
        order = next_pass_order(stack.pool)
        assert shown == [pk for pk in order if pk in own]
        others = page.locator("#others")
        expect(others).to_contain_text("e2e-high")
        content = page.content()
        for job in queued:
            if job.tenant_id != stack.tenant.pk:
                assert job.name not in content and f'data-job="{job.pk}"' not in content
        assert "e2e-bob" not in content
        screenshot(page, "tenant-queue-1280")
        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        expect(rows.first).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 400
        screenshot(page, "tenant-queue-390")
