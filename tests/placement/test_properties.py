"""Property tests: a placement never exceeds any free dimension of any node, device or slice."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from placement import apply_placement, place
from placement.mig import occupied_slices, profiles_for
from placement.types import GpuView, MigSlice, NodeView, Placement, Policy, Request

POLICIES = [
    Policy(weights={"fragmentation": 1.0, "bin_pack": 0.1}),
    Policy(weights={"paper_best_fit": 1.0}, gpu_choice="best_fit", integer_scores=True),
    Policy(weights={"spread": 1.0}, gpu_choice="lowest_index", allow_tenant_mixing=True),
]
MIG_PROFILES = sorted(profiles_for("A100-80GB"))


@st.composite
def gpus(draw, sharing):
    count = draw(st.integers(0, 8))
    devices = []
    for i in range(count):
        if sharing == "mig":
            used = draw(st.lists(st.sampled_from(MIG_PROFILES), max_size=3))
            slices, taken = [], set()
            profiles = profiles_for("A100-80GB")
            for name in used:
                profile = profiles[name]
                for start in profile.starts:
                    span = set(range(start, start + profile.slices))
                    if not span & taken and start + profile.slices <= 8:
                        taken |= span
                        slices.append(MigSlice(name, start))
                        break
            free = 1000 - sum(profiles[s.profile].compute_milli for s in slices)
            devices.append(
                GpuView(
                    i,
                    model="A100-80GB",
                    memory_mib=81920,
                    sharing="mig",
                    mig_slices=tuple(slices),
                    free_milli=max(0, free),
                )
            )
        else:
            free = (
                draw(st.integers(0, 1000))
                if sharing != "exclusive"
                else draw(st.sampled_from([0, 1000]))
            )
            tenants = tuple(draw(st.lists(st.sampled_from(["a", "b"]), max_size=2)))
            devices.append(
                GpuView(
                    i,
                    model="T4",
                    memory_mib=16384,
                    sharing=sharing,
                    free_milli=free,
                    tenants=tenants if free < 1000 else (),
                    interconnect_group=draw(st.sampled_from(["", "g0", "g1"])),
                )
            )
    return tuple(devices)


@st.composite
def nodes(draw):
    result = []
    for i in range(draw(st.integers(1, 5))):
        sharing = draw(st.sampled_from(["exclusive", "timeslice", "mps", "mig"]))
        cpu = draw(st.integers(0, 64000))
        mem = draw(st.integers(0, 262144))
        result.append(
            NodeView(
                name=f"n{i}",
                cpu_millicores=64000,
                memory_mib=262144,
                scratch_mib=100000,
                free_cpu_millicores=cpu,
                free_memory_mib=mem,
                free_scratch_mib=draw(st.integers(0, 100000)),
                gpus=draw(gpus(sharing)),
            )
        )
    return result


@st.composite
def requests(draw):
    sharing = draw(st.sampled_from(["exclusive", "timeslice", "mps", "mig"]))
    count = draw(st.integers(0, 4)) if sharing != "mig" else 1
    milli = 1000 if sharing == "exclusive" else draw(st.integers(1, 1000))
    return Request(
        cpu_millicores=draw(st.integers(0, 40000)),
        preferred_cpu_millicores=draw(st.none() | st.integers(0, 64000)),
        memory_mib=draw(st.integers(0, 200000)),
        scratch_mib=draw(st.integers(0, 50000)),
        gpu_count=count,
        preferred_gpu_count=draw(st.none() | st.integers(0, 6)),
        gpu_milli=milli,
        sharing=sharing,
        mig_profile=draw(st.sampled_from(MIG_PROFILES)) if sharing == "mig" else "",
        tenant=draw(st.sampled_from(["a", "b"])),
    )


@settings(max_examples=300, deadline=None)
@given(nodes(), requests(), st.sampled_from(POLICIES))
def test_placement_never_exceeds_free_capacity(snapshot, request, policy):
    result = place(request, snapshot, policy)
    if not isinstance(result, Placement):
        return
    node = next(n for n in snapshot if n.name == result.node)
    assert result.cpu_millicores <= node.free_cpu_millicores
    assert result.memory_mib <= node.free_memory_mib
    assert result.scratch_mib <= node.free_scratch_mib
    assert result.cpu_millicores >= request.cpu_millicores
    devices = {g.index: g for g in node.gpus}
    indices = [d.index for d in result.devices]
    assert len(indices) == len(set(indices))
    if request.gpu_count and request.sharing != "mig":
        assert len(indices) >= request.gpu_count
    for share in result.devices:
        device = devices[share.index]
        if share.mig_profile:
            profiles = profiles_for(device.model, device.memory_mib)
            profile = profiles[share.mig_profile]
            assert share.mig_start in profile.starts
            span = set(range(share.mig_start, share.mig_start + profile.slices))
            assert not span & occupied_slices(device.mig_slices, profiles)
            assert max(span) < 8
        else:
            assert share.milli <= device.free_milli
            if share.milli >= 1000:
                assert device.is_free
            elif not policy.allow_tenant_mixing:
                assert set(device.tenants) <= {request.tenant}
    after = apply_placement(node, result)
    assert after.free_cpu_millicores >= 0 and after.free_memory_mib >= 0
    assert all(g.free_milli >= 0 for g in after.gpus)


@settings(max_examples=100, deadline=None)
@given(nodes(), st.lists(requests(), min_size=1, max_size=8))
def test_repeated_placements_stay_within_capacity(snapshot, batch):
    policy = POLICIES[0]
    for request in batch:
        result = place(replace(request, preferred_cpu_millicores=None), snapshot, policy)
        if isinstance(result, Placement):
            snapshot = [
                apply_placement(n, result) if n.name == result.node else n for n in snapshot
            ]
    for node in snapshot:
        assert node.free_cpu_millicores >= 0
        assert node.free_memory_mib >= 0
        assert node.free_scratch_mib >= 0
        for g in node.gpus:
            assert g.free_milli >= 0
            if g.sharing == "mig":
                profiles = profiles_for(g.model, g.memory_mib)
                spans = [
                    set(range(s.start, s.start + profiles[s.profile].slices)) for s in g.mig_slices
                ]
                assert sum(len(s) for s in spans) == len(set().union(*spans)) if spans else True
