"""The FGD paper's baseline scorers."""

import math
from dataclasses import replace

from placement.planner import place
from placement.plugins.paper import paper_best_fit, paper_dotprod, paper_gpu_clustering
from placement.types import Policy, Request

from ..factories import ctx_for, fit_on, gpu_node


def test_paper_best_fit_and_dotprod_formulas():
    node = replace(gpu_node(gpus=8, cpu=128000), free_cpu_millicores=64000)
    ctx = ctx_for([node])
    req = Request(cpu_millicores=32000, gpu_count=2)
    fit = fit_on(node)
    # 1 - [0.5 * 32000/128000 + 0.5 * 6000/8000] = 0.5
    assert math.floor(paper_best_fit(req, node, fit, ctx)) == 50
    # 1 - 0.5 * [(64000/128000)(32000/128000) + (8000/8000)(2000/8000)] = 0.8125
    assert math.floor(paper_dotprod(req, node, fit, ctx)) == 81


def test_paper_gpu_clustering_prefers_nodes_with_the_same_class_only():
    node = gpu_node(gpus=8)
    ctx = ctx_for([node])
    share = Request(gpu_count=1, gpu_milli=500, sharing="timeslice")
    empty = paper_gpu_clustering(share, node, fit_on(node), ctx)
    same = replace(node, workload_labels=frozenset({"gpu-class=share"}))
    mixed = replace(node, workload_labels=frozenset({"gpu-class=share", "gpu-class=1"}))
    other = replace(node, workload_labels=frozenset({"gpu-class=1"}))
    values = [paper_gpu_clustering(share, n, fit_on(n), ctx) for n in (same, mixed, other)]
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
