"""The control plane's side of an NVML inventory: the agent's schema checked at the API, and
enrollment and device health from it."""

import pytest
import yaml

from config.builders import gpu_inventory
from nodes import services
from nodes.api.serializers import as_openapi_30, error_tree
from nodes.choices import GpuHealth, NodeState
from nodes.health_rules import gpu_health_evaluate
from nodes.inventory import GPU_FIELDS, normalize_inventory
from nodes.models import GpuDevice, Node
from pools.actors import Actor
from pools.choices import GpuSharingMode
from tests.clients import enroll_post
from tests.worker_agent.test_inventory import recorded_reading
from worker_agent.identity import NodeKey
from worker_agent.inventory import inventory_document, inventory_only
from worker_agent.schema import GPU_SCHEMA, INVENTORY_SCHEMA


@pytest.fixture
def reading():
    return recorded_reading()


def test_health_readings_flag_the_unsuitable_device(reading):
    by_uuid = {h["uuid"]: h for h in reading["health"]}
    hot = by_uuid[reading["gpus"][3]["uuid"]]
    assert (hot["temperature_c"], hot["slowdown_temperature_c"]) == (91, 87)
    assert (hot["pcie_link_width"], hot["pcie_link_width_max"], hot["nvlink_down"]) == (8, 16, 2)
    health, flags, why = gpu_health_evaluate(hot)
    assert health == GpuHealth.TOO_HOT
    assert flags[:2] == ["over_temperature", "pcie_degraded"]  # then the rules' reason codes
    assert "gpu_too_hot" in flags and "gpu_pcie_degraded" in flags
    assert "91°C ≥ 87°C" in why
    for gpu in reading["gpus"][:3]:
        assert gpu_health_evaluate(by_uuid[gpu["uuid"]])[0] == GpuHealth.OK


def test_nvml_inventory_enrolls_and_heartbeats_through_the_services(
    reading, private_pool, operator
):
    _, secret = services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    inv = gpu_inventory(gpus=0) | {"gpus": inventory_only(reading)}
    node, _, _ = services.node_enroll(
        secret=secret, name="h100-a", inventory=inv, public_key=NodeKey.generate().public_key
    )
    assert node.gpus.get(index=2).mig_slices[1]["profile"] == "1g.10gb"
    assert node.gpus.get(index=1).numa_node is None
    node = services.node_heartbeat(node=node, actor=Actor.for_node(node), gpus=reading["health"])
    assert node.state == NodeState.READY
    healthy = dict(node.gpus.values_list("index", "healthy"))
    assert healthy == {0: True, 1: True, 2: True, 3: False}
    assert node.gpus.get(index=3).health == GpuHealth.TOO_HOT


# --------------------------------------------------------------------------- one format, both sides


def test_the_control_plane_checks_the_agents_own_schema():
    """The schema's device fields are GpuDevice columns, its sharing modes the model's choices."""
    columns = {field.name for field in GpuDevice._meta.get_fields()}
    assert set(GPU_FIELDS) <= columns
    assert GPU_SCHEMA["properties"]["sharing_mode"]["enum"] == GpuSharingMode.values


def test_the_agents_document_enrolls_through_the_api(reading, private_pool, operator):
    _, secret = services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    numa = [{"id": 0, "cpus": 32}, {"id": 1, "cpus": list(range(32, 64))}]
    doc = inventory_document(reading, cpu_millicores=64000, memory_mib=512000, numa=numa)
    body = {"token": secret, "name": "h100-doc", "inventory": doc}
    response = enroll_post(body)
    assert response.status_code == 201, response.content
    node = Node.objects.get(name="h100-doc")
    assert node.inventory == normalize_inventory(doc)
    assert "schema_version" not in node.inventory  # the registered form is the control plane's
    assert set(node.gpus.values_list("compute_capability", flat=True)) == {"9.0"}


def test_a_compute_capability_that_is_not_major_minor_is_a_400(private_pool, operator):
    _, secret = services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    inv = gpu_inventory(gpus=1)
    inv["gpus"][0]["compute_capability"] = "sm_90"
    body = {"token": secret, "name": "n", "inventory": inv}
    response = enroll_post(body)
    assert response.status_code == 400
    assert list(response.json()["inventory"]["gpus"]["0"]) == ["compute_capability"]
    assert not Node.objects.exists()


def test_the_registered_form_takes_the_schemas_defaults():
    gpu = {"uuid": "GPU-a", "model": "H100", "memory_mib": 81559}
    registered = normalize_inventory({"cpu_millicores": 1000, "gpus": [gpu]})
    assert registered == {
        "cpu_millicores": 1000,
        "memory_mib": 0,
        "scratch_mib": 0,
        "numa": [],
        "gpus": [gpu | {"mig_enabled": False, "mig_slices": [], "index": 0}],
    }


CPUS = INVENTORY_SCHEMA["properties"]["numa"]["items"]["properties"]["cpus"]


def test_a_schema_refusal_is_a_400_keyed_by_the_field_path(private_pool, operator):
    _, secret = services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    inv = gpu_inventory(gpus=2) | {"colour": "blue", "numa": [{"id": 0, "cpus": "all"}]}
    inv["gpus"][0]["index"] = 256
    del inv["gpus"][1]["uuid"]
    body = {"token": secret, "name": "n", "inventory": inv}
    response = enroll_post(body)
    assert response.status_code == 400
    assert response.json()["inventory"] == {
        "colour": ["Unknown field."],
        "numa": {"0": {"cpus": [CPUS["description"]]}},
        "gpus": {
            "0": {"index": ["Ensure this value is less than or equal to 255."]},
            "1": {"uuid": ["This field is required."]},
        },
    }
    assert not Node.objects.exists()


def test_error_tree_nests_paths_like_drf_field_errors():
    assert error_tree([((), "Must be an object.")]) == ["Must be an object."]
    tree = error_tree([(("gpus",), "At most 64."), (("gpus", 0, "uuid"), "Required.")])
    assert tree == {"gpus": {"0": {"uuid": ["Required."]}, "non_field_errors": ["At most 64."]}}


def test_the_api_documents_the_inventory_with_the_schema(client, db):
    schema = yaml.safe_load(client.get("/api/schema/").content)
    documented = schema["components"]["schemas"]["Inventory"]["properties"]
    # the agent's JSON Schema, in OpenAPI 3.0's words (nullable, a one-value enum for const)
    expected = as_openapi_30(INVENTORY_SCHEMA["properties"])
    assert documented.pop("schema_version") == {"$ref": "#/components/schemas/SchemaVersionEnum"}
    assert schema["components"]["schemas"]["SchemaVersionEnum"]["enum"] == [1]
    assert documented == {k: v for k, v in expected.items() if k != "schema_version"}
    body = schema["paths"]["/api/v1/agent/inventory/"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/Inventory"}
