"""Filters on the node itself: pin, state, trust level."""

from dataclasses import replace

import pytest

from placement import DEFAULT_POLICY, place
from placement import reasons as r
from placement.batch import plan
from placement.planner import evaluation_key
from placement.types import Explanation, Request

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
        # a drain-exempt request (a volume's export) may go on a draining node, nowhere else new
        ("node_schedulable", {"drain_exempt": True}, {"state": "draining"}, None),
        ("node_schedulable", {"drain_exempt": True}, {}, None),
        (
            "node_schedulable",
            {"drain_exempt": True},
            {"state": "quarantined"},
            "node_not_schedulable(quarantined)",
        ),
        (
            "node_schedulable",
            {"drain_exempt": True},
            {"state": "retired"},
            "node_not_schedulable(retired)",
        ),
        (
            "node_schedulable",
            {"drain_exempt": True},
            {"state": "draining", "healthy": False},
            "node_not_schedulable(unhealthy)",
        ),
        (
            "node_schedulable",
            {"drain_exempt": True},
            {"state": "draining", "reachable": False},
            r.NODE_UNREACHABLE,
        ),
        ("trust_level", {"min_trust_level": 2}, {"trust_level": 1}, r.TRUST_LEVEL),
        ("trust_level", {"min_trust_level": 1}, {"trust_level": 1}, None),
    ],
)
def test_node_filters(name, request_kwargs, node_kwargs, reason):
    assert refusal(name, Request(**request_kwargs), cpu_node(**node_kwargs)) == reason


def test_a_drain_exempt_request_is_its_own_class_in_the_batch_plan():
    """The filter is static, and the batch planner keys its classes by the request: a draining
    node refused for good to a normal request is never refused to a drain-exempt one, in the
    plan as in ``place``, whatever came first."""
    nodes = [cpu_node("home", state="draining"), cpu_node("other")]
    normal = Request(cpu_millicores=100, node_pin="home")
    export = replace(normal, drain_exempt=True)
    assert evaluation_key(normal, DEFAULT_POLICY) != evaluation_key(export, DEFAULT_POLICY)
    outcomes, after = plan([normal, export, normal, export], nodes, DEFAULT_POLICY)
    assert [o.placement.node if o.placement else None for o in outcomes] == [
        None,
        "home",
        None,
        "home",
    ]
    assert outcomes[0].explanation.reasons == {
        "node_not_schedulable(draining)": 1,
        r.NODE_PIN_MISMATCH: 1,
    }
    assert after[0].free_cpu_millicores == nodes[0].free_cpu_millicores - 200
    assert place(export, nodes, DEFAULT_POLICY).node == "home"
    assert isinstance(place(normal, nodes, DEFAULT_POLICY), Explanation)
