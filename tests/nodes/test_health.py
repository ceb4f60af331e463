"""Device health from heartbeats and recovery probes (nodes/services/health.py)."""

import pytest

from nodes import services
from nodes.choices import GpuHealth, NodeState, ProbeState
from nodes.models import GpuDevice
from pools.actors import Actor
from pools.reasons import Reason

from .conftest import gpu_kernel_answer, last_event, reasons

S = NodeState


@pytest.mark.parametrize(
    ("report", "health", "flag"),
    [
        ({"xid_errors": 2}, GpuHealth.ERROR, "xid_error"),
        ({"ecc_errors_uncorrected": 1}, GpuHealth.ERROR, "xid_error"),
        ({"temperature_c": 93}, GpuHealth.TOO_HOT, "over_temperature"),
        (
            {"temperature_c": 85, "slowdown_temperature_c": 84},
            GpuHealth.TOO_HOT,
            "over_temperature",
        ),
        (
            {"pcie_link_width": 8, "pcie_link_width_max": 16},
            GpuHealth.DEGRADED_LINK,
            "pcie_degraded",
        ),
        ({"nvlink_down": 2}, GpuHealth.DEGRADED_LINK, "pcie_degraded"),
        ({"health_check": "failed"}, GpuHealth.HEALTH_CHECK_FAILED, "health_check_failed"),
    ],
)
def test_unsuitable_device_is_unschedulable_alone(ready_node, report, health, flag):
    node = ready_node.node
    bad, good = node.gpus.order_by("index")
    services.node_heartbeat(
        node=node, actor=Actor.for_node(node), gpus=[{"uuid": bad.uuid, **report}]
    )
    bad.refresh_from_db()
    good.refresh_from_db()
    node.refresh_from_db()
    assert (bad.healthy, bad.health) == (False, health)
    assert flag in bad.health_flags
    assert good.healthy and node.state == S.READY
    assert reasons(node)[-2:] == [Reason.GPU_UNSUITABLE, Reason.PROBE_REQUESTED]
    assert node.probes.get(kind="recovery").gpu == bad


def test_healthy_report_does_not_recover_but_a_passing_probe_does(ready_node):
    node = ready_node.node
    gpu = node.gpus.get(index=0)
    actor = Actor.for_node(node)
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 95}])
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 60}])
    gpu.refresh_from_db()
    assert not gpu.healthy
    probe = node.probes.get(kind="recovery")
    failed = services.probe_result_submit(
        probe=probe,
        credential=ready_node.credential,
        result={"passed": True, "temperature_c": 96},
    )
    assert failed.state == ProbeState.FAILED
    assert last_event(node).reason == Reason.PROBE_FAILED
    gpu.refresh_from_db()
    assert not gpu.healthy
    # the still-open problem is reported again → a new recovery probe
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 97}])
    GpuDevice.objects.filter(pk=gpu.pk).update(healthy=True)  # let the next report re-mark it
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 97}])
    probe = node.probes.get(kind="recovery", state=ProbeState.REQUESTED)
    passed = services.probe_result_submit(
        probe=probe,
        credential=ready_node.credential,
        result={
            "passed": True,
            "temperature_c": 55,
            "health_check": "passed",
            # and the GPU challenge's kernel answered right (docs/nodes.md "GPU challenge")
            "gpu_kernel": gpu_kernel_answer(probe.challenge["gpu_kernel"]["gpus"]),
        },
    )
    assert passed.state == ProbeState.PASSED, passed.differences
    gpu.refresh_from_db()
    assert (gpu.healthy, gpu.health, gpu.health_flags) == (True, GpuHealth.OK, [])
    event = last_event(node)
    assert event.reason == Reason.GPU_RECOVERED and event.data["gpu"] == gpu.uuid
