"""The planner: placements, degradation, MIG, sharing classes, gangs."""

from dataclasses import replace

from placement import make_context
from placement import reasons as r
from placement.bookkeeping import apply_placement, apply_to_nodes, release
from placement.planner import place, place_gang
from placement.types import (
    Explanation,
    GangPlacement,
    GpuView,
    MigSlice,
    NumaView,
    Placement,
    Policy,
    Request,
)

from .factories import POLICY, cpu_node, gpu_node


def test_places_on_a_fitting_node_with_devices_and_policy_version():
    nodes = [cpu_node("cpu-1"), gpu_node("gpu-1", gpus=4)]
    placement = place(Request(cpu_millicores=4000, gpu_count=2), nodes, POLICY)
    assert isinstance(placement, Placement)
    assert placement.node == "gpu-1"
    assert placement.gpu_indices == (0, 1)
    assert placement.policy_version == 7
    assert set(placement.score_breakdown) == {"fragmentation", "bin_pack"}


def test_ties_go_to_the_smallest_node_name():
    nodes = [cpu_node("b"), cpu_node("a"), cpu_node("c")]
    assert place(Request(cpu_millicores=1000), nodes, POLICY).node == "a"


def test_preferred_values_granted_when_they_fit_and_degrade_to_minimum():
    req = Request(
        cpu_millicores=8000,
        preferred_cpu_millicores=16000,
        memory_mib=1024,
        preferred_memory_mib=4096,
        gpu_count=1,
        preferred_gpu_count=2,
    )
    roomy = place(req, [gpu_node("gpu-1", gpus=4)], POLICY)
    assert roomy.cpu_millicores == 16000 and len(roomy.devices) == 2
    assert not roomy.grants["cpu_millicores"].degraded
    tight = place(req, [gpu_node("gpu-1", gpus=1, cpu=12000, mem=2048)], POLICY)
    assert tight.cpu_millicores == 8000 and tight.memory_mib == 1024 and len(tight.devices) == 1
    assert tight.grants["cpu_millicores"].degraded
    assert tight.grants["gpu_count"].granted == 1
    assert tight.grants["gpu_count"].preferred == 2


def test_preferred_gpu_memory_falls_back_to_minimum():
    req = Request(gpu_count=1, gpu_memory_mib=16384, preferred_gpu_memory_mib=81920)
    placed = place(req, [gpu_node(memory_mib=40960)], POLICY)
    assert placed.grants["gpu_memory_mib"].granted == 16384
    placed = place(req, [gpu_node(memory_mib=40960), gpu_node("gpu-2")], POLICY)
    assert placed.node == "gpu-2"
    assert placed.grants["gpu_memory_mib"].granted == 81920


def test_multi_gpu_prefers_one_interconnect_group_and_may_require_it():
    node = gpu_node(gpus=8)
    devices = tuple(
        replace(g, interconnect_group="nvl-a" if g.index < 4 else "nvl-b") for g in node.gpus
    )
    used = tuple(replace(g, free_milli=0) if g.index in (0, 5) else g for g in devices)
    node = replace(node, gpus=used)
    placed = place(Request(gpu_count=3), [node], POLICY)
    assert placed.gpu_indices == (1, 2, 3)  # one group, not the lowest free indices 1,2,3 by luck
    four = place(Request(gpu_count=4), [node], POLICY)
    assert len(four.devices) == 4  # no group has 4 free: spans groups when allowed
    required = place(Request(gpu_count=4, require_interconnect=True), [node], POLICY)
    assert isinstance(required, Explanation)
    assert required.reasons == {r.INTERCONNECT_UNAVAILABLE: 1}


def test_numa_when_asked():
    node = gpu_node(gpus=2)
    node = replace(
        node,
        gpus=(replace(node.gpus[0], numa_node=0), replace(node.gpus[1], numa_node=1)),
        numa=(NumaView(0, 2000, 8192), NumaView(1, 16000, 65536)),
    )
    req = Request(cpu_millicores=8000, memory_mib=16384, gpu_count=1, require_numa=True)
    assert place(req, [node], POLICY).gpu_indices == (1,)
    too_big = replace(req, cpu_millicores=20000)
    assert place(too_big, [node], POLICY).reasons == {r.NUMA_UNAVAILABLE: 1}


def test_mig_slice_uses_a_valid_free_start_position():
    device = GpuView(
        0,
        model="A100-80GB",
        memory_mib=81920,
        sharing="mig",
        mig_slices=(MigSlice("3g.40gb", 0),),
    )
    node = replace(gpu_node(gpus=1, sharing="mig"), gpus=(device,))
    placed = place(Request(gpu_count=1, sharing="mig", mig_profile="3g.40gb"), [node], POLICY)
    assert placed.devices[0].mig_profile == "3g.40gb"
    assert placed.devices[0].mig_start == 4
    after = apply_placement(node, placed)
    again = place(Request(gpu_count=1, sharing="mig", mig_profile="1g.10gb"), [after], POLICY)
    assert isinstance(again, Explanation)
    freed = release(after, placed)
    assert freed.gpus[0].mig_slices == device.mig_slices


def test_mig_fills_a_carved_device_before_a_fresh_one():
    carved = GpuView(0, model="H100-80GB", sharing="mig", mig_slices=(MigSlice("1g.10gb", 0),))
    fresh = GpuView(1, model="H100-80GB", sharing="mig")
    node = replace(gpu_node(gpus=2, sharing="mig"), gpus=(carved, fresh))
    placed = place(Request(gpu_count=1, sharing="mig", mig_profile="2g.20gb"), [node], POLICY)
    assert (placed.devices[0].index, placed.devices[0].mig_start) == (0, 2)


def test_timeslice_shares_pack_and_never_mix_tenants_by_default():
    node = gpu_node(gpus=2, sharing="timeslice")
    share = Request(gpu_count=1, gpu_milli=400, sharing="timeslice", tenant="acme")
    first = place(share, [node], POLICY)
    node = apply_placement(node, first)
    assert node.gpus[first.devices[0].index].free_milli == 600
    other = place(replace(share, tenant="globex"), [node], POLICY)
    assert other.devices[0].index != first.devices[0].index
    node = apply_placement(node, other)
    third = place(replace(share, tenant="initech"), [node], POLICY)
    assert isinstance(third, Explanation)
    assert third.reasons == {r.TENANT_MIXING_REFUSED: 1}
    mixing = replace(POLICY, allow_tenant_mixing=True)
    assert isinstance(place(replace(share, tenant="initech"), [node], mixing), Placement)


def test_fractional_exclusive_is_refused_as_invalid():
    result = place(Request(gpu_count=1, gpu_milli=500), [gpu_node()], POLICY)
    assert isinstance(result, Explanation)
    assert r.INVALID_REQUEST in result.reasons


def test_gang_spread_hosts_is_all_or_nothing():
    nodes = [gpu_node(f"gpu-{i}", gpus=1) for i in range(3)]
    gang = place_gang(Request(gpu_count=1, replicas=3, gang="spread_hosts"), nodes, POLICY)
    assert isinstance(gang, GangPlacement)
    assert sorted(p.node for p in gang.placements) == ["gpu-0", "gpu-1", "gpu-2"]
    fails = place_gang(Request(gpu_count=1, replicas=4, gang="spread_hosts"), nodes, POLICY)
    assert isinstance(fails, Explanation)
    assert fails.gang_reason == r.GANG_UNPLACEABLE


def test_gang_spread_zones():
    nodes = [
        gpu_node("a1", zone="z1"),
        gpu_node("a2", zone="z1"),
        gpu_node("b1", zone="z2"),
    ]
    gang = place_gang(Request(gpu_count=1, replicas=2, gang="spread_zones"), nodes, POLICY)
    assert {p.node[0] for p in gang.placements} == {"a", "b"}
    assert isinstance(
        place_gang(Request(gpu_count=1, replicas=3, gang="spread_zones"), nodes, POLICY),
        Explanation,
    )


def test_gang_colocate_rack_picks_a_rack_that_holds_all_replicas():
    nodes = [
        gpu_node("r1-a", gpus=2, rack="r1"),
        gpu_node("r2-a", gpus=2, rack="r2"),
        gpu_node("r2-b", gpus=2, rack="r2"),
    ]
    gang = place_gang(Request(gpu_count=2, replicas=2, gang="colocate_rack"), nodes, POLICY)
    assert gang.domain == "r2"
    assert {p.node for p in gang.placements} == {"r2-a", "r2-b"}
    too_many = place_gang(Request(gpu_count=2, replicas=3, gang="colocate_rack"), nodes, POLICY)
    assert isinstance(too_many, Explanation)
    assert "gang_unplaceable" in too_many.message


def test_gang_colocate_interconnect_keeps_replicas_in_one_nvlink_group():
    node = gpu_node("dgx", gpus=8)
    node = replace(
        node,
        gpus=tuple(replace(g, interconnect_group=f"nvl-{g.index // 4}") for g in node.gpus),
    )
    gang = place_gang(
        Request(gpu_count=2, replicas=2, gang="colocate_interconnect"), [node], POLICY
    )
    indices = sorted(i for p in gang.placements for i in p.gpu_indices)
    assert indices == [0, 1, 2, 3]
    assert isinstance(
        place_gang(Request(gpu_count=2, replicas=3, gang="colocate_interconnect"), [node], POLICY),
        Explanation,
    )


def test_failure_domain_spread_scorer_separates_replicas_without_a_hard_rule():
    policy = Policy(version=3, weights={"failure_domain_spread": 1.0})
    nodes = [gpu_node("a", zone="z1"), gpu_node("b", zone="z1"), gpu_node("c", zone="z2")]
    gang = place_gang(Request(gpu_count=1, replicas=2), nodes, policy)
    zones = {next(n.zone for n in nodes if n.name == p.node) for p in gang.placements}
    assert zones == {"z1", "z2"}


def test_a_shared_context_gives_the_same_decisions_as_fresh_ones():
    nodes = [gpu_node(f"gpu-{i}", gpus=2, sharing="timeslice") for i in range(4)]
    shapes = [
        Request(cpu_millicores=4000, gpu_count=1, gpu_milli=300, sharing="timeslice"),
        Request(cpu_millicores=8000, gpu_count=1),
        Request(cpu_millicores=2000),
    ]
    shared_nodes, fresh_nodes = list(nodes), list(nodes)
    ctx = make_context(nodes, POLICY)
    for step in range(12):
        request = shapes[step % 3]
        shared = place(request, shared_nodes, POLICY, ctx)
        fresh = place(request, fresh_nodes, POLICY)
        assert type(shared) is type(fresh)
        if isinstance(fresh, Placement):
            assert (shared.node, shared.devices) == (fresh.node, fresh.devices)
            shared_nodes = apply_to_nodes(shared_nodes, shared)
            fresh_nodes = apply_to_nodes(fresh_nodes, fresh)


def test_mig_request_for_several_slices_is_invalid():
    result = place(Request(gpu_count=2, sharing="mig", mig_profile="1g.10gb"), [gpu_node()], POLICY)
    assert isinstance(result, Explanation)
    assert "one slice" in result.message


def test_numa_node_is_recorded_and_its_capacity_taken():
    node = gpu_node(gpus=2)
    node = replace(
        node,
        gpus=(replace(node.gpus[0], numa_node=0), replace(node.gpus[1], numa_node=1)),
        numa=(NumaView(0, 2000, 8192), NumaView(1, 16000, 65536)),
    )
    req = Request(cpu_millicores=8000, memory_mib=16384, gpu_count=1, require_numa=True)
    placed = place(req, [node], POLICY)
    assert placed.numa_node == 1
    after = apply_placement(node, placed)
    assert after.numa == (NumaView(0, 2000, 8192), NumaView(1, 8000, 49152))
    assert release(after, placed).numa == node.numa
    # Without the request asking for alignment, no NUMA node is claimed.
    unaligned = place(replace(req, require_numa=False), [node], POLICY)
    assert unaligned.numa_node is None
    assert apply_placement(node, unaligned).numa == node.numa
    # A CPU-only request asking for alignment gets the first NUMA node with room.
    cpu_only = place(Request(cpu_millicores=4000, require_numa=True), [node], POLICY)
    assert cpu_only.numa_node == 1


def test_mig_gpu_memory_is_the_profiles_not_the_devices():
    node = gpu_node("mig-1", gpus=1, sharing="mig")  # A100 80 GB: 1g.10gb has 10 GiB
    small = Request(gpu_count=1, sharing="mig", mig_profile="1g.10gb", gpu_memory_mib=20480)
    result = place(small, [node], POLICY)
    assert isinstance(result, Explanation)
    assert result.reasons == {r.GPU_MEMORY_TOO_SMALL: 1}
    assert result.nearest_miss.lacking == {"gpu_memory_mib": 10240}
    assert "10 GiB less GPU memory" in result.nearest_miss.message
    assert place(replace(small, gpu_memory_mib=10240), [node], POLICY).node == "mig-1"
    bigger = replace(small, mig_profile="2g.20gb")
    assert place(bigger, [node], POLICY).devices[0].mig_profile == "2g.20gb"
