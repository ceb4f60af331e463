"""The operators' console end to end, in headless Chromium, against the whole stack
(tests/e2e/conftest.py: a real agent's node, jobs run in containers on the real Docker engine).

The console is served over ASGI by daphne in its own process (websockets need it), beside the
stack's WSGI server that the agent talks to: both use the test database and the same Redis
channel layer, so a node's transition reaches the browser's socket. An operator drains the
agent's node with a deadline and a reason on its page, and the node list in another tab shows
it draining without a reload; a dropped socket reconnects and fetches the change it missed.
Screenshots of each operations page go to test-artifacts/ (gitignored)."""

from __future__ import annotations

import re
import threading

import pytest
from django.db import connection
from playwright.sync_api import expect

from config.builders import build_person
from leases.models import Lease
from nodes import services as node_services
from nodes.models import NodeEvent
from pools.actors import Actor
from pools.choices import PlatformRole
from scheduling import health
from tests.browser import chromium_page, sign_in

from .conftest import screenshot

pytestmark = [pytest.mark.docker, pytest.mark.browser]


@pytest.fixture(scope="module")
def olga(stack, django_db_blocker):
    with django_db_blocker.unblock():
        return build_person("e2e-olga", platform_role=PlatformRole.OPERATOR)


@pytest.fixture
def page(console, olga):
    with chromium_page() as page:
        page.set_viewport_size({"width": 1280, "height": 900})
        page.on("dialog", lambda dialog: dialog.accept())  # every action's confirmation
        sign_in(page, console, "e2e-olga", "pw-e2e-olga")
        yield page


def elsewhere(service, **kwargs):
    """Run a service where a request would: Playwright's event loop owns the test's thread."""

    def run():
        try:
            service(**kwargs)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def wait_live(page):
    expect(page.locator("body")).to_have_attribute("data-ops-live", "open")


def test_an_operator_drains_a_node_and_the_list_shows_it_live(stack, console, page):
    node = stack.node()
    routes, server_down = [], {"now": False}

    def route(socket):
        routes.append(socket)
        if not server_down["now"]:
            socket.connect_to_server()
        # else: the page believes it is connected, and nothing ever arrives (a silent drop)

    page.route_web_socket(re.compile(r"/ws/nodes/$"), route)
    page.goto(f"{console}/console/nodes?pool={stack.pool.slug}")
    wait_live(page)
    page.evaluate("window.notReloaded = true")
    row = page.locator(f"tr[data-node='{node.name}']")
    expect(row.locator(".state")).to_have_text("Ready")

    # the node's page, in another tab: drain with a deadline and a reason, confirmed
    detail = page.context.browser.new_page()  # a second window, signed in on its own
    detail.set_default_timeout(15_000)
    detail.set_viewport_size({"width": 1280, "height": 900})
    detail.on("dialog", lambda dialog: dialog.accept())
    sign_in(detail, console, "e2e-olga", "pw-e2e-olga")
    detail.goto(f"{console}/console/nodes/{node.pk}")
    wait_live(detail)
    expect(detail.locator("h1")).to_contain_text(stack.agent.node_name)
    expect(detail.locator("#node-summary")).to_contain_text("Agent version")
    detail.get_by_label("Deadline, minutes from now").fill("45")
    detail.locator("#drain-reason").fill("kernel 6.8 upgrade")
    detail.get_by_role("button", name="Drain").click()
    expect(detail.locator("#node-summary [data-node-state]")).to_have_text("Draining")
    expect(detail.get_by_role("button", name="Cancel drain")).to_be_visible()
    expect(detail.locator("#node-events")).to_contain_text("kernel 6.8 upgrade")

    # the list heard it over its socket: the row changed, the page was not reloaded
    expect(row.locator(".state")).to_contain_text("Draining")
    expect(row.locator(".state")).to_contain_text("deadline")
    expect(row.locator(".why")).to_contain_text("Drain requested: Kernel 6.8 upgrade")
    assert page.evaluate("window.notReloaded") is True
    screenshot(page, "ops-nodes")
    screenshot(detail, "ops-node")
    event = NodeEvent.objects.filter(node=node).latest("id")
    assert (event.reason, event.message, event.actor_label) == (
        "drain_requested",
        "kernel 6.8 upgrade",
        "user:e2e-olga",
    )
    assert event.data["deadline"] is not None

    # a silent drop: the cancel's event never reaches the page …
    server_down["now"] = True
    before = len(routes)
    # the page reconnects (silently, now) and refetches the table: both done before the cancel,
    # or the refetch could already show it
    reconnected = lambda response: len(routes) > before and "/console/nodes" in response.url  # noqa: E731
    with page.expect_response(reconnected):
        routes[-1].close()
    wait_live(page)
    operator = Actor.for_user(event.actor_user)
    elsewhere(node_services.node_drain_cancel, node=node, actor=operator, message="postponed")
    page.wait_for_timeout(1000)
    expect(row.locator(".state")).to_contain_text("Draining")  # missed, so far
    # … until the dead connection is noticed: it reconnects and fetches the table
    server_down["now"] = False
    routes[-1].close()
    expect(row.locator(".state")).to_have_text("Ready")
    expect(row.locator(".why")).to_contain_text("Drain cancelled: Postponed")
    assert page.evaluate("window.notReloaded") is True

    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "ops-nodes-390")
    detail.set_viewport_size({"width": 390, "height": 844})
    screenshot(detail, "ops-node-390")


def test_the_operations_pages(stack, console, page):
    job_id = stack.submit("ops-ran", ["sh", "-c", "echo hi"]).json()["id"]
    stack.drive(job_id, "succeeded")
    lease = Lease.objects.get(job_id=job_id)
    elsewhere(health.sample_capacity)  # the passes that placed the job recorded themselves

    page.goto(f"{console}/console/ops/capacity?dim=cpu_millicores")
    expect(page.get_by_role("heading", name="By pool — CPU (millicores)")).to_be_visible()
    expect(page.locator(f"tr[data-group='{stack.pool.slug}']")).to_be_visible()
    expect(page.locator("section[aria-labelledby=h-trend]")).to_contain_text("requested peak")
    screenshot(page, "ops-capacity")

    page.goto(f"{console}/console/ops/queue?pool={stack.pool.slug}")
    expect(
        page.get_by_role("heading", name=f"Queue and fairness — {stack.pool.slug}")
    ).to_be_visible()
    screenshot(page, "ops-queue")

    page.goto(f"{console}/console/ops/health?pool={stack.pool.slug}")
    expect(page.locator("main")).to_contain_text(re.compile(r"\d+ passes placed 1 jobs"))
    screenshot(page, "ops-health")

    page.goto(f"{console}/console/ops/jobs/{job_id}/decision")
    expect(page.get_by_role("heading", name=f"Placement of lease {lease.pk}")).to_be_visible()
    expect(page.locator("main")).to_contain_text(stack.agent.node_name)
    screenshot(page, "ops-decision")

    # an enrollment token: created in the form, its secret shown once, then revoked
    page.goto(f"{console}/console/nodes/tokens")
    page.get_by_label("Name (optional)").fill("rack-9")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("[data-secret]").inner_text()
    assert secret.startswith("cpe_")
    screenshot(page, "ops-tokens")
    page.goto(f"{console}/console/nodes/tokens")
    expect(page.locator("main")).not_to_contain_text(secret)
    token_row = page.locator("tr", has_text="rack-9")
    token_row.get_by_role("button", name=re.compile("Revoke")).click()
    expect(page.locator("tr", has_text="rack-9").locator(".token-status")).to_contain_text(
        "Revoked"
    )

    # keyboard: the skip link comes first, then the console's navigation
    page.goto(f"{console}/console/nodes")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")


def test_charts_show_values_on_hover_and_focus_and_switch_ranges(stack, console, page):
    elsewhere(health.sample_capacity)
    elsewhere(health.roll_up)
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
    page.goto(f"{console}/console/ops/capacity")
    page.wait_for_load_state("load")
    # the fleet is CPU only: CPU by default, over schedulable capacity
    expect(page.get_by_label("Resource")).to_have_value("cpu_millicores")
    expect(page.locator("th", has_text="Unavailable")).to_have_count(3)
    chart = page.locator("#trends figure[data-chart]").first
    expect(chart.locator("text.tick-y").first).to_have_text("0%")
    expect(chart.locator("text.tick-y").last).to_have_text("100%")
    expect(chart.locator("text.tick-x").first).to_have_text(re.compile(r"^\d\d:\d\d$"))
    # hover: the point under the pointer is read out
    svg = chart.locator("svg")
    svg.scroll_into_view_if_needed()
    box = svg.bounding_box()
    svg.hover(position={"x": box["width"] - 14, "y": box["height"] / 2})
    readout = chart.locator("[data-readout]")
    assert not errors, errors
    expect(readout).to_have_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d: Requested"))
    # keyboard: one tab stop per chart, arrow keys move between points
    last = chart.locator(".ts-point[tabindex='0']")
    last.focus()
    first_text = readout.inner_text()
    page.keyboard.press("ArrowLeft")
    expect(readout).not_to_have_text(first_text)
    expect(chart.locator(".ts-point:focus")).to_have_attribute("aria-label", readout.inner_text())
    screenshot(page, "ops-capacity-chart")
    # ranges: 15 min has 15 points, 7 d 168 hourly ones
    page.get_by_role("navigation", name="Chart range").get_by_role("link", name="15 min").click()
    expect(page.locator("#trends")).to_have_attribute("data-range", "15m")
    expect(page.locator("#trends figure").first.locator(".ts-point")).to_have_count(15)
    page.get_by_role("link", name="7 d").click()
    expect(page.locator("#trends figure").first.locator(".ts-point")).to_have_count(168)
    expect(page.locator("#trends figure").first.locator("text.tick-x").first).to_have_text(
        re.compile(r"^\w{3} \d\d:\d\d$")
    )
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "ops-capacity-chart-390")
    page.set_viewport_size({"width": 1280, "height": 900})

    page.goto(f"{console}/console/ops/health?pool={stack.pool.slug}&range=6h")
    panel = page.locator("#health-charts figure", has_text="Pass duration (max)")
    expect(panel.locator(".ts-point")).to_have_count(72)
    expect(panel.locator("text.tick-y").last).to_have_text(re.compile(r" s$"))
    panel.locator(".ts-point[tabindex='0']").focus()
    expect(panel.locator("[data-readout]")).to_have_text(re.compile(r": Pass duration \(max\) "))
    page.get_by_role("link", name="24 h").click()
    expect(page.locator("#health-charts")).to_have_attribute("data-range", "24h")
    screenshot(page, "ops-health-charts")
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "ops-health-charts-390")


def test_an_unreachable_node_is_not_ready_and_problems_come_first(stack, console, page):
    from config.builders import build_node
    from nodes.models import Node

    def lost_node():
        node = build_node(stack.pool, "e2e-lost", cpu=2000, memory=2048)
        Node.objects.filter(pk=node.pk).update(reachability="unreachable")

    elsewhere(lost_node)
    try:
        page.goto(f"{console}/console/nodes?pool={stack.pool.slug}")
        rows = page.locator("table.nodes tbody tr")
        expect(rows.first).to_have_attribute("data-node", "e2e-lost")
        lost = page.locator("tr[data-node='e2e-lost']")
        expect(lost.locator(".state")).to_contain_text("Unreachable")
        expect(lost.locator(".state")).not_to_have_class(re.compile("state-ready"))
        expect(page.locator("[data-count='unreachable']")).to_have_text("Unreachable: 1")
        agent = page.locator(f"tr[data-node='{stack.agent.node_name}']")
        expect(agent.locator(".state")).to_have_text("Ready")
        screenshot(page, "ops-nodes-problems")
        page.set_viewport_size({"width": 390, "height": 844})
        screenshot(page, "ops-nodes-problems-390")
        page.set_viewport_size({"width": 1280, "height": 900})
        # the agent's node: its usage graph, retire behind the menu
        page.goto(f"{console}/console/nodes/{stack.node().pk}")
        expect(page.locator("#node-usage-charts figure").first).to_be_visible()
        retire = page.get_by_role("button", name="Retire")
        expect(retire).to_be_hidden()
        page.get_by_text("More actions").click()
        expect(retire).to_be_visible()
        screenshot(page, "ops-node-usage")
    finally:
        elsewhere(lambda: Node.objects.filter(name="e2e-lost").delete())
