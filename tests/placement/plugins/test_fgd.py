"""The fragmentation-gradient scorers."""

import math
from dataclasses import replace

import pytest

from placement.plugins.fgd import fragmentation, paper_fgd
from placement.types import Request

from ..factories import ctx_for, fit_on, gpu_node


def test_fragmentation_scorer_prefers_the_placement_that_fragments_least():
    node = gpu_node(gpus=2, sharing="timeslice")
    node = replace(node, gpus=(replace(node.gpus[0], free_milli=500), node.gpus[1]))
    ctx = ctx_for([node])
    req = Request(cpu_millicores=1000, gpu_count=1, gpu_milli=500, sharing="timeslice")
    on_partial = fragmentation(req, node, fit_on(node, 1000, 0, (0, 1000)), ctx)
    on_fresh = fragmentation(req, node, fit_on(node, 1000, 0, (500, 500)), ctx)
    assert on_partial > on_fresh


def test_paper_fgd_is_a_sigmoid_of_the_fragmentation_change():
    node = gpu_node(gpus=1, sharing="timeslice")
    ctx = ctx_for([node])
    req = Request(gpu_count=1, gpu_milli=500, sharing="timeslice")
    fit = fit_on(node, 0, 0, (500,))
    delta = fragmentation(req, node, fit, ctx)
    assert paper_fgd(req, node, fit, ctx) == pytest.approx(100 / (1 + math.exp(-delta)))
