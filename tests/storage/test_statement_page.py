"""The job page says what is ephemeral and what persists in plain sentences (jobs/display.py
`storage_sentences`), and its output link downloads the exact bytes that are stored encrypted:
in headless Chromium, over daphne."""

import hashlib
import io
import os
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from channels.testing import ChannelsLiveServerTestCase
from django.test import override_settings

from config.builders import SYSTEM, build_person, build_pool, build_tenant, submit_job
from jobs import artifacts, display, retention
from jobs.encryption_at_rest import CHUNK_BYTES
from jobs.services import job_cancel
from tests.browser import chromium_page, sign_in

pytestmark = pytest.mark.browser

MEDIA = tempfile.mkdtemp(prefix="statement-page-")


@override_settings(MEDIA_ROOT=MEDIA)
class TestJobPageStorage(ChannelsLiveServerTestCase):
    serve_static = True

    def setUp(self):
        self.pool = build_pool("lab", name="Lab")
        self.tenant = build_tenant("vision", name="Vision")
        build_person("alice", tenant=self.tenant)

    def test_the_page_says_what_is_kept_and_downloads_the_plaintext(self):
        retention.retention_set(tenant=self.tenant, pool=self.pool, days=5, actor=SYSTEM)
        job = submit_job(self.pool, self.tenant, "weights", cpu=500, memory=256)
        data = os.urandom(CHUNK_BYTES + CHUNK_BYTES // 3)  # two chunks at rest
        output = artifacts.job_output_store(
            job=job, attempt=1, name="weights.bin", fileobj=io.BytesIO(data)
        )
        assert data[:64] not in (Path(MEDIA) / output.file.name).read_bytes()
        job = job_cancel(job=job, actor=SYSTEM)
        until = display._when((job.state_changed_at + timedelta(days=5)).isoformat())

        with chromium_page() as page:
            sign_in(page, self.live_server_url, "alice", "pw-alice")
            page.goto(f"{self.live_server_url}/console/jobs/{job.pk}")
            kept = page.locator("[data-storage]")
            page.wait_for_selector("[data-storage]")
            text = kept.inner_text()
            assert "What is kept" in text
            assert "Deleted when an attempt ends: container filesystem" in text
            assert (
                "Outputs are kept in the control plane, encrypted under the tenant's own key, "
                f"until {until} (5 days after the job ended); download them here or from "
                f"/api/v1/jobs/{job.pk}/outputs/."
            ) in text
            with page.expect_download() as download:
                page.click("a:has-text('weights.bin')")
            got = Path(download.value.path()).read_bytes()
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest() == output.sha256
