"""The NVML code path, replayed from a recorded device set (no mock of our own code)."""

from pathlib import Path

import pynvml
import pytest

from worker_agent.inventory import (
    RecordedNvml,
    _interconnect_groups,
    load_nvml,
    read_gpus,
    record,
)

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
