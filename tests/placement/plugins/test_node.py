"""Filters on the node itself: pin, state, trust level."""

import pytest

from placement import reasons as r
from placement.types import Request

from ..factories import cpu_node, refusal


@pytest.mark.parametrize(
    ("name", "request_kwargs", "node_kwargs", "reason"),
    [
        ("node_pin", {"node_pin": "other"}, {}, r.NODE_PIN_MISMATCH),
        ("node_pin", {"node_pin": "cpu-1"}, {}, None),
        ("node_schedulable", {}, {"state": "draining"}, "node_not_schedulable(draining)"),
        ("node_schedulable", {}, {"healthy": False}, "node_not_schedulable(unhealthy)"),
        ("node_schedulable", {}, {"reachable": False}, r.NODE_UNREACHABLE),
        ("node_schedulable", {}, {}, None),
        ("trust_level", {"min_trust_level": 2}, {"trust_level": 1}, r.TRUST_LEVEL),
        ("trust_level", {"min_trust_level": 1}, {"trust_level": 1}, None),
    ],
)
def test_node_filters(name, request_kwargs, node_kwargs, reason):
    assert refusal(name, Request(**request_kwargs), cpu_node(**node_kwargs)) == reason
