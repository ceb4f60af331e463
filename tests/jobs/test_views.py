"""The tenant console's job pages through Django's test client: who may open what (another
tenant's job is a 404, never a 403), submit with the API's own validation, cancel with a
confirmation step, the timeline's cursor, pagination and query counts."""

import io
import threading
import time
import uuid

import pytest
from channels.testing import ChannelsLiveServerTestCase
from django.db import connection
from django.urls import reverse
from playwright.sync_api import expect

from config.builders import (
    build_node,
    build_person,
    build_pool,
    build_priority_class,
    build_tenant,
    submit_job,
)
from jobs import artifacts
from jobs.models import Job
from jobs.services import job_cancel
from pools.actors import Actor
from pools.api import throttles
from pools.choices import TenantRole
from pools.models import CreditAccount, Quota
from scheduling.passes import scheduling_pass
from tests.browser import chromium_page, sign_in

TEST_IMAGE = "127.0.0.1:5000/computepool/busybox:test"


@pytest.fixture
def pool(db):
    return build_pool("lab", name="Lab")


@pytest.fixture
def tenant(db):
    return build_tenant("vision", name="Vision")


@pytest.fixture
def other(db):
    return build_tenant("nlp", name="Lang")


@pytest.fixture
def alice(tenant):
    return build_person("alice", tenant=tenant)


@pytest.fixture
def browser(client, alice):
    client.force_login(alice)
    return client


def form(pool, tenant, **fields):
    """A submit form as the browser posts it: a custom CPU shape and the test image's tag."""
    return {
        "tenant": tenant.slug,
        "pool": pool.slug,
        "name": "train",
        "shape_mode": "custom",
        "cpu_millicores_min": "500",
        "memory_mib_min": "256",
        "image": TEST_IMAGE,
        "command": "sh -c 'echo hi'",
        "max_runtime_s": "600",
        "network_mode": "none",
        "retry_max_attempts": "1",
        "retry_backoff_s": "30",
        "retry_on": ["node_lost"],
    } | fields


def test_pages_need_sign_in(client, pool, tenant):
    job = submit_job(pool, tenant)
    for url in ("/", "/console/jobs", "/console/jobs/new", f"/console/jobs/{job.pk}"):
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_dashboard_counts_my_jobs_by_state_with_quota_bars(browser, pool, tenant, other):
    submit_job(pool, tenant, "mine-1", cpu=2500)
    submit_job(pool, tenant, "mine-2", cpu=2500)
    submit_job(pool, other, "theirs")
    build_node(pool, "cpu-1", cpu=4000, memory=8192)
    Quota.objects.create(tenant=tenant, pool=pool, cpu_millicores=4000, memory_mib=8192)
    CreditAccount.objects.create(tenant=tenant, pool=pool, balance=12)
    scheduling_pass()  # one job fits the node, the other waits
    html = browser.get("/").content.decode()
    assert "theirs" not in html
    assert "mine-1" in html and "mine-2" in html
    # one queued, one leased: counts as text, beside the state's name
    assert '<span class="count">1</span> <span class="state state-queued">Queued</span>' in html
    assert '<span class="count">1</span> <span class="state state-leased">Leased</span>' in html
    assert "2.5 cores of 4 cores (62%)" in html  # the CPU bar, in cores: the leased job's 2500m
    assert "credit balance <strong>12.0000</strong>" in html
    assert "nlp" not in html  # no other tenant anywhere, not even its quota


def test_list_pages_are_paginated_with_bounded_queries(
    browser, pool, tenant, django_assert_max_num_queries
):
    for index in range(30):
        submit_job(pool, tenant, f"job-{index:02}")
    with django_assert_max_num_queries(12):
        first = browser.get("/console/jobs")
    assert first.content.decode().count("<tr data-job=") == 25
    second = browser.get("/console/jobs?page=2")
    assert second.content.decode().count("<tr data-job=") == 5
    with django_assert_max_num_queries(12):
        assert browser.get("/console/jobs/table?page=2").status_code == 200
    with django_assert_max_num_queries(16):
        assert browser.get("/").status_code == 200
    queued = browser.get("/console/jobs?state=queued").content.decode()
    assert queued.count("<tr data-job=") == 25
    assert "No jobs yet" in browser.get("/console/jobs?state=running").content.decode()


def test_another_tenants_job_is_404_on_every_page(browser, pool, other):
    job = submit_job(pool, other, "theirs")
    for url in (
        f"/console/jobs/{job.pk}",
        f"/console/jobs/{job.pk}/timeline",
        f"/console/jobs/{job.pk}/log",
        f"/console/jobs/{job.pk}/explain",
        f"/console/jobs/{job.pk}/cancel",
    ):
        assert browser.get(url).status_code == 404, url
    assert browser.post(f"/console/jobs/{job.pk}/cancel").status_code == 404
    job.refresh_from_db()
    assert job.state == "queued"


def test_job_page_shows_its_timeline_and_the_tag_with_its_digest(browser, pool, tenant):
    job = submit_job(pool, tenant, "train", image_requested=TEST_IMAGE)
    html = browser.get(f"/console/jobs/{job.pk}").content.decode()
    assert '<ol id="timeline"' in html and 'aria-live="polite"' in html
    assert f'data-event="{job.events.get().pk}" data-reason="submitted"' in html
    assert TEST_IMAGE in html and "resolved to" in html and "@sha256:" in html
    assert "Why is this pending?" in html  # queued: the explanation is on the page


def test_timeline_gives_only_the_events_after_the_cursor(browser, pool, tenant):
    job = submit_job(pool, tenant)
    first = job.events.get()
    build_node(pool, "cpu-1")
    scheduling_pass()
    newer = list(job.events.filter(pk__gt=first.pk).values_list("pk", flat=True))
    assert newer
    html = browser.get(f"/console/jobs/{job.pk}/timeline?after={first.pk}").content.decode()
    assert f'data-event="{first.pk}"' not in html
    assert all(f'data-event="{pk}"' in html for pk in newer)
    assert 'id="job-summary" hx-swap-oob="true"' in html  # the summary follows the state
    assert "Leased" in html
    assert browser.get(f"/console/jobs/{job.pk}/timeline?after=x").status_code == 400


def test_submit_shows_the_serializers_field_errors_inline(browser, pool, tenant):
    response = browser.post(
        "/console/jobs/new", form(pool, tenant, name="", cpu_millicores_min="", image="UPPER:")
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert 'id="e-name"' in html and 'id="e-cpu_millicores_min"' in html
    assert 'id="e-image"' in html
    assert not Job.objects.exists()


def test_submit_form_text_errors_are_inline_too(browser, pool, tenant):
    html = browser.post(
        "/console/jobs/new", form(pool, tenant, command="sh -c 'oops", ports="80, http")
    ).content.decode()
    assert "Not a command line" in html and "Port numbers" in html
    assert not Job.objects.exists()


def test_refused_input_and_egress_addresses_show_inline(browser, pool, tenant):
    html = browser.post(
        "/console/jobs/new",
        form(
            pool,
            tenant,
            inputs="https://example.org/ok.csv\nhttp://169.254.169.254/latest/meta-data/x",
            network_mode="pool",
            egress_allow="127.0.0.1:5432",
        ),
    ).content.decode()
    assert 'id="e-inputs"' in html and "1 url: 169.254.169.254 is link-local" in html
    assert 'id="e-network_mode"' in html and "127.0.0.1 is loopback" in html
    assert not Job.objects.exists()


def test_submit_queues_the_job_and_opens_its_page(browser, pool, tenant, alice):
    response = browser.post(
        "/console/jobs/new",
        form(
            pool,
            tenant,
            env="MODE=fast",
            ports="8080",
            checkpointable="on",
            network_mode="pool",
            ingress_allow="203.0.113.0/24, 198.51.100.7",
        ),
    )
    job = Job.objects.get()
    assert job.network_policy["ingress_allow"] == ["203.0.113.0/24", "198.51.100.7/32"]
    assert response.status_code == 302 and response["Location"] == f"/console/jobs/{job.pk}"
    assert job.state == "queued" and job.submitted_by == alice
    assert job.image_requested == TEST_IMAGE and "@sha256:" in job.image
    assert job.command == ["sh", "-c", "echo hi"] and job.env == {"MODE": "fast"}
    assert job.ports == [8080] and job.checkpointable and job.max_runtime_s == 600
    assert job.resources["cpu_millicores_min"] == 500


def test_a_shape_that_never_fits_is_refused_before_queueing(browser, pool, tenant):
    build_node(pool, "cpu-1", cpu=4000)
    response = browser.post("/console/jobs/new", form(pool, tenant, cpu_millicores_min="64000"))
    assert response.status_code == 422
    html = response.content.decode()
    assert "Not queued (never_fits)" in html and "no node of this pool can ever hold" in html
    assert not Job.objects.exists()


def test_will_it_fit_now_asks_the_explain_service(browser, pool, tenant):
    build_node(pool, "cpu-1", cpu=4000)
    fits = browser.post("/console/jobs/new/preview", form(pool, tenant)).content.decode()
    assert "Yes, it fits now" in fits and "cpu-1" in fits
    too_big = form(pool, tenant, cpu_millicores_min="8000")
    html = browser.post("/console/jobs/new/preview", too_big).content.decode()
    assert "can never fit" in html
    assert not Job.objects.exists()  # a preview reserves and queues nothing


def test_the_consoles_placement_searches_count_like_the_apis(
    browser, pool, tenant, settings, monkeypatch
):
    settings.CACHES = settings.CACHES | {
        "throttle": settings.CACHES["throttle"] | {"KEY_PREFIX": f"test-{uuid.uuid4().hex}"}
    }
    monkeypatch.setattr(throttles, "PERMITS", throttles.SharedPermits())
    settings.PLACEMENT_THROTTLE_RATE = "2/hour"
    build_node(pool, "cpu-1", cpu=4000)
    assert (
        "Yes, it fits now"
        in browser.post("/console/jobs/new/preview", form(pool, tenant)).content.decode()
    )
    assert browser.post("/console/jobs/new", form(pool, tenant)).status_code == 302
    refused = browser.post("/console/jobs/new", form(pool, tenant))
    assert refused.status_code == 429 and "Too many placement searches" in refused.content.decode()
    assert Job.objects.count() == 1
    job = Job.objects.get()
    # the job page still says why it waits, from the last pass, without a search
    assert browser.get(f"/console/jobs/{job.pk}/explain").status_code == 200


def test_only_the_priority_classes_open_to_me_are_offered(browser, pool, tenant):
    build_priority_class("batch", 10)
    build_priority_class("urgent", 100, minimum_role=TenantRole.ADMIN)
    html = browser.get("/console/jobs/new").content.decode()
    assert 'value="batch"' in html and 'value="urgent"' not in html
    options = browser.get(f"/console/jobs/new/priorities?tenant={tenant.slug}").content.decode()
    assert 'value="batch"' in options and 'value="urgent"' not in options
    refused = browser.post("/console/jobs/new", form(pool, tenant, priority_class="urgent"))
    assert "No priority class of this name is open to you" in refused.content.decode()


def test_cancel_asks_for_confirmation_first(browser, pool, tenant):
    job = submit_job(pool, tenant)
    confirm = browser.get(f"/console/jobs/{job.pk}/cancel").content.decode()
    assert "Yes, cancel job" in confirm
    job.refresh_from_db()
    assert job.state == "queued"  # asking is not cancelling
    response = browser.post(f"/console/jobs/{job.pk}/cancel", {"message": "wrong data"})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert job.events.last().message == "wrong data"
    again = browser.post(f"/console/jobs/{job.pk}/cancel")
    assert again.status_code == 409  # it ended: said, not a 500


def test_log_tail_and_outputs_to_download(browser, pool, tenant, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    job = submit_job(pool, tenant)
    artifacts.job_log_append(job=job, attempt=1, text="epoch 1\nepoch 2\n")
    artifacts.job_output_store(job=job, attempt=1, name="model.txt", fileobj=io.BytesIO(b"w"))
    log = browser.get(f"/console/jobs/{job.pk}/log").content.decode()
    assert "epoch 2" in log and 'hx-trigger="every 2s"' in log  # live while it has not ended
    page = browser.get(f"/console/jobs/{job.pk}").content.decode()
    link = reverse("job-output-file", args=[job.pk, "model.txt"])
    assert f'href="{link}"' in page
    assert b"".join(browser.get(link).streaming_content) == b"w"


def test_explain_says_why_a_job_waits(browser, pool, tenant):
    build_node(pool, "small", cpu=4000, memory=8192)
    blocker = submit_job(pool, tenant, "blocker", cpu=2500)
    waiting = submit_job(pool, tenant, "waiting", cpu=2500)
    scheduling_pass()
    blocker.refresh_from_db()
    assert blocker.state == "leased"
    html = browser.get(f"/console/jobs/{waiting.pk}/explain").content.decode()
    assert "Why is this pending?" in html
    assert "Nearest miss: node <strong>small</strong>" in html
    assert "What you can do:" in html


def test_operator_console_nav_is_unchanged_for_members(browser):
    html = browser.get("/").content.decode()
    assert "/console/nodes" not in html
    for url in ("/console/jobs", "/console/jobs/new", "/console/leases", "/console/tokens"):
        assert f'href="{url}"' in html


@pytest.mark.browser
class TestJobsConsole(ChannelsLiveServerTestCase):
    """The dashboard in a real browser, over daphne: its job table follows the live events."""

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
            page.wait_for_selector("[data-live-state=open]", state="attached")
            # Playwright's loop owns this thread; the service runs where a view would, in another
            cancel = threading.Thread(target=self._cancel_elsewhere, args=(mine,))
            cancel.start()
            cancel.join()
            # the websocket event makes htmx refresh the table, without a reload
            expect(row).to_contain_text("Cancelled")

    def test_console_requires_sign_in(self):
        with chromium_page() as page:
            page.goto(f"{self.live_server_url}/")
            expect(page).to_have_url(f"{self.live_server_url}/accounts/login/?next=/")

    def test_a_socket_the_server_refuses_is_not_retried(self):
        # Each follower shows its state on <body data-probe-KEY>, so they never mix.
        follow = """([path, key]) => window.followSocket(path, {
            opened() {}, message() {},
            show(state) { document.body.setAttribute(`data-probe-${key}`, state); },
        })"""
        with chromium_page() as page:
            sign_in(page, self.live_server_url, "alice", "pw-alice")
            attempts = []
            page.on("websocket", lambda socket: attempts.append(socket.url))

            def tried(path: str) -> int:
                return len([url for url in attempts if url.endswith(path)])

            # No job 999999: the consumer closes the socket with 4403 at once; the page stops.
            page.evaluate(follow, ["/ws/jobs/999999/", "gone"])
            page.wait_for_selector("body[data-probe-gone=refused]", state="attached")
            page.wait_for_timeout(3000)  # the old page retried after 0.5, 1, 2 s …
            assert tried("/ws/jobs/999999/") == 1
            # A handshake the server refuses (no route: a bare 1006 in the browser, like a
            # timeout under load) is tried a few times while the server answers, then given up.
            page.evaluate(follow, ["/ws/nowhere/", "nowhere"])
            page.wait_for_selector(
                "body[data-probe-nowhere=refused]", state="attached", timeout=20000
            )
            page.wait_for_timeout(2000)
            assert tried("/ws/nowhere/") == 4
            # With no server answering (the page's own HEAD fails too) it keeps trying.
            page.route(
                "**/*",
                lambda route: (
                    route.abort() if route.request.method == "HEAD" else route.continue_()
                ),
            )
            page.evaluate(follow, ["/ws/down/", "down"])
            deadline = time.monotonic() + 15
            while tried("/ws/down/") < 4 and time.monotonic() < deadline:
                page.wait_for_timeout(200)
            page.wait_for_timeout(1500)  # the 4th failure handled: with answers it would stop
            assert tried("/ws/down/") >= 4
            assert page.get_attribute("body", "data-probe-down") == "reconnecting"


def test_explain_says_why_the_pass_and_now_differ_and_gives_only_advice_that_works(
    browser, pool, tenant
):
    from jobs.models import Job

    build_node(pool, "small", cpu=4000, memory=8192)
    waiting = submit_job(pool, tenant, "waiting", cpu=1000)
    gate = {
        "code": "backfill_would_delay_head",
        "message": "a job of another tenant, ahead of it in the queue, waits for this capacity",
        "advice": "wait: it runs once the job ahead of it has started",
    }
    Job.objects.filter(pk=waiting.pk).update(pending_reason=gate)
    html = browser.get(f"/console/jobs/{waiting.pk}/explain").content.decode()
    assert "has room for it, but the queue holds it for the job ahead (above)" in html
    assert "it starts at the next pass" not in html
    assert "wait: it runs once the job ahead of it has started." in html
    assert "shorter maximum runtime" not in html


def test_the_form_takes_required_node_features_as_a_comma_list(browser, pool, tenant):
    build_node(pool, "cpu-1", features=["avx512", "sgx"])
    response = browser.post(
        "/console/jobs/new", form(pool, tenant, node_features_required="avx512, sgx")
    )
    assert response.status_code == 302, response.content.decode()
    assert Job.objects.get().resources["node_features_required"] == ["avx512", "sgx"]
    html = browser.post(
        "/console/jobs/new", form(pool, tenant, name="bad", node_features_required="AVX512")
    ).content.decode()
    assert 'id="e-node_features_required"' in html
    assert 'name="node_features_required"' in browser.get("/console/jobs/new").content.decode()
