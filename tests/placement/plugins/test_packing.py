"""Packing and spreading scorers, and integer truncation of their terms."""

from dataclasses import replace

import pytest

from placement.planner import place
from placement.plugins.packing import bin_pack, node_in_use, spread
from placement.types import Policy, Request

from ..factories import cpu_node, ctx_for, fit_on, gpu_node


def test_bin_pack_and_spread_are_complements():
    node = cpu_node(cpu=10000, mem=1000)
    ctx = ctx_for([node])
    fit = fit_on(node, cpu=5000, mem=500)
    assert bin_pack(Request(), node, fit, ctx) == pytest.approx(0.5)
    assert spread(Request(), node, fit, ctx) == pytest.approx(0.5)


def test_node_in_use_prefers_started_nodes():
    fresh = gpu_node("fresh")
    used = replace(fresh, name="used", free_cpu_millicores=60000)
    ctx = ctx_for([fresh, used])
    assert node_in_use(Request(), fresh, fit_on(fresh), ctx) == 0
    assert node_in_use(Request(), used, fit_on(used), ctx) == 100


def test_integer_scores_truncate_each_term():
    nodes = [cpu_node("a", cpu=10000)]
    policy = Policy(weights={"bin_pack": 1.0}, integer_scores=True)
    assert place(Request(cpu_millicores=5000), nodes, policy).score == 0
    policy = Policy(weights={"node_packing": 1.0}, integer_scores=True)
    assert place(Request(cpu_millicores=5000), nodes, policy).score == 25  # (50 + 0) / 2 dims
