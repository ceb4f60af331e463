"""The tenant console in a real browser: jobs appear, and events arrive live."""

import threading

import pytest
from channels.testing import ChannelsLiveServerTestCase
from django.db import connection
from playwright.sync_api import expect

from jobs.services import job_cancel, job_submit
from nodes.services import node_mark_ready, node_register, node_verify
from pools.actors import Actor
from pools.choices import TenantRole
from pools.services import membership_set, pool_create, tenant_create
from scheduling.passes import scheduling_pass
from tests.browser import chromium_page, sign_in
from tests.conftest import make_user

IMAGE = "127.0.0.1:5000/computepool/busybox@sha256:" + "b" * 64


@pytest.mark.browser
class TestJobsConsole(ChannelsLiveServerTestCase):
    serve_static = True

    def setUp(self):
        self.pool = pool_create(name="Lab", slug="lab")
        self.tenant = tenant_create(name="Vision", slug="vision")
        self.other = tenant_create(name="Lang", slug="nlp")
        self.user = make_user("alice")
        membership_set(user=self.user, tenant=self.tenant, role=TenantRole.MEMBER)
        self.actor = Actor.for_user(self.user)

    def _submit(self, tenant, name):
        return job_submit(
            tenant=tenant,
            pool=self.pool,
            name=name,
            image=IMAGE,
            actor=self.actor,
            resources={"cpu_millicores_min": 500, "memory_mib_min": 256},
        )

    def _cancel_elsewhere(self, job):
        try:
            job_cancel(job=job, actor=self.actor, message="changed my mind")
        finally:
            connection.close()

    def test_member_sees_own_jobs_and_live_events(self):
        mine = self._submit(self.tenant, "resnet-train")
        self._submit(self.other, "someone-elses")
        node = node_register(
            pool=self.pool, name="cpu-7", actor=self.actor, cpu_millicores=16000, memory_mib=65536
        )
        node_mark_ready(node=node_verify(node=node, actor=self.actor), actor=self.actor)
        assert mine.pk in scheduling_pass().placed
        with chromium_page() as page:
            sign_in(page, self.live_server_url, "alice", "pw-alice")
            row = page.locator(f"tr[data-job='{mine.pk}']")
            expect(row).to_contain_text("resnet-train")
            expect(row).to_contain_text("Leased")
            expect(row).to_contain_text("cpu-7")  # where it landed
            expect(page.locator("#job-table")).not_to_contain_text("someone-elses")
            page.wait_for_function("window.jobEventsSocketOpen === true")
            # Playwright's loop owns this thread; the service runs where a view would, in another
            cancel = threading.Thread(target=self._cancel_elsewhere, args=(mine,))
            cancel.start()
            cancel.join()
            # the websocket event lands in the feed, and htmx refreshes the table
            expect(page.locator("#live-events")).to_contain_text("cancelled_by_user")
            expect(row).to_contain_text("Cancelled")

    def test_console_requires_sign_in(self):
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/")
            expect(page).to_have_url(f"{self.live_server_url}/accounts/login/?next=/")
