"""The tenant console in a real browser: jobs appear, and events arrive live."""

import threading

import pytest
from channels.testing import ChannelsLiveServerTestCase
from django.db import connection
from playwright.sync_api import expect

from config.builders import build_node, build_person, build_pool, build_tenant, submit_job
from jobs.services import job_cancel
from pools.actors import Actor
from scheduling.passes import scheduling_pass
from tests.browser import chromium_page, sign_in


@pytest.mark.browser
class TestJobsConsole(ChannelsLiveServerTestCase):
    serve_static = True

    def setUp(self):
        self.pool = build_pool("lab", name="Lab")
        self.tenant = build_tenant("vision", name="Vision")
        self.other = build_tenant("nlp", name="Lang")
        self.user = build_person("alice", tenant=self.tenant)
        self.actor = Actor.for_user(self.user)

    def _submit(self, tenant, name):
        return submit_job(self.pool, tenant, name, cpu=500, memory=256, actor=self.actor)

    def _cancel_elsewhere(self, job):
        try:
            job_cancel(job=job, actor=self.actor, message="changed my mind")
        finally:
            connection.close()

    def test_member_sees_own_jobs_and_live_events(self):
        mine = self._submit(self.tenant, "resnet-train")
        self._submit(self.other, "someone-elses")
        build_node(self.pool, "cpu-7", cpu=16000, memory=65536, actor=self.actor)
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
