"""MIG verified instead of believed (worker_agent/mig.py).

The profile check runs against the recorded NVML fixture (tests/worker_agent/fixtures/
nvml_h100_sxm_x4.json: GPU 2 carries a 1g.10gb instance at slot 0 and a 3g.40gb one at slot 4)
through `RecordedNvml`, the same calls a node makes. Reconfiguration creates and destroys GPU
instances, which no recording can answer: those tests use `CallRecordingNvml`, a fake of the
NVML layer ONLY (no GPU exists on the machines that run these tests), which records the calls
made. Neither proves anything on hardware: reconfiguration is unverified on a GPU.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pynvml
import pytest

from worker_agent.inventory import RecordedNvml, read_gpus
from worker_agent.mig import (
    MIG_PROFILE_MISMATCH,
    MigRefused,
    apply_layout,
    check_instance,
    checked_device_ids,
)
from worker_agent.runtime.base import Limits, RuntimeFailure
from worker_agent.runtime.docker import DockerRuntime

from .conftest import make_owner
from .test_docker_runtime import assignment
from .test_inventory import FIXTURE


def recording() -> dict:
    return copy.deepcopy(RecordedNvml.from_file(FIXTURE).__dict__)


@pytest.fixture
def nvml():
    return RecordedNvml(recording())


@pytest.fixture
def mig_gpu(nvml):
    return nvml.devices[2]


def test_the_instance_at_the_slot_with_the_leased_profile_is_handed_over(nvml, mig_gpu):
    small, big = mig_gpu["mig_devices"][1], mig_gpu["mig_devices"][0]
    assert check_instance(nvml, f"MIG-{mig_gpu['uuid']}/0/0", "1g.10gb") == small["uuid"]
    assert check_instance(nvml, f"MIG-{mig_gpu['uuid']}/4/0", "3g.40gb") == big["uuid"]
    whole = nvml.devices[0]["uuid"]
    ids = checked_device_ids(
        nvml, [f"MIG-{mig_gpu['uuid']}/4/0", whole], {f"MIG-{mig_gpu['uuid']}/4/0": "3g.40gb"}
    )
    assert ids == [big["uuid"], whole]


@pytest.mark.parametrize(
    ("slot", "leased", "says"),
    [
        (0, "3g.40gb", "is 1g.10gb, not the leased 3g.40gb"),  # another profile at the slot
        (4, "2g.20gb", "is 3g.40gb, not the leased 2g.20gb"),
        (2, "1g.10gb", "no MIG instance"),  # nothing placed there
    ],
)
def test_a_mismatched_or_missing_instance_is_refused(nvml, mig_gpu, slot, leased, says):
    with pytest.raises(MigRefused) as refused:
        check_instance(nvml, f"MIG-{mig_gpu['uuid']}/{slot}/0", leased)
    assert refused.value.reason == MIG_PROFILE_MISMATCH == "mig_profile_mismatch"
    assert says in refused.value.message


def test_the_profile_is_the_gpu_instances_not_the_device_name():
    """The GPU instance's profile id (nvmlGpuInstanceGetInfo) decides; a driver that does not
    give the profile table falls back to the MIG device's name."""
    data = recording()
    gpu = data["devices"][2]
    gpu["mig_devices"][1]["name"] = "NVIDIA H100 80GB HBM3 MIG 3g.40gb"  # a lying name
    identifier = f"MIG-{gpu['uuid']}/0/0"
    assert check_instance(RecordedNvml(data), identifier, "1g.10gb")  # profile id 19: 1g.10gb
    gpu["gpu_instance_profiles"] = None  # no table: the name is all there is
    with pytest.raises(MigRefused):
        check_instance(RecordedNvml(data), identifier, "1g.10gb")


def test_another_compute_instance_at_the_slot_is_refused(mig_gpu):
    data = recording()
    data["devices"][2]["mig_devices"][1]["compute_instance_id"] = 1
    with pytest.raises(MigRefused, match="compute instance 1"):
        check_instance(RecordedNvml(data), f"MIG-{mig_gpu['uuid']}/0/0", "1g.10gb")


def test_the_inventory_reports_where_each_instance_is_placed(nvml):
    slices = read_gpus(nvml)["gpus"][2]["mig_slices"]
    assert [(s["profile"], s["start"]) for s in slices] == [("3g.40gb", 4), ("1g.10gb", 0)]


def test_limits_carry_the_leased_profiles():
    limits = Limits.parse({"gpus": ["MIG-GPU-x/4/0"], "mig_profiles": {"MIG-GPU-x/4/0": "3g.40gb"}})
    assert limits.mig_profiles == (("MIG-GPU-x/4/0", "3g.40gb"),)
    assert Limits.parse({"mig_profiles": ["not", "a", "map"]}).mig_profiles == ()


def docker_runtime(nvml) -> DockerRuntime:
    """The Docker runtime's device step alone (no engine needed for it)."""
    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime.nvml = nvml
    return runtime


def test_the_docker_runtime_refuses_a_mismatch_with_its_reason(nvml, mig_gpu):
    runtime = docker_runtime(nvml)
    slot = f"MIG-{mig_gpu['uuid']}/0/0"
    assert runtime._device_ids([slot], ((slot, "1g.10gb"),)) == [mig_gpu["mig_devices"][1]["uuid"]]
    with pytest.raises(RuntimeFailure) as refused:
        runtime._device_ids([slot], ((slot, "3g.40gb"),))
    assert refused.value.reason == "mig_profile_mismatch"


def test_a_mismatched_profile_creates_no_container(
    docker_client, test_image, workdir, nvml, mig_gpu
):
    """Through the real engine: the refusal comes before anything of the attempt exists."""
    slot = f"MIG-{mig_gpu['uuid']}/0/0"
    runtime = DockerRuntime(make_owner("test-node"), client=docker_client, nvml=nvml)
    limits = {"cpu_millicores": 500, "memory_mib": 64, "scratch_mib": 8, "pids": 64}
    a = assignment(
        test_image,
        ["true"],
        limits=limits | {"gpus": [slot], "mig_profiles": {slot: "3g.40gb"}},
    )
    name = runtime.container_name(a)
    with pytest.raises(RuntimeFailure) as refused:
        runtime.create(a, workdir)
    assert refused.value.reason == "mig_profile_mismatch"
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert docker_client.volumes.list(filters={"name": f"{name}-scratch"}) == []


# --------------------------------------------------------------------------- reconfiguration


class CallRecordingNvml(RecordedNvml):
    """A fake of the NVML layer only (no GPU here): the recording's answers, plus the MIG
    create/destroy calls, which it records in `calls` and applies to the recorded device so
    that a later inventory reading shows the new layout."""

    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED

    def __init__(self, recording):
        super().__init__(recording)
        self.calls: list[tuple] = []

    def nvmlGpuInstanceGetComputeInstanceById(self, gi, ci):
        self.calls.append(("nvmlGpuInstanceGetComputeInstanceById", gi["gpu_instance_id"], ci))
        return ("ci", gi["uuid"], ci)

    def nvmlComputeInstanceDestroy(self, compute):
        self.calls.append(("nvmlComputeInstanceDestroy", compute[1]))

    def nvmlGpuInstanceDestroy(self, gi):
        self.calls.append(("nvmlGpuInstanceDestroy", gi["gpu_instance_id"]))
        for device in self.devices:
            slots = device.get("mig_devices") or []
            device["mig_devices"] = [None if m is gi else m for m in slots]

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h, profile_id, placement):
        self.calls.append(
            (
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                profile_id,
                placement.start,
                placement.size,
            )
        )
        info = next(p for p in h["gpu_instance_profiles"] if p["id"] == profile_id)
        slots = h["mig_devices"]
        free = slots.index(None)
        slots[free] = {
            "uuid": f"MIG-new-{placement.start}",
            "name": f"{h['name']} {info['name']}",
            "memory_total_bytes": info["memory_size_mb"] * 1024 * 1024,
            "gpu_instance_id": 20 + free,
            "compute_instance_id": 0,
            "placement_start": placement.start,
            "placement_size": placement.size,
            "profile_id": profile_id,
            "memory_used_bytes": 0,
        }
        return slots[free]

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, engine):
        # as NVML: a compute profile larger than the GPU instance is not supported on it
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
        size = int(self.mig_profile_of(gi)["slice_count"])
        if profile not in slices or slices[profile] > size:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile, sliceCount=slices[profile], instanceCount=1)

    def mig_profile_of(self, gi) -> dict:
        device = next(d for d in self.devices if gi in (d.get("mig_devices") or ()))
        return next(p for p in device["gpu_instance_profiles"] if p["id"] == gi["profile_id"])

    def nvmlGpuInstanceCreateComputeInstance(self, gi, profile_id):
        self.calls.append(
            ("nvmlGpuInstanceCreateComputeInstance", gi["gpu_instance_id"], profile_id)
        )
        return ("ci", gi["uuid"], 0)


def fake(*, mig_on=True) -> CallRecordingNvml:
    data = recording()
    if not mig_on:
        data["devices"][2]["mig_mode"] = [0, 0]
    return CallRecordingNvml(data)


LAYOUT = [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]


def test_reconfiguration_destroys_then_creates_in_order_and_reports_the_new_layout():
    nvml = fake()
    gpu = nvml.devices[2]["uuid"]
    apply_layout(nvml, gpu, LAYOUT, is_root=lambda: True)
    made = [c[0] for c in nvml.calls if not c[0].endswith("ById")]
    assert made == [
        "nvmlComputeInstanceDestroy",  # each compute instance before its GPU instance
        "nvmlGpuInstanceDestroy",
        "nvmlComputeInstanceDestroy",
        "nvmlGpuInstanceDestroy",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceCreateComputeInstance",
    ]
    creates = [c for c in nvml.calls if c[0] == "nvmlDeviceCreateGpuInstanceWithPlacement"]
    assert creates == [  # profile id 9 (3g.40gb), at slices 0 and 4, 4 memory slices each
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 9, 0, 4),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 9, 4, 4),
    ]
    computes = [c for c in nvml.calls if c[0] == "nvmlGpuInstanceCreateComputeInstance"]
    assert all(c[2] == 2 for c in computes)  # the 3-slice compute profile: the whole instance
    slices = read_gpus(nvml)["gpus"][2]["mig_slices"]
    assert sorted((s["profile"], s["start"]) for s in slices) == [("3g.40gb", 0), ("3g.40gb", 4)]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"is_root": lambda: False}, "root"),
        ({"is_root": lambda: True, "mig_on": False}, "MIG mode is off"),
        ({"is_root": lambda: True, "busy": True}, "in use"),
        ({"is_root": lambda: True, "layout": [{"profile": "5g.50gb", "start": 0}]}, "placement"),
        ({"is_root": lambda: True, "layout": [{"profile": "3g.40gb", "start": 9}]}, "placement"),
        ({"is_root": lambda: True, "gpu": "GPU-not-here"}, "not on this node"),
    ],
)
def test_reconfiguration_guard_rails_touch_nothing(kwargs, says):
    nvml = fake(mig_on=kwargs.pop("mig_on", True))
    gpu = kwargs.pop("gpu", nvml.devices[2]["uuid"])
    busy = {nvml.devices[2]["mig_devices"][0]["uuid"]} if kwargs.pop("busy", False) else set()
    layout = kwargs.pop("layout", LAYOUT)
    with pytest.raises(MigRefused, match=says) as refused:
        apply_layout(nvml, gpu, layout, busy=busy, **kwargs)
    assert refused.value.reason == "mig_layout_refused"
    assert not [c for c in nvml.calls if "Destroy" in c[0] or "Create" in c[0]]
