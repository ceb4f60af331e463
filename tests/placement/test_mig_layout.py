"""The scheduler places MIG slices on the real layout: the instances the node's agent read
through NVML (profile and start each), not a layout assumed from the profile names
(placement/mig.py layout_starts; leases/node_views.py mig_layout; nodes/inventory.py drift)."""

from dataclasses import replace

from leases.node_views import mig_layout
from nodes.inventory import inventory_drift
from placement import Explanation, place
from placement.types import GpuView, MigSlice, Request

from .factories import POLICY, gpu_node

# what the recorded H100 fixture's MIG GPU reports: 1g.10gb at slot 0, 3g.40gb at slot 4
CARVED = (MigSlice("1g.10gb", 0), MigSlice("3g.40gb", 4))


def node_with(device: GpuView):
    return replace(gpu_node(gpus=1, sharing="mig"), gpus=(device,))


def mig(profile: str) -> Request:
    return Request(gpu_count=1, sharing="mig", mig_profile=profile)


def test_a_slice_goes_only_where_an_instance_of_its_profile_is_carved():
    device = GpuView(0, model="H100-80GB", sharing="mig", mig_layout=CARVED)
    placed = place(mig("3g.40gb"), [node_with(device)], POLICY)
    assert (placed.devices[0].mig_profile, placed.devices[0].mig_start) == ("3g.40gb", 4)
    placed = place(mig("1g.10gb"), [node_with(device)], POLICY)
    assert placed.devices[0].mig_start == 0
    # a free valid start, but no 2g.20gb instance there: the scheduler does not assume one
    assert isinstance(place(mig("2g.20gb"), [node_with(device)], POLICY), Explanation)


def test_a_carved_instance_in_use_is_not_offered_again():
    device = GpuView(
        0, model="H100-80GB", sharing="mig", mig_layout=CARVED, mig_slices=(MigSlice("", 4),)
    )
    assert isinstance(place(mig("3g.40gb"), [node_with(device)], POLICY), Explanation)


def test_an_unknown_layout_keeps_any_valid_start():
    device = GpuView(0, model="H100-80GB", sharing="mig")  # mig_layout None: not reported
    placed = place(mig("2g.20gb"), [node_with(device)], POLICY)
    assert placed.devices[0].mig_start == 0


def test_the_snapshot_reads_the_reported_instances():
    reported = [
        {"profile": "3g.40gb", "uuid": "MIG-a", "start": 4},
        {"profile": "1g.10gb", "uuid": "MIG-b", "start": 0},
    ]
    assert mig_layout(reported) == CARVED
    assert mig_layout([{"profile": "3g.40gb"}]) is None  # an agent that cannot say where
    assert mig_layout([]) is None


def test_a_changed_layout_is_drift():
    gpu = {"uuid": "GPU-1", "model": "H100", "memory_mib": 81559, "mig_enabled": True}
    before = {"gpus": [gpu | {"mig_slices": [{"profile": "3g.40gb", "start": 4}]}]}
    after = {"gpus": [gpu | {"mig_slices": [{"profile": "2g.20gb", "start": 4}]}]}
    diffs, large = inventory_drift(before, after)
    assert diffs == [
        {"field": "gpu.mig_slices", "uuid": "GPU-1", "from": ["3g.40gb@4"], "to": ["2g.20gb@4"]}
    ]
    assert not large
