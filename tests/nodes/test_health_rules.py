"""The device health rules (nodes/health_rules.py): one rule and one reason code per NVML
reading, judged on readings replayed from the recorded NVML fixture
(tests/worker_agent/fixtures/nvml_h100_sxm_x4.json through worker_agent.inventory.RecordedNvml),
and through the heartbeat service and API (the reason codes on the device and the event)."""

import copy

import pytest

from nodes import services
from nodes.choices import GpuHealth
from nodes.health_rules import gpu_health_evaluate, gpu_health_findings, nvlink_error_rates
from pools.actors import Actor
from pools.reasons import Reason
from tests.clients import client_for
from tests.worker_agent.test_inventory import FIXTURE
from worker_agent.inventory import RecordedNvml, read_gpus

from .conftest import last_event


def recording() -> dict:
    return copy.deepcopy(RecordedNvml.from_file(FIXTURE).__dict__)


def replayed(change=None, *, device=0, xids=None) -> dict:
    """Device `device`'s health reading after `change(recorded device)`, read through the same
    NVML calls as on a node."""
    data = recording()
    if change:
        change(data["devices"][device])
    nvml = RecordedNvml(data)
    return read_gpus(nvml, xids=xids)["health"][device]


def codes(report, previous=None) -> list[str]:
    return [f.code for f in gpu_health_findings(report, previous)]


def test_the_recorded_healthy_devices_break_no_rule():
    for index in range(3):
        reading = replayed(device=index)
        assert codes(reading) == []
        assert gpu_health_evaluate(reading) == (GpuHealth.OK, [], "")


def test_the_recorded_hot_device_breaks_each_of_its_rules():
    reading = replayed(device=3)
    assert reading["throttle_reasons"] == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert codes(reading) == [
        Reason.GPU_TOO_HOT,
        Reason.GPU_THROTTLED,
        Reason.GPU_PCIE_DEGRADED,
        Reason.GPU_NVLINK_DOWN,
    ]
    health, flags, why = gpu_health_evaluate(reading)
    assert health == GpuHealth.TOO_HOT
    assert flags[:2] == ["over_temperature", "pcie_degraded"]  # the flags the console knew
    assert "gpu_throttled" in flags and "hw_thermal_slowdown" in why


@pytest.mark.parametrize(
    ("change", "code", "health"),
    [
        (lambda d: d.update(ecc_uncorrected_volatile=2), Reason.GPU_ECC_UNCORRECTED, "error"),
        (
            lambda d: d.update(ecc_uncorrected_aggregate=10),
            Reason.GPU_ECC_AGGREGATE_THRESHOLD,
            "error",
        ),
        (lambda d: d.update(remapped_rows=[3, 1, 1, 0]), Reason.GPU_RETIRED_PAGES_PENDING, "error"),
        (lambda d: d.update(remapped_rows=[3, 1, 0, 1]), Reason.GPU_ROW_REMAP_FAILURE, "error"),
        (  # an older GPU retires pages instead
            lambda d: d.update(
                remapped_rows=None,
                retired_pages_sbe=[{"address": 4096 * i, "timestamp": i} for i in range(30)],
                retired_pages_dbe=[{"address": 1 << 30 | i, "timestamp": i} for i in range(30)],
                retired_pages_pending=0,
            ),
            Reason.GPU_ROW_REMAP_FAILURE,
            "error",
        ),
        (
            lambda d: d.update(remapped_rows=None, retired_pages_pending=1),
            Reason.GPU_RETIRED_PAGES_PENDING,
            "error",
        ),
        (lambda d: d.update(temperature_c=87), Reason.GPU_TOO_HOT, "too_hot"),
        (lambda d: d.update(clocks_event_reasons=0x8), Reason.GPU_THROTTLED, "error"),
        (lambda d: d.update(clocks_event_reasons=0x80 | 0x1), Reason.GPU_THROTTLED, "error"),
        (lambda d: d.update(clocks_event_reasons=0x40), Reason.GPU_THROTTLED, "too_hot"),
        (lambda d: d.update(pcie_link_width=4), Reason.GPU_PCIE_DEGRADED, "degraded_link"),
        (
            lambda d: d["nvlinks"][5].update(active=False),
            Reason.GPU_NVLINK_DOWN,
            "degraded_link",
        ),
    ],
)
def test_each_reading_is_judged_by_its_own_rule(change, code, health):
    reading = replayed(change)
    assert codes(reading) == [code]
    assert gpu_health_evaluate(reading)[0] == health


def test_idle_application_clocks_and_software_caps_are_not_throttling():
    # gpu_idle | applications_clocks_setting | sw_power_cap | sync_boost | sw_thermal_slowdown
    reading = replayed(lambda d: d.update(clocks_event_reasons=0x1 | 0x2 | 0x4 | 0x10 | 0x20))
    assert set(reading["throttle_reasons"]) == {
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "sync_boost",
        "sw_thermal_slowdown",
    }
    assert codes(reading) == []


def test_critical_xids_are_a_rule_and_the_ones_a_job_can_cause_are_not():
    uuid = recording()["devices"][0]["uuid"]
    assert codes(replayed(xids={uuid: [13, 31, 43]})) == []  # application faults
    reading = replayed(xids={uuid: [13, 79]})
    found = gpu_health_findings(reading)
    assert [f.code for f in found] == [Reason.GPU_XID]
    assert found[0].data == {"xids": [79]} and "Xid 79" in found[0].why


def test_unsupported_readings_are_absent_and_break_nothing():
    def unsupported(d):
        for key in (
            "ecc_uncorrected_volatile",
            "ecc_corrected_volatile",
            "ecc_uncorrected_aggregate",
            "ecc_corrected_aggregate",
            "remapped_rows",
            "clocks_event_reasons",
            "xid_events",
        ):
            d[key] = None
        for link in d["nvlinks"]:
            link["errors"] = {}

    reading = replayed(unsupported)
    for key in ("ecc_volatile_corrected", "remapped_rows_pending", "throttle_reasons"):
        assert key not in reading
    assert "nvlink_errors" not in reading
    assert codes(reading) == []


def test_nvlink_errors_are_a_rate_against_the_previous_reading():
    def errors(replay=0, crc=0, recovery=0):
        def change(d):  # the counts on link 0, the other links clean
            for i, link in enumerate(d["nvlinks"]):
                link["errors"] = {
                    "replay": replay if i == 0 else 0,
                    "recovery": recovery if i == 0 else 0,
                    "crc_flit": crc if i == 0 else 0,
                    "crc_data": 0,
                }

        return replayed(change)

    first = errors(crc=5_000_000) | {"_at": 1000.0}  # a large lifetime count: no rate yet
    assert codes(first) == []
    previous = {"at": 1000.0, "counters": first["nvlink_errors"]}
    calm = errors(crc=5_000_000 + 180) | {"_at": 1060.0}  # 180 errors in 60 s: 3/s
    assert codes(calm, previous) == []
    storm = errors(crc=5_000_000 + 7200) | {"_at": 1060.0}  # 7200 in 60 s: 120/s
    found = gpu_health_findings(storm, previous)
    assert [f.code for f in found] == [Reason.GPU_NVLINK_ERRORS]
    assert found[0].data["nvlink_rates"]["crc_per_s"] == 120.0
    recovered = errors(crc=5_000_000, recovery=1) | {"_at": 1060.0}
    assert codes(recovered, previous) == [Reason.GPU_NVLINK_ERRORS]
    reset = errors(crc=3) | {"_at": 1060.0}  # the driver reloaded: a new baseline
    assert nvlink_error_rates(reset, previous) is None


def test_a_broken_rule_names_its_code_on_the_device_and_the_event(ready_node):
    node = ready_node.node
    gpu = node.gpus.order_by("index").first()
    services.node_heartbeat(
        node=node,
        actor=Actor.for_node(node),
        gpus=[{"uuid": gpu.uuid, "xids": [48], "remapped_rows_pending": True}],
    )
    gpu.refresh_from_db()
    assert (gpu.healthy, gpu.health) == (False, GpuHealth.ERROR)
    assert {Reason.GPU_XID, Reason.GPU_RETIRED_PAGES_PENDING} <= set(gpu.health_flags)
    event = node.events.filter(reason=Reason.GPU_UNSUITABLE).latest("id")
    assert event.data["rules"] == [Reason.GPU_XID, Reason.GPU_RETIRED_PAGES_PENDING]
    assert event.data["xids"] == [48]
    assert last_event(node).reason == Reason.PROBE_REQUESTED


def test_nvlink_counters_are_compared_across_heartbeats(ready_node):
    node = ready_node.node
    gpu = node.gpus.order_by("index").first()
    actor = Actor.for_node(node)
    from datetime import timedelta

    from django.utils import timezone

    start = timezone.now()
    services.node_heartbeat(
        node=node, actor=actor, now=start, gpus=[{"uuid": gpu.uuid, "nvlink_errors": {"replay": 7}}]
    )
    gpu.refresh_from_db()
    assert gpu.healthy  # a first reading is a baseline, whatever it counts
    assert gpu.nvlink_counters["counters"] == {"replay": 7}  # kept on the device, durably
    services.node_heartbeat(
        node=node,
        actor=actor,
        now=start + timedelta(seconds=10),
        gpus=[{"uuid": gpu.uuid, "nvlink_errors": {"replay": 7 + 500}}],
    )
    gpu.refresh_from_db()
    assert not gpu.healthy and Reason.GPU_NVLINK_ERRORS in gpu.health_flags


@pytest.mark.parametrize(
    "reading",
    [
        {"xids": [-1]},
        {"xids": [1] * 65},
        {"xids": "79"},
        {"throttle_reasons": ["hw_slowdown", "overclocked"]},
        {"nvlink_errors": {"replay": -1}},
        {"nvlink_errors": {"replay": 2**63}},
        {"nvlink_errors": {"bogus": 1}},
        {"remapped_rows_pending": "yes"},
        {"retired_pages_dbe": 10**6},
        {"ecc_aggregate_uncorrected": 2**64},
    ],
)
def test_hostile_readings_are_a_400_and_the_schema_refuses_them_too(ready_node, reading):
    from worker_agent.schema import gpu_health_errors

    node = ready_node.node
    gpu = node.gpus.order_by("index").first()
    body = {"gpus": [{"uuid": gpu.uuid, **reading}]}
    assert gpu_health_errors(body["gpus"][0])
    response = client_for(node=node).post("/api/v1/agent/heartbeat/", body, format="json")
    assert response.status_code == 400, response.content
    assert "gpus" in response.json()
    gpu.refresh_from_db()
    assert gpu.healthy


def test_the_agents_readings_pass_the_api(ready_node):
    node = ready_node.node
    gpu = node.gpus.order_by("index").first()
    reading = replayed(device=0) | {"uuid": gpu.uuid, "xids": [13]}
    response = client_for(node=node).post(
        "/api/v1/agent/heartbeat/", {"gpus": [reading]}, format="json"
    )
    assert response.status_code == 200, response.content
    gpu.refresh_from_db()
    assert gpu.healthy
