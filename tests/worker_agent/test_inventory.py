"""The NVML code path, replayed from a recorded device set (no mock of our own code)."""

import json
from pathlib import Path

import pynvml
import pytest

from worker_agent.inventory import (
    RecordedNvml,
    _interconnect_groups,
    container_device_ids,
    gpu_usage,
    load_nvml,
    read_gpus,
    record,
)
from worker_agent.runner import Runner
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.process import ProcessRuntime
from worker_agent.state import AgentState
from worker_agent.workroot import WorkRoot

from .conftest import make_owner

FIXTURE = Path(__file__).parent / "fixtures" / "nvml_h100_sxm_x4.json"


def recorded_reading() -> dict:
    return read_gpus(RecordedNvml.from_file(FIXTURE))


@pytest.fixture
def reading():
    return recorded_reading()


def test_inventory_has_what_scheduling_needs(reading):
    gpus = reading["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert {g["model"] for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g["memory_mib"] for g in gpus} == {81559}
    assert {(g["driver_version"], g["cuda_version"]) for g in gpus} == {("550.54.15", "12.4")}
    assert [g["mig_enabled"] for g in gpus] == [False, False, True, False]
    assert [s["profile"] for s in gpus[2]["mig_slices"]] == ["3g.40gb", "1g.10gb"]
    assert gpus[2]["mig_slices"][0]["memory_mib"] == 40192
    assert [g["numa_node"] for g in gpus] == [0, None, 1, 1]  # GPU 1: NUMA not supported
    assert {g["interconnect_group"] for g in gpus} == {"nvl0"}  # all on one NVSwitch
    assert gpus[0]["uuid"].startswith("GPU-")


def test_recording_round_trips_through_the_same_calls(reading):
    replayed = read_gpus(RecordedNvml(record(RecordedNvml.from_file(FIXTURE))))
    assert replayed == reading


def test_interconnect_groups_join_direct_links_and_shared_switches():
    links = {
        "a": {"b"},  # direct NVLink bridge a-b
        "b": {"a"},
        "c": {"switch-1"},
        "d": {"switch-1"},
        "e": set(),  # PCIe only
    }
    groups = _interconnect_groups(links)
    assert groups["a"] == groups["b"] != groups["c"] == groups["d"]
    assert groups["e"] == ""


def test_real_nvml_path_is_used_when_present():
    """On a GPU host this reads the real devices; elsewhere NVML refuses to initialise."""
    try:
        nvml = load_nvml()
    except pynvml.NVMLError:
        with pytest.raises(pynvml.NVMLError):
            pynvml.nvmlDeviceGetCount()
        return
    try:
        reading = read_gpus(nvml)
        assert len(reading["gpus"]) == nvml.nvmlDeviceGetCount()
        assert all(g["uuid"] and g["memory_mib"] > 0 for g in reading["gpus"])
    finally:
        nvml.nvmlShutdown()


def busy_recording() -> RecordedNvml:
    """The recorded node with two devices at work (readings a real NVML gives per device)."""
    nvml = RecordedNvml.from_file(FIXTURE)
    nvml.devices[0] |= {"utilization_gpu_percent": 90, "memory_used_bytes": 30 * 1024**3}
    nvml.devices[1] |= {"utilization_gpu_percent": 40, "memory_used_bytes": 10 * 1024**3}
    return nvml


def test_gpu_usage_of_a_leases_devices():
    nvml = busy_recording()
    uuids = [nvml.devices[0]["uuid"], nvml.devices[1]["uuid"]]
    assert gpu_usage(nvml, uuids) == {"gpu_utilization_percent": 65.0, "gpu_memory_mib": 40960}
    assert gpu_usage(nvml, uuids[:1]) == {"gpu_utilization_percent": 90.0, "gpu_memory_mib": 30720}
    # an idle device without a utilisation reading (NotSupported) still counts its memory
    idle = nvml.devices[3]["uuid"]
    assert gpu_usage(nvml, [idle]) == {"gpu_utilization_percent": 0, "gpu_memory_mib": 0}


def test_gpu_usage_is_absent_without_a_driver_or_devices():
    nvml = busy_recording()
    assert gpu_usage(None, [nvml.devices[0]["uuid"]]) == {}
    assert gpu_usage(nvml, []) == {}
    assert gpu_usage(nvml, ["GPU-not-here", "MIG-GPU-x/0/0"]) == {}


def test_gpu_usage_of_mig_instances_is_their_memory_only():
    """A lease's MIG instance, named as the control plane names it (the GPU instance at a
    slot of its GPU), is found among the GPU's MIG devices by where it is placed: its used
    memory is sampled, and no utilisation is claimed (NVML has none per instance)."""
    nvml = busy_recording()
    gpu = nvml.devices[2]
    big, small = gpu["mig_devices"][:2]  # 3g.40gb placed at slot 4, 1g.10gb at slot 0
    big["memory_used_bytes"] = 12 * 1024**3
    small["memory_used_bytes"] = 3 * 1024**3
    at = {slot: f"MIG-{gpu['uuid']}/{slot}/0" for slot in (0, 4, 2)}

    assert gpu_usage(nvml, [at[4]]) == {"gpu_memory_mib": 12288}
    assert gpu_usage(nvml, [at[0]]) == {"gpu_memory_mib": 3072}
    assert gpu_usage(nvml, [at[4], at[0]]) == {"gpu_memory_mib": 15360}
    assert gpu_usage(nvml, [big["uuid"]]) == {"gpu_memory_mib": 12288}  # a MIG device UUID
    # no instance at slot 2, or on a GPU that is not here: nothing to report
    assert gpu_usage(nvml, [at[2]]) == {}
    assert gpu_usage(nvml, ["MIG-GPU-not-here/0/0", "MIG-x/y/0"]) == {}
    # whole devices beside it keep their utilisation (the mean over the whole ones)
    whole = nvml.devices[0]["uuid"]
    assert gpu_usage(nvml, [whole, at[0]]) == {
        "gpu_utilization_percent": 90.0,
        "gpu_memory_mib": 30720 + 3072,
    }


def test_a_driver_that_does_not_say_where_instances_are_placed_samples_none():
    """Placement needs a privileged agent on real drivers: without it nothing is guessed."""
    nvml = busy_recording()
    gpu = nvml.devices[2]
    for mig in gpu["mig_devices"][:2]:
        del mig["placement_start"]
    assert gpu_usage(nvml, [f"MIG-{gpu['uuid']}/4/0"]) == {}


def test_a_running_jobs_workload_carries_its_gpu_usage(tmp_path):
    """The runner samples the lease's devices beside the runtime's CPU and memory (here the
    process runtime, which does not restrict GPUs, and the recorded NVML)."""
    nvml = busy_recording()
    state = AgentState(tmp_path / "state")
    a = Assignment.parse(
        {
            "job": 7,
            "lease": 8,
            "fencing_token": "1",
            "runtime": "process",
            "command": ["sleep", "5"],
            "limits": {"memory_mib": 256, "pids": 4096, "gpus": [nvml.devices[0]["uuid"]]},
        }
    )
    runtime = ProcessRuntime(make_owner(), tmp_path / "work")
    handle = runtime.create(a, tmp_path)
    runner = Runner(
        a,
        client=None,
        runtime=runtime,
        workdir=WorkRoot(tmp_path / "work", state.dir).attempt_dir(7, 1),
        gpu_usage=lambda uuids: gpu_usage(nvml, uuids),
    )
    runtime.start(handle)
    try:
        usage = runner._sample(handle)
    finally:
        runtime.stop(handle, 0)
    assert usage["gpu_utilization_percent"] == 90.0 and usage["gpu_memory_mib"] == 30720
    assert "memory_mib" in usage and "cpu_millicores" in usage


def test_containers_get_the_uuid_of_the_mig_device_at_the_leased_slot():
    """The control plane names a MIG instance by its GPU and slot; the NVIDIA runtime takes MIG
    device UUIDs. Handed on as written, the slot would be read as an instance ID: another slice."""
    nvml = busy_recording()
    gpu = nvml.devices[2]
    big, small = gpu["mig_devices"][:2]  # 3g.40gb placed at slot 4, 1g.10gb at slot 0
    whole = nvml.devices[0]["uuid"]
    assert container_device_ids(nvml, [f"MIG-{gpu['uuid']}/4/0", whole]) == [big["uuid"], whole]
    assert container_device_ids(nvml, [f"MIG-{gpu['uuid']}/0/0"]) == [small["uuid"]]
    assert container_device_ids(None, [whole]) == [whole]  # whole GPUs need no NVML
    for missing in (f"MIG-{gpu['uuid']}/2/0", "MIG-GPU-not-here/0/0"):
        with pytest.raises(LookupError, match="not found on this node"):
            container_device_ids(nvml, [missing])
    with pytest.raises(LookupError):
        container_device_ids(None, [f"MIG-{gpu['uuid']}/4/0"])  # no driver: never guessed


def test_each_device_reports_its_compute_capability_as_major_minor(reading):
    # the recording's (9, 0) is the H100's published compute capability (see its `source`)
    assert [g["compute_capability"] for g in reading["gpus"]] == ["9.0"] * 4
    recording = json.loads(FIXTURE.read_text())
    recording["devices"][0]["cuda_compute_capability"] = [10, 0]
    del recording["devices"][1]["cuda_compute_capability"]  # a driver that does not say
    gpus = read_gpus(RecordedNvml(recording))["gpus"]
    assert gpus[0]["compute_capability"] == "10.0"
    assert "compute_capability" not in gpus[1]  # optional: left out, never a guess
