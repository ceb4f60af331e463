"""Explanations: counts per reason, the nearest miss, and when ending leases make room."""

from dataclasses import replace
from datetime import UTC, datetime

from placement import reasons as r
from placement.planner import place
from placement.types import Explanation, LeaseEnd, MigSlice, Request

from .factories import POLICY, cpu_node, gpu_node


def _busy(name, free_gpus, leases, **extra):
    node = gpu_node(name, gpus=4, **extra)
    gpus = tuple(replace(g, free_milli=1000 if g.index < free_gpus else 0) for g in node.gpus)
    return replace(node, gpus=gpus, leases=leases)


def test_explanation_counts_reasons_and_names_the_nearest_miss():
    nodes = [
        gpu_node("gpu-16", memory_mib=16384),
        gpu_node("gpu-17", memory_mib=24576),
        gpu_node("gpu-18", state="draining"),
        gpu_node("gpu-19", state="draining"),
    ]
    result = place(Request(gpu_count=1, gpu_memory_mib=30720), nodes, POLICY)
    assert isinstance(result, Explanation)
    assert not result
    assert result.reasons == {r.GPU_MEMORY_TOO_SMALL: 2, "node_not_schedulable(draining)": 2}
    assert result.nearest_miss.node == "gpu-17"
    assert result.nearest_miss.message == "would fit on gpu-17 with 6 GiB less GPU memory"
    assert result.message.startswith("0 of 4 nodes: 2 gpu_memory_too_small, 2 node_not_schedulable")
    assert result.policy_version == 7


def test_nearest_miss_for_cpu():
    nodes = [cpu_node("small", cpu=8000), cpu_node("bigger", cpu=30000)]
    result = place(Request(cpu_millicores=32000), nodes, POLICY)
    assert result.nearest_miss.node == "bigger"
    assert result.nearest_miss.lacking == {"cpu_millicores": 2000}
    assert "2 fewer CPU cores" in result.nearest_miss.message


def test_nearest_miss_says_when_a_lease_ending_makes_room():
    from placement.types import LeaseEnd

    at = datetime(2030, 1, 2, 14, 5, tzinfo=UTC)
    later = datetime(2030, 1, 2, 18, 0, tzinfo=UTC)
    node = _busy(
        "gpu-17",
        free_gpus=1,
        leases=(
            LeaseEnd("L2", later, cpu_millicores=1000, gpu_milli=((3, 1000),)),
            LeaseEnd("L1", at, cpu_millicores=1000, gpu_milli=((1, 1000),)),
        ),
    )
    result = place(Request(gpu_count=2), [node], POLICY)
    assert isinstance(result, Explanation)
    near = result.nearest_miss
    assert near.node == "gpu-17"
    assert near.lacking == {"gpus": 1}
    assert near.fits_at == at and near.fits_on == "gpu-17" and near.after_leases == ("L1",)
    assert near.message == (
        "would fit on gpu-17 with 1 fewer GPU, or when lease L1 ends at 2030-01-02 14:05 UTC"
    )
    assert result.message.endswith(near.message)
    # Three GPUs need both leases to end: the time is the later one, both are named.
    three = place(Request(gpu_count=3), [node], POLICY).nearest_miss
    assert three.fits_at == later and three.after_leases == ("L1", "L2")
    assert "when leases L1, L2 have ended (2030-01-02 18:00 UTC)" in three.message
    # Four GPUs never fit on it, whatever ends (GPU 2 has no lease): no time is promised.
    four = place(Request(gpu_count=4), [node], POLICY).nearest_miss
    assert four.fits_at is None and "lease" not in four.message


def test_nearest_miss_counts_the_mig_slices_a_lease_ending_destroys():
    node = gpu_node("mig-1", gpus=1, sharing="mig")
    carved = (MigSlice("3g.40gb", 0), MigSlice("3g.40gb", 4))  # both halves taken
    node = replace(
        node,
        gpus=(replace(node.gpus[0], mig_slices=carved, free_milli=0),),
        leases=(
            LeaseEnd("late", "T+3h", mig_slots=((0, 0b1111_0000),)),
            LeaseEnd("early", "T+1h", mig_slots=((0, 0b0000_1111),)),
        ),
    )
    half = Request(gpu_count=1, sharing="mig", mig_profile="3g.40gb")
    near = place(half, [node], POLICY).nearest_miss
    assert near.fits_at == "T+1h" and near.after_leases == ("early",)
    assert "when lease early ends at T+1h" in near.message
    # the whole device needs both slices destroyed
    whole = place(replace(half, mig_profile="7g.80gb"), [node], POLICY).nearest_miss
    assert whole.fits_at == "T+3h" and whole.after_leases == ("early", "late")


def test_the_earliest_node_to_free_up_may_not_be_the_nearest_miss():
    from placement.types import LeaseEnd

    soon = datetime(2030, 1, 2, 9, 30, tzinfo=UTC)
    nearest = _busy("a-near", free_gpus=1, leases=())
    waiting = _busy(
        "b-wait", free_gpus=0, leases=(LeaseEnd("77", soon, gpu_milli=((0, 1000), (1, 1000))),)
    )
    result = place(Request(gpu_count=2), [nearest, waiting], POLICY)
    near = result.nearest_miss
    assert near.node == "a-near" and near.fits_on == "b-wait"
    assert near.message == (
        "would fit on a-near with 1 fewer GPU, "
        "or on b-wait when lease 77 ends at 2030-01-02 09:30 UTC"
    )
    # A node that is not schedulable is never offered, whatever its leases.
    draining = replace(waiting, state="draining")
    assert place(Request(gpu_count=2), [nearest, draining], POLICY).nearest_miss.fits_at is None


def test_lease_ends_free_shared_gpu_capacity_and_cpu():
    node = gpu_node("ts", gpus=1, sharing="timeslice", cpu=8000)
    node = replace(
        node,
        free_cpu_millicores=1000,
        gpus=(replace(node.gpus[0], free_milli=200, tenants=("t1",)),),
        leases=(LeaseEnd("9", "T+1h", cpu_millicores=4000, gpu_milli=((0, 500),)),),
    )
    req = Request(cpu_millicores=3000, gpu_count=1, gpu_milli=600, sharing="timeslice", tenant="t1")
    near = place(req, [node], POLICY).nearest_miss
    assert near.fits_at == "T+1h" and "when lease 9 ends at T+1h" in near.message


def test_the_nearest_miss_counts_gpus_first_then_every_other_dimension():
    """ "64 GPUs would fit on gpu-t4-01 with 5 GiB less memory" named a 2-GPU node: the node's
    first refusal was memory, and the miss told only that."""
    small_t4 = gpu_node("gpu-t4-01", gpus=2, model="T4", memory_mib=16384)
    big = gpu_node("gpu-a100", gpus=8, memory_mib=81920)
    req = Request(cpu_millicores=1000, gpu_count=64, gpu_memory_mib=20480)
    result = place(req, [small_t4, big], POLICY)
    assert isinstance(result, Explanation)
    miss = result.nearest_miss
    assert miss.node == "gpu-a100" and miss.lacking == {"gpus": 56}
    both = place(req, [small_t4], POLICY).nearest_miss
    assert list(both.lacking) == ["gpus", "gpu_memory_mib"]  # the count first
    assert both.lacking == {"gpus": 62, "gpu_memory_mib": 4096}
    assert both.message.startswith("would fit on gpu-t4-01 with 62 fewer GPUs and 4 GiB less")
