"""The operators' node pages: who may see them, the filters and pages of the list (with a query
count that does not grow with the nodes), the node page, every action with its reason, and
enrollment tokens whose secret is shown once."""

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from config.builders import build_node, build_pool
from nodes.choices import NodeState
from nodes.models import EnrollmentToken, GpuDevice, NodeCredential, NodeEvent
from pools.models import token_digest

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


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


def page_names(response) -> list[str]:
    return re.findall(r'data-node="([^"]+)"', response.content.decode())


def test_pages_anonymous_person_operator(ready_node, operator_client, person_client):
    node = ready_node.node
    urls = (
        "/console/nodes",
        f"/console/nodes/{node.pk}",
        f"/console/nodes/{node.pk}/row",
        f"/console/nodes/{node.pk}/events",
        "/console/nodes/tokens",
    )
    for url in urls:
        assert Client().get(url).status_code == 302  # to the login page
        assert person_client.get(url).status_code == 403
        assert operator_client.get(url).status_code == 200
    listing = operator_client.get("/console/nodes").content.decode()
    assert node.name in listing and "agent_authenticated" in listing  # why it is where it is


def test_node_page_shows_inventory_devices_heartbeat_and_actions(ready_node, operator_client):
    node = ready_node.node
    GpuDevice.objects.filter(node=node, index=1).update(
        healthy=False, health="too_hot", health_reason="91 C", temperature_c=91
    )
    type(node).objects.filter(pk=node.pk).update(agent_version="1.4.2")
    body = operator_client.get(f"/console/nodes/{node.pk}").content.decode()
    for text in ("1.4.2", "Last heartbeat", "91 °C", "Unhealthy: Over temperature", "Healthy"):
        assert text in body
    for action in ("drain", "quarantine", "rotate-credential", "retire"):
        assert f"/console/nodes/{node.pk}/{action}" in body
    assert 'name="reason" required' in body and "hx-confirm" in body
    assert f"/console/ops/nodes/{node.pk}/leases" in body  # the leases, from the layer above


@pytest.fixture
def fleet(db):
    """Two pools, nodes in zones, one with an H100 too hot, one draining, one unreachable."""
    east, west = build_pool("east"), build_pool("west")
    nodes = {
        "a1": build_node(east, "a1", zone="z1", gpus=[{}]),
        "a2": build_node(east, "a2", zone="z2", gpus=[{}, {}]),
        "b1": build_node(west, "b1", zone="z1"),
        "b2": build_node(west, "b2", zone="z2", ready=False),
    }
    GpuDevice.objects.filter(node=nodes["a2"], index=0).update(healthy=False, health="too_hot")
    type(nodes["a1"]).objects.filter(pk=nodes["b1"].pk).update(reachability="unreachable")
    return nodes


@pytest.mark.parametrize(
    "query, expected",
    [
        # problems first: unreachable, an unhealthy device, not yet ready, then ready ones
        ("", ["b1", "a2", "b2", "a1"]),
        ("pool=west", ["b1", "b2"]),
        ("state=ready", ["b1", "a2", "a1"]),
        ("state=registered", ["b2"]),
        ("condition=unreachable", ["b1"]),
        ("zone=z1", ["b1", "a1"]),
        ("gpu_model=NVIDIA+H100+80GB+HBM3", ["a2", "a1"]),
        ("health=unhealthy", ["a2"]),
        ("health=ok&pool=east", ["a1"]),
    ],
)
def test_filters(fleet, operator_client, query, expected):
    response = operator_client.get(f"/console/nodes?{query}")
    assert response.status_code == 200
    assert page_names(response) == expected


def test_an_unreachable_node_is_never_a_green_ready_and_counts_lead(fleet, operator_client):
    body = operator_client.get("/console/nodes").content.decode()
    row = body.split('data-node="b1"')[1].split("</tr>")[0]
    assert 'class="state state-unreachable">Unreachable' in row and "state-ready" not in row
    assert 'class="problem"' in row.split(">")[0]
    assert 'class="problem"' not in body.split('data-node="a1"')[1].split(">")[0]
    counts = dict(re.findall(r'data-count="(\w+)">[^:]+: (\d+)<', body))
    assert counts == {"unreachable": "1", "registered": "1", "ready": "3"}
    assert body.index('data-count="unreachable"') < body.index('data-count="ready"')
    page = operator_client.get(f"/console/nodes/{fleet['b1'].pk}").content.decode()
    assert "data-node-state>Unreachable</strong>" in page


def test_reasons_are_sentences_from_the_catalogue(ready_node, operator_client):
    from nodes.templatetags.node_text import reason_sentence

    node = ready_node.node
    NodeEvent.objects.create(
        node=node,
        reason="node_unreachable",
        from_state="ready",
        to_state="ready",
        message="no heartbeat since 10:02:03; 0 committed lease(s) now uncertain",
        actor_label="system:sweep",
    )
    body = operator_client.get("/console/nodes").content.decode()
    assert "Heartbeats missed: nothing heard since 10:02:03. No running lease was affected." in body
    assert "committed lease(s)" not in body.split('data-node="')[1].split("</tr>")[0]
    two = reason_sentence("node_unreachable", "no heartbeat since 1:02:03; 2 committed lease(s)")
    assert "2 running leases are now uncertain" in two
    assert (
        reason_sentence("drain_requested", "kernel upgrade") == "Drain requested: Kernel upgrade."
    )
    assert reason_sentence("retired", "retired") == "Retired."
    assert reason_sentence("made_up", "") == "Made up."
    events = operator_client.get(f"/console/nodes/{node.pk}/events").content.decode()
    assert 'title="node_unreachable">Heartbeats missed</td>' in events


def test_retire_is_behind_a_menu_with_its_confirmation(ready_node, operator_client):
    body = operator_client.get(f"/console/nodes/{ready_node.node.pk}").content.decode()
    menu = body.split('<details class="node-menu"><summary>More actions</summary>')[1]
    menu = menu.split("</details>")[0]
    assert "/retire" in menu and 'hx-confirm="Retire' in menu
    assert "/retire" not in body.replace(menu, "")


def test_a_bad_filter_value_is_a_400_with_the_field_error(fleet, operator_client):
    response = operator_client.get("/console/nodes?state=melting")
    assert response.status_code == 400
    body = response.content.decode()
    assert 'role="alert"' in body and "melting" in body and page_names(response) == []


def test_pages_and_a_constant_query_count(operator_client):
    pool = build_pool("big")
    for i in range(3):
        build_node(pool, f"n{i:02d}", gpus=[{}])

    def queries(url):
        with CaptureQueriesContext(connection) as captured:
            assert operator_client.get(url).status_code == 200
        return len(captured)

    few = queries("/console/nodes")
    for i in range(3, 30):
        build_node(pool, f"n{i:02d}", gpus=[{}, {}])
    many = queries("/console/nodes")
    assert many == few  # nodes, GPUs and latest events are read in a fixed number of queries
    first = operator_client.get("/console/nodes?pool=big")
    assert page_names(first) == [f"n{i:02d}" for i in range(25)]
    assert "Page 1 of 2" in first.content.decode()
    second = operator_client.get("/console/nodes?pool=big&page=2")
    assert page_names(second) == [f"n{i:02d}" for i in range(25, 30)]
    assert "pool=big&amp;page=1" in second.content.decode()  # the filters stay on every page
    table = operator_client.get("/console/nodes?pool=big", **HTMX).content.decode()
    assert "<h1>" not in table and 'data-node="n00"' in table  # htmx: the table alone


def test_every_action_records_its_reason(ready_node, operator_client):
    node = ready_node.node
    base = f"/console/nodes/{node.pk}"

    def act(action, **fields):
        response = operator_client.post(f"{base}/{action}", fields, **HTMX)
        assert response.status_code == 200
        return response.content.decode()

    body = act("drain", deadline_minutes="30", reason="kernel upgrade")
    assert "Cancel drain" in body and 'hx-swap-oob="innerHTML"' in body and "Draining" in body
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING and node.drain_deadline is not None
    act("cancel-drain", reason="upgrade postponed")
    act("quarantine", reason="ECC errors on DIMM 3")
    act("release", reason="DIMM replaced")
    body = act("rotate-credential", reason="suspected leak")
    secret = body.split('class="secret">')[1].split("<")[0]
    assert secret.startswith("cpn_")
    assert NodeCredential.objects.filter(node=node, digest=token_digest(secret)).exists()
    act("retire", reason="end of life")
    events = list(NodeEvent.objects.filter(node=node).order_by("id"))[-6:]
    assert [(e.reason, e.message) for e in events if e.reason != "credential_rotated"] == [
        ("drain_requested", "kernel upgrade"),
        ("drain_cancelled", "upgrade postponed"),
        ("quarantined", "ECC errors on DIMM 3"),
        ("quarantine_released", "DIMM replaced"),
        ("retired", "end of life"),
    ]
    assert {e.actor_label for e in events} == {"user:olga"}
    node.refresh_from_db()
    assert node.state == NodeState.RETIRED
    assert "Retired: no actions" in operator_client.get(base).content.decode()


def test_a_missing_reason_or_bad_deadline_changes_nothing(ready_node, operator_client):
    node = ready_node.node
    base = f"/console/nodes/{node.pk}"
    before = NodeEvent.objects.filter(node=node).count()
    response = operator_client.post(f"{base}/quarantine", {"reason": "  "})
    assert response.status_code == 400 and b"reason" in response.content
    response = operator_client.post(f"{base}/drain", {"deadline_minutes": "-5", "reason": "x"})
    assert response.status_code == 400 and b"deadline" in response.content
    htmx = operator_client.post(f"{base}/retire", {}, **HTMX)
    assert htmx.status_code == 200 and 'role="alert"' in htmx.content.decode()
    refused = operator_client.post(f"{base}/release", {"reason": "not quarantined"}, **HTMX)
    assert 'role="alert"' in refused.content.decode()  # the service's refusal, shown
    node.refresh_from_db()
    assert node.state == NodeState.READY
    assert NodeEvent.objects.filter(node=node).count() == before
    assert operator_client.post(f"{base}/explode", {"reason": "x"}, **HTMX).status_code == 404


def test_without_htmx_an_action_redirects_to_the_node(ready_node, operator_client):
    node = ready_node.node
    response = operator_client.post(f"/console/nodes/{node.pk}/quarantine", {"reason": "fans"})
    assert response.status_code == 302 and response.url == f"/console/nodes/{node.pk}"
    response = operator_client.post(f"/console/nodes/{node.pk}/rotate-credential", {"reason": "r"})
    assert response.status_code == 200 and b"cpn_" in response.content  # shown once, here


def test_actions_refused_for_people_and_get(ready_node, person_client, operator_client):
    url = f"/console/nodes/{ready_node.node.pk}/retire"
    assert Client().post(url, {"reason": "x"}).status_code == 302
    assert person_client.post(url, {"reason": "x"}).status_code == 403
    assert operator_client.get(url).status_code == 405
    ready_node.node.refresh_from_db()
    assert ready_node.node.state == NodeState.READY


def test_actions_need_csrf(ready_node, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    url = f"/console/nodes/{ready_node.node.pk}/retire"
    assert client.post(url, {"reason": "x"}).status_code == 403


def test_enrollment_tokens_secret_once_list_and_revoke(private_pool, operator_client):
    response = operator_client.post(
        "/console/nodes/tokens",
        {"pool": "private", "name": "rack-7", "max_uses": "3", "ttl_hours": "2"},
    )
    assert response.status_code == 201
    body = response.content.decode()
    secret = body.split("data-secret>")[1].split("<")[0]
    token = EnrollmentToken.objects.get(name="rack-7")
    assert token.digest == token_digest(secret) and token.max_uses == 3
    listing = operator_client.get("/console/nodes/tokens").content.decode()
    assert token.prefix in listing and secret not in listing  # never shown again
    assert "Active" in listing
    revoke = operator_client.post(f"/console/nodes/tokens/{token.pk}/revoke")
    assert revoke.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert "Revoked" in operator_client.get("/console/nodes/tokens").content.decode()


def test_enrollment_token_bad_input_is_a_400_with_field_errors(private_pool, operator_client):
    response = operator_client.post(
        "/console/nodes/tokens", {"pool": "nowhere", "max_uses": "0", "ttl_hours": "9999"}
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert body.count('class="error" role="alert"') == 3
    assert not EnrollmentToken.objects.filter(pool__slug="nowhere").exists()


def test_enrollment_tokens_are_for_operators_only(private_pool, person_client):
    assert person_client.post("/console/nodes/tokens", {"pool": "private"}).status_code == 403
    assert not EnrollmentToken.objects.exists()
