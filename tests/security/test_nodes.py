"""Issue 9, area B: bounded node input, isolated node sweeps, the console's drain form.

Node agents are outside the control plane's trust: whatever they send is refused with a 400 and
field errors before it reaches a column, and a row the database refuses to write never stops a
sweep from serving the other nodes.
"""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from config.builders import SYSTEM, gpu, gpu_inventory
from nodes import services
from nodes.choices import NodeState, Reachability
from nodes.inventory import normalize_inventory
from nodes.models import GpuDevice, Node, NodeEvent
from pools.actors import Actor
from scheduling.drain import node_drain_sweep
from tests.clients import bearer_client, enroll_post
from tests.worker_agent.test_inventory import recorded_reading
from worker_agent.inventory import inventory_only

pytestmark = pytest.mark.django_db

BIG = 10**18


@pytest.fixture
def token(private_pool, operator):
    """An enrollment token's secret for the private pool."""
    return services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))[1]


@pytest.fixture
def enroll_private(enroll, private_pool):
    return lambda **fields: enroll(private_pool, **fields).node


@pytest.fixture
def market_agent(enroll, market_pool):
    """A marketplace node with its open validation probe."""
    return enroll(market_pool)


def enroll_body(secret, **inventory_changes):
    inv = gpu_inventory(gpus=2, uuid_tag="sec1")
    inv.update(inventory_changes)
    return {"token": secret, "name": "gpu-sec", "inventory": inv}


def with_gpu(**changes):
    """An inventory whose first GPU carries `changes`."""
    inv = gpu_inventory(gpus=2, uuid_tag="sec1")
    inv["gpus"][0].update(changes)
    return inv


def error_at(body: dict, *path):
    """The field errors at `path` of a 400 body; a list's errors are keyed by the item's index."""
    for step in path:
        body = body[str(step)]
    return body


# --------------------------------------------------------------------------- 1. bounded input

ENROLL_CASES = [
    ({"memory_mib": BIG}, ("inventory", "memory_mib")),
    ({"cpu_millicores": BIG}, ("inventory", "cpu_millicores")),
    ({"gpus": with_gpu(index=70_000)["gpus"]}, ("inventory", "gpus", 0, "index")),
    ({"gpus": with_gpu(memory_mib=BIG)["gpus"]}, ("inventory", "gpus", 0, "memory_mib")),
    ({"gpus": with_gpu(numa_node=40_000)["gpus"]}, ("inventory", "gpus", 0, "numa_node")),
    ({"gpus": with_gpu(index=1)["gpus"]}, ("inventory", "gpus")),  # two GPUs at index 1
    (
        {"gpus": with_gpu(mig_slices=[{"profile": "1g.10gb", "memory_mib": BIG}])["gpus"]},
        ("inventory", "gpus", 0, "mig_slices", 0, "memory_mib"),
    ),
    ({"gpus": [gpu(0, uuid=f"GPU-{i}") for i in range(65)]}, ("inventory", "gpus")),
    ({"numa": [{"id": 0, "memory_mib": BIG}]}, ("inventory", "numa", 0, "memory_mib")),
    ({"numa": [{"id": i} for i in range(300)]}, ("inventory", "numa")),
]


@pytest.mark.parametrize(("changes", "path"), ENROLL_CASES)
def test_enrollment_out_of_range_is_a_400_naming_the_field(token, changes, path):
    response = enroll_post(enroll_body(token, **changes))
    assert response.status_code == 400, response.content
    assert error_at(response.json(), *path)
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"labels": {f"k{i}": "v" for i in range(100)}}, "labels"),
        ({"labels": {"k" * 1000: "v"}}, "labels"),
        ({"runtimes": ["docker"] * 100}, "runtimes"),
        ({"features": [f"f{i}" for i in range(100)]}, "features"),
    ],
)
def test_enrollment_lists_and_maps_are_bounded(token, extra, field):
    response = enroll_post(enroll_body(token) | extra)
    assert response.status_code == 400 and field in response.json()
    assert not Node.objects.exists()


HOSTILE_FEATURES = [
    "avx512",  # not a list
    [512],  # not a name (never turned into "512")
    [["avx512"]],
    [{"avx512": True}],
    ["AVX512"],  # never lowercased for it
    [""],
    ["avx 512"],
    ["avx\n512"],
    ["<script>"],
    ["a" * 41],
    ["avx512", "avx512"],
    None,
]


@pytest.mark.parametrize("features", HOSTILE_FEATURES)
def test_enrollment_features_that_are_not_feature_names_are_a_400(token, features):
    body = enroll_body(token) | {"features": features}
    response = enroll_post(body)
    assert response.status_code == 400, response.content
    assert "features" in response.json()
    assert not Node.objects.exists()


def test_enrollment_stores_feature_names_as_sent(token):
    body = enroll_body(token) | {"features": ["avx512", "infiniband", "sgx", "amx-bf16"]}
    response = enroll_post(body)
    assert response.status_code == 201, response.content
    assert Node.objects.get(name="gpu-sec").features == ["avx512", "infiniband", "sgx", "amx-bf16"]


@pytest.mark.parametrize("features", HOSTILE_FEATURES)
def test_heartbeat_features_that_are_not_feature_names_are_a_400_and_change_nothing(
    agent, features
):
    services.node_heartbeat(node=agent.node, actor=Actor.for_node(agent.node), features=["sgx"])
    client = bearer_client(agent.secret)
    response = client.post("/api/v1/agent/heartbeat/", {"features": features}, format="json")
    assert response.status_code == 400, response.content
    assert "features" in str(response.json())
    assert Node.objects.get(pk=agent.node.pk).features == ["sgx"]


def test_a_heartbeat_replaces_the_features_and_one_without_keeps_them(agent):
    client = bearer_client(agent.secret)
    beat = {"features": ["avx512", "sgx"]}
    assert client.post("/api/v1/agent/heartbeat/", beat, format="json").status_code == 200
    assert Node.objects.get(pk=agent.node.pk).features == ["avx512", "sgx"]
    assert client.post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 200
    assert Node.objects.get(pk=agent.node.pk).features == ["avx512", "sgx"]
    assert (
        client.post("/api/v1/agent/heartbeat/", {"features": []}, format="json").status_code == 200
    )
    assert Node.objects.get(pk=agent.node.pk).features == []


def test_a_real_nvml_inventory_and_its_readings_pass_the_bounds(token):
    """The recorded 4×H100 node (MIG slices, NVLink, one hot device with a degraded link)."""
    reading = recorded_reading()
    body = enroll_body(token, gpus=inventory_only(reading))
    enrolled = enroll_post(body)
    assert enrolled.status_code == 201, enrolled.content
    agent = bearer_client(enrolled.json()["credential"])
    beat = {"usage": {"cpu_millicores": 1200, "gpu_util_percent": 37.5}, "gpus": reading["health"]}
    assert agent.post("/api/v1/agent/heartbeat/", beat, format="json").status_code == 200
    node = Node.objects.get(name="gpu-sec")
    assert node.usage == beat["usage"]
    assert node.gpus.get(index=3).health == "too_hot"


@pytest.mark.parametrize(
    ("inv", "path"),
    [
        (gpu_inventory(memory=BIG), ("memory_mib",)),
        (with_gpu(memory_mib=BIG), ("gpus", 0, "memory_mib")),
        (with_gpu(index=70_000), ("gpus", 0, "index")),
    ],
)
def test_inventory_report_out_of_range_is_a_400(agent, inv, path):
    response = bearer_client(agent.secret).post("/api/v1/agent/inventory/", inv, format="json")
    assert response.status_code == 400, response.content
    assert error_at(response.json(), *path)
    assert Node.objects.get(pk=agent.node.pk).reported_inventory is None


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"gpus": [{"temperature_c": 99_999_999}]}, ("gpus", 0, "temperature_c")),
        ({"gpus": [{"temperature_c": -99_999_999}]}, ("gpus", 0, "temperature_c")),
        ({"gpus": [{"pcie_link_width_max": 10**14}]}, ("gpus", 0, "pcie_link_width_max")),
        ({"gpus": [{"pcie_link_width": 10**14}]}, ("gpus", 0, "pcie_link_width")),
        ({"gpus": [{"xid_errors": 10**30}]}, ("gpus", 0, "xid_errors")),
        ({"workloads": [{"lease": 10**30}]}, ("workloads", 0, "lease")),
        ({"usage": {"cpu_millicores": "a lot"}}, ("usage",)),
        ({"usage": {"k" * 1000: 1}}, ("usage",)),
    ],
)
def test_heartbeat_out_of_range_is_a_400_and_changes_nothing(agent, body, path):
    node = agent.node
    device = node.gpus.first()
    for reading in body.get("gpus", []):
        reading["uuid"] = device.uuid
    client = bearer_client(agent.secret)
    response = client.post("/api/v1/agent/heartbeat/", body, format="json")
    assert response.status_code == 400, response.content
    assert error_at(response.json(), *path)
    after = Node.objects.get(pk=node.pk)
    assert after.last_heartbeat_at == node.last_heartbeat_at
    assert GpuDevice.objects.get(pk=device.pk).temperature_c is None
    # the same node's sensible readings are still taken
    fine = {"gpus": [{"uuid": device.uuid, "temperature_c": 61, "pcie_link_width_max": 16}]}
    assert client.post("/api/v1/agent/heartbeat/", fine, format="json").status_code == 200
    assert GpuDevice.objects.get(pk=device.pk).temperature_c == 61


@pytest.mark.parametrize(
    ("result", "path"),
    [
        ({"cpu_count": "abc"}, ("result", "cpu_count")),
        ({"memory_mib": BIG}, ("result", "memory_mib")),
        ({"gpus": [{"uuid": "GPU-x", "memory_mib": BIG}]}, ("result", "gpus", 0, "memory_mib")),
        ({"gpus": "all of them"}, ("result", "gpus")),
        ({"temperature_c": "hot"}, ("result", "temperature_c")),
    ],
)
def test_probe_result_out_of_range_is_a_400_and_keeps_the_probe_open(market_agent, result, path):
    enrolled = market_agent
    url = f"/api/v1/agent/probes/{enrolled.probe.pk}/result/"
    body = {"result": {"benchmark": {"matmul_tflops": 600}} | result}
    response = bearer_client(enrolled.secret).post(url, body, format="json")
    assert response.status_code == 400, response.content
    assert error_at(response.json(), *path)
    enrolled.probe.refresh_from_db()
    assert enrolled.probe.state == "requested"


# --------------------------------------------------------------------------- 2. isolated sweeps


def events(node, reason):
    return list(NodeEvent.objects.filter(node=node, reason=reason).order_by("id"))


def make_legacy_overcommitted(node):
    """A row from before a CHECK constraint existed: PostgreSQL refuses every later UPDATE of it
    (the constraint is re-added NOT VALID, as a migration adding it to a live table would).
    All of it is undone with the test's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending FK checks under ALTER TABLE
        cursor.execute("ALTER TABLE nodes_node DROP CONSTRAINT node_cpu_not_overcommitted")
        cursor.execute(
            "UPDATE nodes_node SET cpu_millicores_reserved = cpu_millicores_allocatable + 1 "
            "WHERE id = %s",
            [node.pk],
        )
        cursor.execute(
            "ALTER TABLE nodes_node ADD CONSTRAINT node_cpu_not_overcommitted "
            "CHECK (cpu_millicores_reserved <= cpu_millicores_allocatable) NOT VALID"
        )
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def test_inventory_sweep_goes_on_after_a_node_that_fails(enroll_private):
    now = timezone.now()
    bad, good = enroll_private(), enroll_private()
    # a report stored before reports were bounded: a GPU bigger than its column
    stored = normalize_inventory(bad.inventory)
    stored["gpus"][0]["memory_mib"] = BIG
    Node.objects.filter(pk=bad.pk).update(reported_inventory=stored, inventory_reported_at=now)
    smaller = dict(good.inventory, memory_mib=good.inventory["memory_mib"] - 10_000)
    services.node_inventory_report(node=good, inventory=smaller, now=now)

    results = services.inventory_reconcile_sweep(now=now + timedelta(seconds=1))

    assert list(results) == [good.pk]
    assert Node.objects.get(pk=good.pk).memory_mib_raw == smaller["memory_mib"]
    [failure] = events(bad, "sweep_failed")
    # who: the sweep; what: the error
    assert (failure.actor_label, failure.message.split(":")[0]) == (
        "system:reconciliation",
        "DataError",
    )
    # nothing of the failed reconciliation was kept
    assert bad.gpus.get(index=0).memory_mib == bad.inventory["gpus"][0]["memory_mib"]
    assert not events(bad, "inventory_drift")
    # the next minute it fails the same way: recorded once, not once a minute
    services.inventory_reconcile_sweep(now=now + timedelta(minutes=1))
    assert len(events(bad, "sweep_failed")) == 1


def test_heartbeat_sweep_goes_on_after_a_node_that_fails(enroll_private):
    now = timezone.now()
    bad, good = enroll_private(now=now), enroll_private(now=now)
    make_legacy_overcommitted(bad)

    marked = services.node_heartbeat_sweep(now=now + timedelta(hours=1))

    assert marked == [good.pk]
    assert Node.objects.get(pk=good.pk).reachability == Reachability.UNREACHABLE
    [failure] = events(bad, "sweep_failed")
    assert failure.actor_label == "system:heartbeat-sweep" and "IntegrityError" in failure.message
    assert Node.objects.get(pk=bad.pk).reachability == Reachability.REACHABLE


def test_drain_sweep_goes_on_after_a_node_that_fails(enroll_private):
    now = timezone.now()
    nodes = [enroll_private(), enroll_private()]
    for node in nodes:
        services.node_heartbeat(node=node, actor=Actor.for_node(node), now=now)
        services.node_drain(node=node, actor=SYSTEM, deadline=now + timedelta(minutes=1), now=now)
    bad, good = nodes
    make_legacy_overcommitted(bad)

    result = node_drain_sweep(now=now + timedelta(minutes=2))

    assert result == {"enforced": [good.pk], "completed": [good.pk]}
    assert events(good, "drain_deadline") and events(good, "drain_completed")
    assert events(bad, "sweep_failed")[0].actor_label == "system:drain-sweep"
    assert Node.objects.get(pk=bad.pk).drain_enforced_at is None


# --------------------------------------------------------------------------- 3. console drain


@pytest.mark.parametrize("minutes", ["abc", "99999999999999", "-5", "43201"])
def test_console_drain_form_refuses_bad_minutes(agent, operator, minutes):
    client = Client()
    client.force_login(operator)
    url = f"/console/nodes/{agent.node.pk}/drain"
    # htmx: the row comes back with the error (htmx swaps only 2xx answers)
    row = client.post(url, {"deadline_minutes": minutes}, HTTP_HX_REQUEST="true")
    assert row.status_code == 200
    alert = re.search(r'role="alert"[^>]*>([^<]*)<', row.content.decode())
    assert alert and "deadline" in alert.group(1)
    # a plain form post: 400 with the error
    plain = client.post(url, {"deadline_minutes": minutes})
    assert plain.status_code == 400 and "deadline" in plain.content.decode()
    assert Node.objects.get(pk=agent.node.pk).state == NodeState.READY


def test_console_drain_form_takes_up_to_thirty_days(agent, operator):
    client = Client()
    client.force_login(operator)
    url = f"/console/nodes/{agent.node.pk}/drain"
    before = timezone.now()
    assert (
        client.post(
            url, {"deadline_minutes": "43200", "reason": "maintenance"}, HTTP_HX_REQUEST="true"
        ).status_code
        == 200
    )
    node = Node.objects.get(pk=agent.node.pk)
    assert node.state == NodeState.DRAINING
    assert node.drain_deadline >= before + timedelta(days=30)
