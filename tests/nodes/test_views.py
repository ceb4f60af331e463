import pytest
from django.test import Client

from nodes.choices import NodeState
from nodes.models import NodeEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_client(operator):
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def person_client(person):
    client = Client()
    client.force_login(person)
    return client


def test_pages_anonymous_person_operator(ready_node, operator_client, person_client):
    node = ready_node.node
    for url in ("/console/nodes", f"/console/nodes/{node.pk}"):
        assert Client().get(url).status_code == 302  # to the login page
        assert person_client.get(url).status_code == 403
        page = operator_client.get(url)
        assert page.status_code == 200
        assert node.name in page.content.decode()
    listing = operator_client.get("/console/nodes").content.decode()
    assert "agent_authenticated" in listing  # why it is where it is
    assert "Drain" in listing and "Quarantine" in listing and "Retire" in listing


def test_htmx_actions_call_services_and_return_the_row(ready_node, operator_client):
    node = ready_node.node
    htmx = {"HTTP_HX_REQUEST": "true"}
    base = f"/console/nodes/{node.pk}"
    response = operator_client.post(f"{base}/drain", {"deadline_minutes": "30"}, **htmx)
    assert response.status_code == 200
    body = response.content.decode()
    assert f'id="node-{node.pk}"' in body and "Draining" in body and "deadline" in body
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING and node.drain_deadline is not None
    response = operator_client.post(f"{base}/quarantine", {"message": "fan failure"}, **htmx)
    assert "fan failure" in response.content.decode()
    assert NodeEvent.objects.filter(node=node).last().actor_label == "user:olga"
    response = operator_client.post(f"{base}/release", **htmx)
    node.refresh_from_db()
    assert node.state == NodeState.READY
    refused = operator_client.post(f"{base}/release", **htmx)
    assert refused.status_code == 200 and 'role="alert"' in refused.content.decode()
    assert operator_client.post(f"{base}/retire").status_code == 302  # without htmx: redirect
    node.refresh_from_db()
    assert node.state == NodeState.RETIRED
    assert operator_client.post(f"{base}/explode", **htmx).status_code == 404


def test_actions_refused_for_people_and_get(ready_node, person_client, operator_client):
    url = f"/console/nodes/{ready_node.node.pk}/retire"
    assert Client().post(url).status_code == 302
    assert person_client.post(url).status_code == 403
    assert operator_client.get(url).status_code == 405
    ready_node.node.refresh_from_db()
    assert ready_node.node.state == NodeState.READY


def test_actions_need_csrf(ready_node, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post(f"/console/nodes/{ready_node.node.pk}/retire").status_code == 403


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_operator_quarantines_and_releases_a_node_in_the_browser(live_server, ready_node):
    """Why a node is where it is, and the operator's buttons, in a real browser (htmx)."""
    from playwright.sync_api import expect

    from config.builders import build_person
    from pools.choices import PlatformRole
    from tests.browser import chromium_page, sign_in

    build_person("ops", platform_role=PlatformRole.OPERATOR)
    node = ready_node.node
    with chromium_page() as page:
        sign_in(page, live_server.url, "ops", "pw-ops")
        page.click("text=Nodes")
        row = page.locator(f"tr[data-node='{node.name}']")
        expect(row.locator(".state")).to_contain_text("Ready")
        row.locator("input[name=message]").fill("ECC errors on DIMM 3")
        row.locator("button:has-text('Quarantine')").click()
        expect(row.locator(".state")).to_contain_text("Quarantined")
        expect(row.locator(".why")).to_contain_text("ECC errors on DIMM 3")
        row.locator("button:has-text('Release')").click()
        expect(row.locator(".state")).to_contain_text("Ready")
        expect(row.locator(".why")).to_contain_text("quarantine_released")
    reasons = list(node.events.order_by("id").values_list("reason", flat=True))
    assert reasons[-2:] == ["quarantined", "quarantine_released"]
