"""Regions and zones: allowed (filter), preferred (locality), replicas apart (spread)."""

import pytest

from placement import reasons as r
from placement.plugins.topology import failure_domain_spread, locality
from placement.types import Request

from ..factories import cpu_node, ctx_for, fit_on, refusal


@pytest.mark.parametrize(
    ("request_kwargs", "node_kwargs", "reason"),
    [
        ({"regions": ("eu",)}, {"region": "us"}, r.REGION_EXCLUDED),
        ({"zones": ("eu-1",)}, {"zone": "eu-2"}, r.REGION_EXCLUDED),
        ({"regions": ("eu",), "zones": ("eu-1",)}, {"region": "eu", "zone": "eu-1"}, None),
    ],
)
def test_region_filter(request_kwargs, node_kwargs, reason):
    assert refusal("region", Request(**request_kwargs), cpu_node(**node_kwargs)) == reason


def test_locality_scores_each_preferred_match():
    node = cpu_node(region="eu", zone="eu-1")
    req = Request(preferred_regions=("eu",), preferred_zones=("eu-2",))
    assert locality(req, node, fit_on(node), ctx_for([node])) == 0.5


def test_failure_domain_spread_penalises_shared_domains():
    a, b = cpu_node("a", zone="z1", rack="r1"), cpu_node("b", zone="z1", rack="r2")
    ctx = ctx_for([a, b])
    ctx.peers = (a,)
    same_host = failure_domain_spread(Request(), a, fit_on(a), ctx)
    same_zone = failure_domain_spread(Request(), b, fit_on(b), ctx)
    assert same_host < same_zone < 1.0
