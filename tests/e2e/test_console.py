"""The tenant console end to end, in headless Chromium, against the whole stack
(tests/e2e/conftest.py: a real agent running containers on the real Docker engine).

The console is served over ASGI by daphne in its own process (websockets need it), beside the
stack's WSGI server that the agent talks to: both use the test database and the same Redis
channel layer, so a transition the agent reports reaches the browser's socket. Each main page's
screenshot is saved under test-artifacts/ (gitignored)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from config.builders import build_tenant, submit_job
from jobs.services import job_cancel
from pools.actors import Actor
from scheduling import tasks as scheduling_tasks
from tests.browser import chromium_page, sign_in

from .conftest import screenshot

pytestmark = [pytest.mark.docker, pytest.mark.browser]

IMAGE = "127.0.0.1:5000/computepool/busybox:test"
ACTOR = Actor.system("e2e-console")


@pytest.fixture(scope="module")
def browser_page(console):
    with chromium_page() as page:
        page.set_viewport_size({"width": 1280, "height": 900})
        sign_in(page, console, "e2e-alice", "pw-e2e-alice")
        yield page


@pytest.fixture
def page(browser_page):
    yield browser_page
    browser_page.unroute_all()
    browser_page.set_viewport_size({"width": 1280, "height": 900})


def submitted(stack, name, command, **fields) -> int:
    response = stack.submit(name, command, **fields)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def timeline(page) -> list[tuple[int, str]]:
    items = page.locator("#timeline li")
    return items.evaluate_all("els => els.map(e => [Number(e.dataset.event), e.dataset.reason])")


def api_timeline(stack, job_id) -> list[tuple[int, str]]:
    return [[e["id"], e["reason"]] for e in stack.api("GET", f"jobs/{job_id}/events").json()]


def wait_live(page) -> None:
    expect(page.locator("[data-live-socket]")).to_have_attribute("data-live-state", "open")


def test_submit_in_the_form_watch_it_succeed_live_and_download_the_output(stack, console, page):
    page.goto(f"{console}/console/jobs/new")
    page.fill("#f-name", "console-greeting")
    page.check("#f-mode-custom")
    page.fill("#f-cpu_millicores_min", "100")
    page.fill("#f-memory_mib_min", "64")
    page.fill("#f-image", IMAGE)
    page.fill("#f-command", "sh -c 'echo hello from the console; echo hello > /outputs/hi.txt'")
    page.click("button:has-text('Will it fit now?')")
    expect(page.locator("#preview")).to_contain_text("Yes, it fits now")
    screenshot(page, "submit")
    page.click("button:has-text('Submit job')")
    page.wait_for_url(re.compile(r"/console/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    summary = page.locator("#job-summary")
    expect(summary).to_contain_text("Queued")
    expect(summary.locator(".digest")).to_contain_text("@sha256:")  # the tag's digest
    wait_live(page)
    page.evaluate("window.notReloaded = true")  # a reload would lose it

    stack.drive(job_id, "succeeded")
    expect(page.locator("#timeline li[data-reason=exited_zero]")).to_have_count(1)
    expect(summary).to_contain_text("Succeeded")
    assert page.evaluate("window.notReloaded") is True
    assert timeline(page) == api_timeline(stack, job_id)  # every transition, in order
    expect(page.locator("#job-log")).to_contain_text("hello from the console")
    screenshot(page, "job-succeeded")
    with page.expect_download() as download:
        page.click("a:has-text('hi.txt')")
    assert Path(download.value.path()).read_bytes() == b"hello\n"


def test_a_dropped_socket_reconnects_and_fetches_every_missed_event(stack, console, page):
    job_id = submitted(stack, "dropped", ["sh", "-c", "echo bye"])
    routes, server_down = [], {"now": False}

    def route(socket):
        routes.append(socket)
        if not server_down["now"]:
            socket.connect_to_server()
        # else: the page believes it is connected, and nothing ever arrives (a silent drop)

    page.route_web_socket(re.compile(r"/ws/jobs/"), route)
    page.goto(f"{console}/console/jobs/{job_id}")
    wait_live(page)
    server_down["now"] = True
    routes[-1].close()  # the connection drops
    expect(page.locator("[data-live-socket]")).to_have_attribute("data-live-state", "open")
    page.wait_for_function("document.querySelectorAll('#timeline li').length === 1")
    before = len(routes)

    stack.drive(job_id, "succeeded")  # every transition happens while the page hears nothing
    assert len(timeline(page)) == 1 and len(routes) == before

    server_down["now"] = False
    routes[-1].close()  # the dead connection is noticed: reconnect, then fetch what was missed
    expect(page.locator("#timeline li[data-reason=exited_zero]")).to_have_count(1)
    events = timeline(page)
    assert events == api_timeline(stack, job_id)
    assert len({pk for pk, _ in events}) == len(events)  # none twice
    expect(page.locator("#job-summary")).to_contain_text("Succeeded")


def test_a_pending_jobs_explanation_and_cancelling_another_with_confirmation(stack, console, page):
    half = stack.node().cpu_millicores_allocatable * 6 // 10
    resources = {"cpu_millicores_min": half, "memory_mib_min": 64}
    blocker = submitted(stack, "blocker", ["sleep", "60"], resources=resources)
    stack.drive(blocker, "running")
    waiting = submitted(stack, "waiting", ["sh", "-c", "exit 0"], resources=resources)
    scheduling_tasks.scheduling_pass()  # records why it waits

    page.goto(f"{console}/console/jobs/{waiting}")
    explain = page.locator("#explain")
    expect(explain).to_contain_text("Why is this pending?")
    expect(explain).to_contain_text(f"Nearest miss: node {stack.agent.node_name}")
    expect(explain).to_contain_text("cpu")
    expect(explain).to_contain_text("What you can do: wait")
    screenshot(page, "job-pending")

    page.goto(f"{console}/console/jobs/{blocker}")
    page.click("#cancel-link")
    expect(page.locator("#cancel-confirm")).to_contain_text("Yes, cancel job")
    assert stack.job(blocker)["state"] == "running"  # asking is not cancelling
    screenshot(page, "job-cancel-confirm")
    page.fill("#f-cancel-message", "blocks my other job")
    page.click("button:has-text('Yes, cancel job')")
    expect(page.locator("#job-summary")).to_contain_text("Cancelled")
    expect(page.locator("#timeline li[data-reason=cancelled_by_user]")).to_contain_text(
        "blocks my other job"
    )
    stack.drive(waiting, "succeeded")  # the capacity came back: the waiting job runs


def test_another_tenants_job_page_is_404(stack, console, page):
    other = build_tenant("e2e-other", name="E2E other")
    theirs = submit_job(stack.pool, other, "theirs", cpu=100, memory=64, actor=ACTOR)
    try:
        response = page.goto(f"{console}/console/jobs/{theirs.pk}")
        assert response.status == 404
        page.goto(f"{console}/console/jobs")
        expect(page.locator("#job-table")).not_to_contain_text("theirs")
    finally:
        job_cancel(job=theirs, actor=ACTOR)


def test_screenshots_of_the_main_pages_at_desktop_and_phone_widths(stack, console, page):
    pages = {
        "dashboard": "/",
        "jobs": "/console/jobs",
        "leases": "/console/leases",
        "tokens": "/console/tokens",
        "members": "/console/members",
    }
    for width, suffix in ((1280, ""), (390, "-phone")):
        page.set_viewport_size({"width": width, "height": 844})
        for name, path in pages.items():
            page.goto(f"{console}{path}")
            expect(page.locator("h1")).to_be_visible()
            # nothing wider than the screen but the tables, which scroll inside themselves
            overflow = page.evaluate("document.documentElement.scrollWidth > window.innerWidth")
            assert not overflow, f"{path} overflows at {width} px"
            screenshot(page, f"{name}{suffix}")
    page.goto(f"{console}/console/jobs/new")
    screenshot(page, "submit-phone")
