"""The control plane's side of an NVML inventory: enrollment and device health from it."""

import pytest

from nodes import services
from nodes.choices import GpuHealth, NodeState
from pools.actors import Actor
from tests.worker_agent.test_inventory import recorded_reading
from worker_agent.inventory import inventory_only

from .conftest import inventory


@pytest.fixture
def reading():
    return recorded_reading()


def test_health_readings_flag_the_unsuitable_device(reading):
    by_uuid = {h["uuid"]: h for h in reading["health"]}
    hot = by_uuid[reading["gpus"][3]["uuid"]]
    assert (hot["temperature_c"], hot["slowdown_temperature_c"]) == (91, 87)
    assert (hot["pcie_link_width"], hot["pcie_link_width_max"], hot["nvlink_down"]) == (8, 16, 2)
    health, flags, why = services.gpu_health_evaluate(hot)
    assert health == GpuHealth.TOO_HOT
    assert flags == ["over_temperature", "pcie_degraded"]
    assert "91°C ≥ 87°C" in why
    for gpu in reading["gpus"][:3]:
        assert services.gpu_health_evaluate(by_uuid[gpu["uuid"]])[0] == GpuHealth.OK


def test_nvml_inventory_enrolls_and_heartbeats_through_the_services(
    reading, private_pool, operator
):
    _, secret = services.enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    inv = inventory(gpus=0) | {"gpus": inventory_only(reading)}
    node, _, _ = services.node_enroll(secret=secret, name="h100-a", inventory=inv)
    assert node.gpus.get(index=2).mig_slices[1]["profile"] == "1g.10gb"
    assert node.gpus.get(index=1).numa_node is None
    node = services.node_heartbeat(node=node, actor=Actor.for_node(node), gpus=reading["health"])
    assert node.state == NodeState.READY
    healthy = dict(node.gpus.values_list("index", "healthy"))
    assert healthy == {0: True, 1: True, 2: True, 3: False}
    assert node.gpus.get(index=3).health == GpuHealth.TOO_HOT
