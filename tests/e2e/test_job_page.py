"""The job page, submit and dashboard journeys (issue 22) in headless Chromium against the
whole stack (tests/e2e/conftest.py: a real agent running containers on the real Docker
engine). Screenshots at 1280 and 390 px under test-artifacts/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser import chromium_page, sign_in

from .conftest import screenshot

pytestmark = [pytest.mark.docker, pytest.mark.browser]

IMAGE = "127.0.0.1:5000/computepool/busybox:test"
BURN = ["sh", "-c", "timeout 20 sh -c 'while :; do :; done'; echo burnt"]


@pytest.fixture(scope="module")
def page(console):
    with chromium_page() as page:
        page.set_viewport_size({"width": 1280, "height": 900})
        sign_in(page, console, "e2e-alice", "pw-e2e-alice")
        yield page


def no_overflow(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_job_burning_one_core_reads_at_least_half_a_core_on_the_page(stack, console, page):
    # The container's CPU is capped at its grant (NanoCpus): a grant of one core lets it burn one.
    resources = {"cpu_millicores_min": 1000, "memory_mib_min": 64}
    response = stack.submit("burn", BURN, resources=resources)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    stack.drive(job_id, "running")
    job = stack.drive(
        job_id,
        lambda job: (
            (job["usage"]["peak"].get("cpu_millicores") or 0) >= 500
            or job["state"] not in ("running", "starting")
        ),
        timeout=40,
    )
    assert job["usage"]["peak"]["cpu_millicores"] >= 500, job

    page.goto(f"{console}/console/jobs/{job_id}")
    cpu = page.locator("tr[data-measure=cpu_millicores]")
    peak = float(cpu.locator("td[data-label=Peak]").get_attribute("data-raw"))
    assert peak >= 500
    expect(cpu.locator("td[data-label=Granted]")).to_have_text("1 core")
    # the command with its quoting, durations
    expect(page.locator("code.command")).to_have_text(
        "sh -c 'timeout 20 sh -c '\"'\"'while :; do :; done'\"'\"'; echo burnt'"
    )
    expect(page.locator("#job-durations")).to_contain_text("Ran for")
    expect(page.locator("#job-durations")).to_contain_text("of 3600 s maximum")
    screenshot(page, "job-usage")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    wide = page.evaluate(
        "[...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right"
        " > window.innerWidth + 1 && !e.closest('table, .trace-chart')).map(e => e.tagName +"
        " '.' + e.className).slice(0, 5)"
    )
    assert not wide, f"wider than the phone at 390 px: {wide}"
    screenshot(page, "job-usage-phone")
    page.set_viewport_size({"width": 1280, "height": 900})
    stack.drive(job_id, "succeeded", timeout=40)


def test_the_log_opens_at_its_newest_line_downloads_and_the_job_clones(stack, console, page):
    lines = "for i in $(seq 1 300); do echo line $i; done"
    response = stack.submit("many-lines", ["sh", "-c", lines])
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    stack.drive(job_id, "succeeded")
    page.goto(f"{console}/console/jobs/{job_id}")
    log = page.locator("#job-log pre.log")
    expect(log).to_contain_text("line 300")
    page.wait_for_function(
        "(() => { const p = document.querySelector('#job-log pre.log');"
        " return p && p.scrollHeight - p.scrollTop - p.clientHeight < 4; })()"
    )
    expect(page.locator("#log-follow")).to_be_checked()
    with page.expect_download() as download:
        page.click("#log-download")
    text = Path(download.value.path()).read_text()
    assert "line 1\n" in text and "line 300\n" in text

    page.click("#clone-link")
    page.wait_for_url(re.compile(r"/console/jobs/new\?from="))
    expect(page.locator("#f-command")).to_have_value(f"sh -c '{lines}'")
    expect(page.locator("#f-image")).to_have_value(IMAGE)
    page.click("button:has-text('Submit job')")
    page.wait_for_url(re.compile(r"/console/jobs/\d+$"))
    assert int(page.url.rsplit("/", 1)[1]) != job_id


def test_submit_defaults_to_a_ready_pool_and_shows_every_error_in_one_round(stack, console, page):
    for width, suffix in ((1280, ""), (390, "-phone")):
        page.set_viewport_size({"width": width, "height": 844})
        page.goto(f"{console}/console/jobs/new")
        expect(page.locator("#f-pool")).to_have_value(stack.pool.slug)  # the pool with a node
        expect(page.locator("#f-cpu_millicores_min")).to_be_hidden()  # catalogue mode
        page.check("#f-mode-custom")
        expect(page.locator("#f-cpu_millicores_min")).to_be_visible()
        expect(page.locator("#f-shape")).to_be_hidden()
        assert no_overflow(page), f"the submit form overflows at {width} px"
        # three kinds of error at once: the text's (ports), the serializer's (name), the image's
        page.fill("#f-ports", "http")
        page.fill("#f-image", "docker.io/library/not-allowed:1")
        page.fill("#f-cpu_millicores_min", "100")
        page.fill("#f-memory_mib_min", "64")
        page.click("button:has-text('Submit job')")
        summary = page.locator("#error-summary")
        expect(summary).to_be_focused()
        expect(summary).to_contain_text("Ports")
        expect(summary).to_contain_text("Name")
        expect(summary).to_contain_text("Image")
        expect(page.locator("#e-image")).to_be_visible()  # beside Image, not a banner
        expect(page.locator("#refusal")).to_have_count(0)
        assert no_overflow(page)
        screenshot(page, f"submit-errors{suffix}")
    page.set_viewport_size({"width": 1280, "height": 900})


def test_dashboard_updates_live_in_human_units_and_cards_on_a_phone(stack, console, page):
    page.goto(f"{console}/")
    expect(page.locator("[data-live-socket]")).to_have_attribute("data-live-state", "open")
    tile = page.locator("#state-counts a[href$='state=succeeded'] .count")
    before = int(tile.inner_text())
    response = stack.submit("tile", ["sh", "-c", "exit 0"])
    job_id = response.json()["id"]
    stack.drive(job_id, "succeeded")
    # no reload: the live part was re-fetched (other jobs of this module may end meanwhile)
    expect(tile).not_to_have_text(str(before))
    assert int(tile.inner_text()) >= before + 1
    expect(page.locator("#dashboard-live")).to_contain_text("cores")  # the pool now in use
    assert "millicores" not in page.locator("#dashboard-live").inner_text()
    screenshot(page, "dashboard-live")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    state = page.locator("#job-table tr[data-job] td[data-label=State]").first
    state.scroll_into_view_if_needed()
    box = state.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box  # not off-screen sideways
    assert no_overflow(page)
    screenshot(page, "dashboard-live-phone")
    page.set_viewport_size({"width": 1280, "height": 900})
