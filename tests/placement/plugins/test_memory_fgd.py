"""The memory-coupled fragmentation gradient (``memory_fgd``) and the measure behind it."""

from dataclasses import replace
from random import Random

import pytest

from placement import DEFAULT_POLICY, evaluate, make_context, place
from placement.fragmentation import Shape, Workload
from placement.plugins.fgd import memory_fgd, paper_fgd
from placement.types import Policy, Request

from ..factories import fit_on, gpu_node

GIB = 1024
WHOLE = Shape(8000, 1000, 1, memory_mib=16 * GIB)  # a one-GPU task with 16 GiB


def test_gpus_stranded_without_memory_count_as_fragmented():
    one = Workload((WHOLE,), (1.0,))
    # Four free GPUs but memory for two copies: two GPUs are stranded.
    assert one.coupled_fragmentation("T4", 64000, 32 * GIB, (1000,) * 4) == 2000
    assert one.fragmentation("T4", 64000, 32 * GIB, (1000,) * 4) == 0  # FGD does not see it
    # Memory for four copies or more: nothing is stranded.
    assert one.coupled_fragmentation("T4", 64000, 64 * GIB, (1000,) * 4) == 0
    assert one.coupled_fragmentation("T4", 64000, 500 * GIB, (1000,) * 4) == 0


def test_a_node_without_memory_for_a_typical_task_cannot_host_it():
    one = Workload((WHOLE,), (1.0,))
    assert one.coupled_fragmentation("T4", 64000, 16 * GIB - 1, (1000, 1000)) == 2000
    assert one.coupled_fragmentation("T4", 64000, 16 * GIB, (1000, 1000)) == 1000


def test_the_copies_memory_allows_take_the_devices_with_the_most_free():
    share = Workload((Shape(2000, 500, 1, memory_mib=8 * GIB),), (1.0,))
    # 1000, 600 and 300 free; one copy fits in memory: it counts the 1000, the rest is stranded.
    assert share.coupled_fragmentation("T4", 64000, 8 * GIB, (300, 1000, 600)) == 900
    assert share.coupled_fragmentation("T4", 64000, 16 * GIB, (300, 1000, 600)) == 300
    # A two-GPU task uses two devices per copy.
    pair = Workload((Shape(2000, 1000, 2, memory_mib=8 * GIB),), (1.0,))
    assert pair.coupled_fragmentation("T4", 64000, 8 * GIB, (1000,) * 4) == 2000
    assert pair.coupled_fragmentation("T4", 64000, 16 * GIB, (1000,) * 4) == 0


def test_shapes_without_memory_and_cpu_only_shapes_are_as_in_fgd():
    mix = Workload((Shape(4000, 500, 1), Shape(8000, 1000, 1), Shape(8000, 0, 0)), (0.4, 0.4, 0.2))
    for state in [(64000, 0, (300, 1000)), (6000, 1, (1000, 1000)), (1000, 0, (700,))]:
        assert mix.coupled_fragmentation("A", *state) == pytest.approx(
            mix.fragmentation("A", *state)
        )


def reference(workload: Workload, model, cpu, mem, frees) -> float:
    """IDEAS.md's definition, written out plainly, without bands or memo."""
    total = sum(frees)
    expected = 0.0
    for s, p in zip(workload.shapes, workload.probabilities, strict=True):
        fitting = sorted((r for r in frees if r >= s.gpu_milli), reverse=True)
        if (
            not s.gpu_milli
            or cpu < s.cpu_millicores
            or mem < s.memory_mib
            or (s.models and model not in s.models)
            or len(fitting) < s.gpu_count
        ):
            expected += p * total
            continue
        copies = mem // s.memory_mib if s.memory_mib else len(frees)
        expected += p * (total - sum(fitting[: copies * s.gpu_count]))
    return expected


def test_the_memoised_measure_equals_the_definition_on_random_nodes():
    rng = Random(7)
    shapes = [
        Shape(
            rng.choice([2000, 4000, 8000, 16000]),
            rng.choice([0, 250, 500, 1000, 1000]),
            1,
            rng.choice([frozenset(), frozenset({"T4"})]),
            rng.choice([0, 4 * GIB, 12 * GIB, 30 * GIB]),
        )
        for _ in range(12)
    ] + [Shape(32000, 1000, 4, memory_mib=64 * GIB), Shape(8000, 1000, 2, memory_mib=24 * GIB)]
    shapes = [s if s.gpu_milli else Shape(s.cpu_millicores, 0, 0) for s in shapes]
    workload = Workload(tuple(shapes), tuple(1 / len(shapes) for _ in shapes))
    for _ in range(3000):
        frees = tuple(
            rng.choice([0, 100, 250, 500, 750, 1000]) for _ in range(rng.choice([1, 2, 4, 8]))
        )
        state = (rng.choice(["T4", "V100"]), rng.randrange(0, 40000), rng.randrange(0, 200 * GIB))
        expected = reference(workload, *state, frees)
        assert workload.coupled_fragmentation(*state, frees) == pytest.approx(expected)


def test_typical_shapes_carry_the_mean_memory_of_their_tasks():
    shapes = [Shape(1000, 500, 1, memory_mib=m) for m in (1000, 3000)] + [Shape(2000, 0, 0)]
    workload = Workload.with_mean_memory(shapes, coverage=1.0)
    assert workload.shapes == (Shape(1000, 500, 1, memory_mib=2000), Shape(2000, 0, 0))
    assert workload.probabilities == pytest.approx((2 / 3, 1 / 3))


def busy(node):
    """``node`` with every GPU taken (CPU and memory still free)."""
    return replace(node, gpus=tuple(replace(g, free_milli=0) for g in node.gpus))


def test_the_scorer_keeps_memory_where_the_free_gpus_are():
    # A memory-heavy CPU-only task: on the node with idle GPUs it takes the memory they need.
    idle = gpu_node("idle", gpus=2, model="T4", mem=32 * GIB)
    full = busy(gpu_node("full", gpus=2, model="T4", mem=32 * GIB))
    workload = Workload((WHOLE,), (1.0,))
    ctx = make_context([idle, full], Policy(weights={"memory_fgd": 1.0}, workload=workload))
    req = Request(cpu_millicores=4000, memory_mib=16 * GIB)
    on_idle = memory_fgd(req, idle, fit_on(idle, 4000, 16 * GIB), ctx)
    on_full = memory_fgd(req, full, fit_on(full, 4000, 16 * GIB), ctx)
    assert on_idle < on_full == 50.0
    assert paper_fgd(req, idle, fit_on(idle, 4000, 16 * GIB), ctx) == 50.0  # FGD is blind to it


def test_the_product_path_places_with_it():
    # Through place(): the memory-heavy CPU-only task goes where it strands no GPU, although
    # that node sorts after the other by name.
    a = gpu_node("a-idle", gpus=2, model="T4", mem=32 * GIB)
    b = busy(gpu_node("b-busy", gpus=2, model="T4", mem=32 * GIB))
    policy = Policy(weights={"memory_fgd": 1.0}, workload=Workload((WHOLE,), (1.0,)))
    placement = place(Request(cpu_millicores=4000, memory_mib=16 * GIB), [a, b], policy)
    assert placement.node == "b-busy"
    assert placement.score_breakdown["memory_fgd"] == 50.0


def test_the_default_policy_couples_memory_with_a_measured_mix():
    # The product default with the mix of recent requests attached (Workload.from_requests).
    recent = [Request(cpu_millicores=8000, memory_mib=16 * GIB, gpu_count=1)] * 9 + [
        Request(cpu_millicores=4000, memory_mib=16 * GIB)
    ]
    policy = DEFAULT_POLICY.with_workload(Workload.from_requests(recent))
    a = gpu_node("a-idle", gpus=2, model="T4", mem=32 * GIB)
    b = busy(gpu_node("b-busy", gpus=2, model="T4", mem=32 * GIB))
    req = Request(cpu_millicores=4000, memory_mib=16 * GIB)
    assert place(req, [a, b], policy).node == "b-busy"
    ctx = make_context([a, b], policy)
    assert evaluate(req, a, ctx)[2]["memory_fgd"] < evaluate(req, b, ctx)[2]["memory_fgd"] == 50
    # The generic mix a policy falls back to has no memory in it: nothing to couple to.
    generic = make_context([a, b], DEFAULT_POLICY)
    assert evaluate(req, a, generic)[2]["memory_fgd"] == 50
