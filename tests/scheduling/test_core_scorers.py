"""Scorers one by one, and the fragmentation measure they rely on."""

import math
from dataclasses import replace

import pytest

from scheduling.core import scorers
from scheduling.core.fragmentation import Shape, Workload
from scheduling.core.planner import make_context, place
from scheduling.core.scorers import Fit
from scheduling.core.types import Policy, Request

from .core_factories import cpu_node, gpu_node

SHARE = Shape(4000, 500, 1)
WHOLE = Shape(8000, 1000, 1)
WORKLOAD = Workload((SHARE, WHOLE), (0.5, 0.5))


def ctx_for(nodes, **weights):
    policy = Policy(weights=weights or {"fragmentation": 1.0}, workload=WORKLOAD)
    return make_context(nodes, policy)


def fit_on(node, cpu=0, mem=0, frees_after=None):
    frees = tuple(g.free_milli for g in node.gpus)
    return Fit((), cpu, mem, 0, frees, frees if frees_after is None else frees_after)


def test_fragmentation_counts_idle_gpu_typical_requests_cannot_use():
    # Two GPUs with 300 free each: the 500-milli share cannot use them, nor a whole GPU.
    assert WORKLOAD.fragmentation("A100", 64000, 0, (300, 300)) == pytest.approx(600)
    # One full GPU: usable by both typical requests, no fragment.
    assert WORKLOAD.fragmentation("A100", 64000, 0, (1000, 0)) == 0
    # 700 free: the share fits (no fragment), the whole GPU does not (700 fragment).
    assert WORKLOAD.fragmentation("A100", 64000, 0, (700,)) == pytest.approx(350)
    # Not enough CPU for either: all idle GPU is stranded.
    assert WORKLOAD.fragmentation("A100", 1000, 0, (1000, 1000)) == pytest.approx(2000)


def test_fragmentation_respects_model_constraints_and_memory():
    constrained = Workload((Shape(1000, 1000, 1, frozenset({"H100"}), memory_mib=4096),), (1.0,))
    assert constrained.fragmentation("A100", 8000, 8192, (1000,)) == 1000
    assert constrained.fragmentation("H100", 8000, 8192, (1000,)) == 0
    assert constrained.fragmentation("H100", 8000, 1024, (1000,)) == 1000


def test_typical_shapes_keep_the_most_frequent_up_to_coverage():
    counts = {Shape(1, 100, 1): 90, Shape(2, 200, 1): 6, Shape(3, 300, 1): 4}
    workload = Workload.from_counts(counts, coverage=0.95)
    assert workload.shapes == (Shape(1, 100, 1), Shape(2, 200, 1))
    assert sum(workload.probabilities) == pytest.approx(1.0)


def test_fragmentation_scorer_prefers_the_placement_that_fragments_least():
    node = gpu_node(gpus=2, sharing="timeslice")
    node = replace(node, gpus=(replace(node.gpus[0], free_milli=500), node.gpus[1]))
    ctx = ctx_for([node])
    req = Request(cpu_millicores=1000, gpu_count=1, gpu_milli=500, sharing="timeslice")
    on_partial = scorers.fragmentation(req, node, fit_on(node, 1000, 0, (0, 1000)), ctx)
    on_fresh = scorers.fragmentation(req, node, fit_on(node, 1000, 0, (500, 500)), ctx)
    assert on_partial > on_fresh


def test_bin_pack_and_spread_are_complements():
    node = cpu_node(cpu=10000, mem=1000)
    ctx = ctx_for([node])
    fit = fit_on(node, cpu=5000, mem=500)
    assert scorers.bin_pack(Request(), node, fit, ctx) == pytest.approx(0.5)
    assert scorers.spread(Request(), node, fit, ctx) == pytest.approx(0.5)


def test_locality_price_warm_image_affinity():
    node = cpu_node(
        region="eu",
        zone="eu-1",
        price_per_hour=1.0,
        energy_class=1,
        warm_images=frozenset({"sha256:x"}),
        labels={"disk": "nvme"},
    )
    ctx = ctx_for([node])
    fit = fit_on(node)
    req = Request(
        preferred_regions=("eu",),
        preferred_zones=("eu-2",),
        image="sha256:x",
        preferred_affinity={"disk": "nvme", "gpu": "yes"},
    )
    assert scorers.locality(req, node, fit, ctx) == 0.5
    assert scorers.warm_image(req, node, fit, ctx) == 1.0
    assert scorers.affinity(req, node, fit, ctx) == 0.5
    cheaper = replace(node, price_per_hour=0.0, energy_class=0)
    assert scorers.price(req, cheaper, fit, ctx) > scorers.price(req, node, fit, ctx)


def test_failure_domain_spread_penalises_shared_domains():
    a, b = cpu_node("a", zone="z1", rack="r1"), cpu_node("b", zone="z1", rack="r2")
    ctx = ctx_for([a, b])
    ctx.peers = (a,)
    same_host = scorers.failure_domain_spread(Request(), a, fit_on(a), ctx)
    same_zone = scorers.failure_domain_spread(Request(), b, fit_on(b), ctx)
    assert same_host < same_zone < 1.0


def test_node_in_use_prefers_started_nodes():
    fresh = gpu_node("fresh")
    used = replace(fresh, name="used", free_cpu_millicores=60000)
    ctx = ctx_for([fresh, used])
    assert scorers.node_in_use(Request(), fresh, fit_on(fresh), ctx) == 0
    assert scorers.node_in_use(Request(), used, fit_on(used), ctx) == 100


def test_paper_best_fit_and_dotprod_formulas():
    node = replace(gpu_node(gpus=8, cpu=128000), free_cpu_millicores=64000)
    ctx = ctx_for([node])
    req = Request(cpu_millicores=32000, gpu_count=2)
    fit = fit_on(node)
    # 1 - [0.5 * 32000/128000 + 0.5 * 6000/8000] = 0.5
    assert math.floor(scorers.paper_best_fit(req, node, fit, ctx)) == 50
    # 1 - 0.5 * [(64000/128000)(32000/128000) + (8000/8000)(2000/8000)] = 0.8125
    assert math.floor(scorers.paper_dotprod(req, node, fit, ctx)) == 81


def test_paper_gpu_clustering_prefers_nodes_with_the_same_class_only():
    node = gpu_node(gpus=8)
    ctx = ctx_for([node])
    share = Request(gpu_count=1, gpu_milli=500, sharing="timeslice")
    empty = scorers.paper_gpu_clustering(share, node, fit_on(node), ctx)
    same = replace(node, workload_labels=frozenset({"gpu-class=share"}))
    mixed = replace(node, workload_labels=frozenset({"gpu-class=share", "gpu-class=1"}))
    other = replace(node, workload_labels=frozenset({"gpu-class=1"}))
    values = [scorers.paper_gpu_clustering(share, n, fit_on(n), ctx) for n in (same, mixed, other)]
    assert values == [75, 50, 0]
    assert empty == 25


def test_paper_gpu_packing_order():
    node = gpu_node(gpus=4, sharing="timeslice")
    share = Request(gpu_count=1, gpu_milli=300, sharing="timeslice")
    placed = place(share, [node], Policy(weights={"paper_gpu_packing": 1}, gpu_choice="best_fit"))
    assert placed.score == max(33 - 4, 4)
    partly = replace(node, gpus=(replace(node.gpus[0], free_milli=600), *node.gpus[1:]))
    placed = place(share, [partly], Policy(weights={"paper_gpu_packing": 1}, gpu_choice="best_fit"))
    assert placed.devices[0].index == 0
    assert placed.score == 100 - 6


def test_paper_fgd_is_a_sigmoid_of_the_fragmentation_change():
    node = gpu_node(gpus=1, sharing="timeslice")
    ctx = ctx_for([node])
    req = Request(gpu_count=1, gpu_milli=500, sharing="timeslice")
    fit = fit_on(node, 0, 0, (500,))
    delta = scorers.fragmentation(req, node, fit, ctx)
    assert scorers.paper_fgd(req, node, fit, ctx) == pytest.approx(100 / (1 + math.exp(-delta)))


def test_integer_scores_truncate_each_term():
    nodes = [cpu_node("a", cpu=10000)]
    policy = Policy(weights={"bin_pack": 1.0}, integer_scores=True)
    assert place(Request(cpu_millicores=5000), nodes, policy).score == 0
    policy = Policy(weights={"node_packing": 1.0}, integer_scores=True)
    assert place(Request(cpu_millicores=5000), nodes, policy).score == 25  # (50 + 0) / 2 dims


def test_workload_from_requests_keeps_every_shape_with_memory():
    requests = [
        Request(
            cpu_millicores=1000, memory_mib=512, gpu_count=1, gpu_milli=250, sharing="timeslice"
        )
    ] * 3 + [Request(cpu_millicores=2000)]
    workload = Workload.from_requests(requests)
    assert workload.shapes == (Shape(1000, 250, 1, frozenset(), 512), Shape(2000, 0, 0))
    assert workload.probabilities == (0.75, 0.25)
