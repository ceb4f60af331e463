"""Every node endpoint: anonymous, wrong role (a person, a node), right role."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from config.builders import gpu_inventory
from nodes import services
from nodes.choices import NodeState
from nodes.models import ControlPlane, EnrollmentToken, Node, NodeEvent
from nodes.selectors import control_plane_id
from pools.actors import Actor
from tests.clients import bearer_client, enroll_post

from .conftest import measured

pytestmark = pytest.mark.django_db

NODE_ACTIONS = [
    ("drain", {"deadline": None}),
    ("quarantine", {"message": "bad fans"}),
    ("retire", {}),
    ("revoke-credentials", {}),
    ("rotate-credential", {}),
]


def enroll_body(secret, name="gpu-a", **extra):
    return {
        "token": secret,
        "name": name,
        "machine_id": "m-1",
        "identity": "ssh-ed25519 AAAA",
        "agent_version": "0.1.0",
        "inventory": gpu_inventory(gpus=1, uuid_tag=name[-4:]),
        "labels": {"team": "ml"},
        "runtimes": ["docker"],
        "region": "eu",
        "zone": "eu-1a",
        "rack": "r7",
        "network_class": "100g",
        "price_class": "0.45",
        "energy_class": "a",
        **extra,
    }


# --------------------------------------------------------------------------- enrollment tokens


def test_enrollment_tokens_anonymous_person_node_operator(
    api, person_api, operator_api, ready_node, private_pool
):
    url = "/api/v1/enrollment-tokens/"
    body = {"pool": "private", "max_uses": 3, "ttl_hours": 2}
    assert api.get(url).status_code == 401
    assert api.post(url, body, format="json").status_code == 401
    assert person_api.get(url).status_code == 403
    assert person_api.post(url, body, format="json").status_code == 403
    node = bearer_client(ready_node.secret)
    assert node.get(url).status_code == 403
    assert node.post(url, body, format="json").status_code == 403

    created = operator_api.post(url, body, format="json")
    assert created.status_code == 201, created.content
    secret = created.json()["secret"]
    assert secret.startswith("cpe_")
    token = EnrollmentToken.objects.get(pk=created.json()["id"])
    assert token.max_uses == 3 and token.digest != secret
    listed = operator_api.get(url).json()["results"]
    assert all("secret" not in row for row in listed)
    revoked = operator_api.post(f"{url}{token.pk}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]


def test_operator_token_without_operate_scope_is_refused(operator, api, private_pool):
    from pools.services import api_token_issue

    _, secret = api_token_issue(user=operator, name="ro", scopes=["read"])
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/api/v1/enrollment-tokens/").status_code == 403
    assert api.get("/api/v1/nodes/").status_code == 200  # reading nodes needs read only


# --------------------------------------------------------------------------- enroll


def test_enroll_with_token_returns_credential_once(api, private_pool, operator):
    _, secret = services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    response = enroll_post(enroll_body(secret))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["credential"].startswith("cpn_")
    assert body["node"]["state"] == "registered" and body["node"]["zone"] == "eu-1a"
    assert body["heartbeat_interval_s"] == private_pool.heartbeat_interval_s
    assert body["probes"] == []
    # who owns the node's containers: this control plane, by the id it made once
    assert body["control_plane"] == str(ControlPlane.objects.get().uuid)
    node = Node.objects.get(name="gpu-a")
    assert node.labels == {"team": "ml"} and node.gpus.count() == 1
    # the credential works and makes the private node ready
    hb = bearer_client(body["credential"]).post("/api/v1/agent/heartbeat/", {}, format="json")
    assert hb.status_code == 200 and hb.json()["state"] == "ready"
    me = bearer_client(body["credential"]).get("/api/v1/agent/me/")
    assert me.json()["control_plane"] == body["control_plane"]


def test_the_control_plane_id_is_made_once_and_kept(db):
    """One row, whatever reads it (after a flush too), and no second one can be stored."""
    ControlPlane.objects.all().delete()
    first = control_plane_id()
    assert control_plane_id() == first and ControlPlane.objects.count() == 1
    with pytest.raises(IntegrityError), transaction.atomic():
        ControlPlane.objects.create(id=2)


def test_enroll_refusals(api, private_pool, operator, ready_node):
    _, secret = services.enrollment_token_issue(
        pool=private_pool, actor=Actor.for_user(operator), max_uses=1
    )
    assert enroll_post(enroll_body("cpe_wrong")).status_code == 403
    assert enroll_post(enroll_body(secret)).status_code == 201
    reuse = enroll_post(enroll_body(secret, name="gpu-b"))
    assert reuse.status_code == 403 and "used up" in reuse.json()["detail"]
    # expiry
    _, secret = services.enrollment_token_issue(
        pool=private_pool,
        actor=Actor.for_user(operator),
        ttl=timedelta(seconds=1),
        now=timezone.now() - timedelta(seconds=5),
    )
    late = enroll_post(enroll_body(secret, name="gpu-c"))
    assert late.status_code == 403 and "expired" in late.json()["detail"]
    # a node credential cannot enroll other nodes, even with a valid token
    _, secret = services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    as_node = bearer_client(ready_node.secret).post(
        "/api/v1/enroll/", enroll_body(secret, name="gpu-d"), format="json"
    )
    assert as_node.status_code == 403
    assert not Node.objects.filter(name__in=["gpu-b", "gpu-c", "gpu-d"]).exists()
    # invalid body
    bad = enroll_post({"token": secret, "name": "x"})
    assert bad.status_code == 400


def test_enroll_in_marketplace_returns_the_probe(api, market_pool, operator):
    _, secret = services.enrollment_token_issue(pool=market_pool, actor=Actor.for_user(operator))
    body = enroll_post(enroll_body(secret)).json()
    assert [p["kind"] for p in body["probes"]] == ["validation"]
    assert body["probes"][0]["expected"]["cpu_millicores"] == 64000


# --------------------------------------------------------------------------- agent endpoints


AGENT_POSTS = [
    "/api/v1/agent/heartbeat/",
    "/api/v1/agent/inventory/",
    "/api/v1/agent/credential/rotate/",
]


@pytest.mark.parametrize("url", AGENT_POSTS)
def test_agent_endpoints_refuse_anonymous_people_and_operators(url, api, person_api, operator_api):
    assert api.post(url, {}, format="json").status_code == 401
    assert person_api.post(url, {}, format="json").status_code == 403
    assert operator_api.post(url, {}, format="json").status_code == 403


def test_agent_heartbeat_and_inventory(ready_node):
    client = bearer_client(ready_node.secret)
    gpu = ready_node.node.gpus.get(index=0)
    hb = client.post(
        "/api/v1/agent/heartbeat/",
        {"usage": {"cpu_millicores": 500}, "gpus": [{"uuid": gpu.uuid, "temperature_c": 99}]},
        format="json",
    )
    assert hb.status_code == 200, hb.content
    assert [p["kind"] for p in hb.json()["probes"]] == ["recovery"]
    gpu.refresh_from_db()
    assert not gpu.healthy
    inv = client.post("/api/v1/agent/inventory/", gpu_inventory(gpus=0), format="json")
    assert inv.status_code == 202
    ready_node.node.refresh_from_db()
    assert ready_node.node.reported_inventory["gpus"] == []
    me = client.get("/api/v1/agent/me/")
    assert me.status_code == 200 and me.json()["name"] == ready_node.node.name


def test_agent_heartbeat_refuses_other_nodes_leases_and_jobs(
    ready_node, enroll, private_pool, make_job
):
    job, lease = make_job(enroll(private_pool).node)
    client = bearer_client(ready_node.secret)
    for workload in ({"lease": lease.pk}, {"job": job.pk}):
        response = client.post("/api/v1/agent/heartbeat/", {"workloads": [workload]}, format="json")
        assert response.status_code == 403
        assert response.json()["detail"]


def test_agent_probe_result_own_node_only(api, market_pool, operator, enroll):
    first, second = enroll(market_pool), enroll(market_pool)
    node = first.node
    url = f"/api/v1/agent/probes/{first.probe.pk}/result/"
    result = measured(node)  # what an honest agent answers, its GPU kernel's included
    assert api.post(url, {"result": result}, format="json").status_code == 401
    assert (
        bearer_client(second.secret).post(url, {"result": result}, format="json").status_code == 404
    )
    listed = bearer_client(first.secret).get("/api/v1/agent/probes/").json()
    assert [p["id"] for p in listed] == [first.probe.pk]
    ok = bearer_client(first.secret).post(url, {"result": result}, format="json")
    assert ok.status_code == 200 and ok.json()["state"] == "passed"
    node.refresh_from_db()
    assert node.state == NodeState.READY
    again = bearer_client(first.secret).post(url, {"result": result}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "probe_closed"


def test_agent_rotation_over_the_api(ready_node):
    old = bearer_client(ready_node.secret)
    rotated = old.post("/api/v1/agent/credential/rotate/")
    assert rotated.status_code == 201
    new_secret = rotated.json()["credential"]
    # the old one still works during the overlap but cannot rotate again
    assert old.post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 200
    assert old.post("/api/v1/agent/credential/rotate/").status_code == 409
    assert (
        bearer_client(new_secret).post("/api/v1/agent/heartbeat/", {}, format="json").status_code
        == 200
    )


def test_node_credential_cannot_reach_people_endpoints(ready_node, enroll, private_pool, make_job):
    job, _ = make_job(enroll(private_pool).node)
    client = bearer_client(ready_node.secret)
    for url in (
        "/api/v1/nodes/",
        f"/api/v1/nodes/{ready_node.node.pk}/",
        "/api/v1/pools/",
        "/api/v1/pools/private/policy-versions/",
        "/api/v1/shapes/",
        "/api/v1/tenants/",
        "/api/v1/jobs/",
        f"/api/v1/jobs/{job.pk}/",
        "/api/v1/me",
        "/api/v1/tokens/",
    ):
        assert client.get(url).status_code == 403, url
    for url, body in (
        ("/api/v1/pools/private/policy-versions/", {"weights": {"bin_pack": 1}}),
        (f"/api/v1/jobs/{job.pk}/cancel/", {}),
        (f"/api/v1/nodes/{ready_node.node.pk}/retire/", {}),
        ("/api/v1/jobs/", {}),
    ):
        assert client.post(url, body, format="json").status_code == 403, url


def test_revoked_expired_and_unknown_credentials_are_401(ready_node, operator):
    client = bearer_client(ready_node.secret)
    assert bearer_client("cpn_unknown").post("/api/v1/agent/heartbeat/", {}).status_code == 401
    services.node_credentials_revoke(node=ready_node.node, actor=Actor.for_user(operator))
    response = client.post("/api/v1/agent/heartbeat/", {}, format="json")
    assert response.status_code == 401 and "revoked" in response.json()["detail"]


# --------------------------------------------------------------------------- operator node API


def test_nodes_list_detail_events_roles(api, person_api, operator_api, ready_node):
    node = ready_node.node
    for url in ("/api/v1/nodes/", f"/api/v1/nodes/{node.pk}/", f"/api/v1/nodes/{node.pk}/events/"):
        assert api.get(url).status_code == 401
        assert person_api.get(url).status_code == 403
        assert operator_api.get(url).status_code == 200
    listed = operator_api.get("/api/v1/nodes/").json()["results"]
    assert [n["name"] for n in listed] == [node.name]
    events = operator_api.get(f"/api/v1/nodes/{node.pk}/events/").json()
    assert [e["reason"] for e in events] == [
        "enrolled",
        "agent_authenticated",
        "agent_authenticated",
    ]


@pytest.mark.parametrize(("action", "body"), NODE_ACTIONS)
def test_operator_actions_roles(action, body, api, person_api, operator_api, ready_node):
    url = f"/api/v1/nodes/{ready_node.node.pk}/{action}/"
    assert api.post(url, body, format="json").status_code == 401
    assert person_api.post(url, body, format="json").status_code == 403
    assert bearer_client(ready_node.secret).post(url, body, format="json").status_code == 403
    response = operator_api.post(url, body, format="json")
    assert response.status_code in (200, 201), response.content
    event = NodeEvent.objects.filter(node=ready_node.node).last()
    assert event.actor_label == "user:olga"


def test_operator_drain_release_and_refusals(operator_api, ready_node):
    node = ready_node.node
    base = f"/api/v1/nodes/{node.pk}"
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    assert operator_api.post(f"{base}/drain/", {"deadline": past}, format="json").status_code == 409
    assert operator_api.post(f"{base}/release/", {}, format="json").status_code == 409
    assert operator_api.post(f"{base}/quarantine/", {}, format="json").status_code == 400
    deadline = (timezone.now() + timedelta(hours=1)).isoformat()
    drained = operator_api.post(f"{base}/drain/", {"deadline": deadline}, format="json")
    assert drained.json()["state"] == "draining" and drained.json()["drain_deadline"]
    assert operator_api.post(f"{base}/cancel-drain/", {}, format="json").json()["state"] == "ready"
    operator_api.post(f"{base}/quarantine/", {"message": "fans"}, format="json")
    released = operator_api.post(f"{base}/release/", {"message": "fixed"}, format="json")
    assert released.json()["state"] == "ready"
    assert operator_api.post(f"{base}/retire/", {}, format="json").json()["state"] == "retired"
    assert operator_api.post(f"{base}/retire/", {}, format="json").status_code == 409
    assert operator_api.post(f"{base}/rotate-credential/").status_code == 409


def test_operator_rotate_returns_a_working_credential(operator_api, ready_node):
    response = operator_api.post(f"/api/v1/nodes/{ready_node.node.pk}/rotate-credential/")
    secret = response.json()["credential"]
    assert bearer_client(secret).get("/api/v1/agent/me/").status_code == 200
