"""Cheaper and more energy-efficient nodes first."""

from dataclasses import replace

from placement.plugins.price import price
from placement.types import Request

from ..factories import cpu_node, ctx_for, fit_on


def test_cheaper_and_more_efficient_nodes_score_higher():
    node = cpu_node(price_per_hour=1.0, energy_class=1)
    cheaper = replace(node, price_per_hour=0.0, energy_class=0)
    ctx = ctx_for([node, cheaper])
    assert price(Request(), cheaper, fit_on(cheaper), ctx) > price(
        Request(), node, fit_on(node), ctx
    )
