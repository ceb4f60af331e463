"""Filters on the node itself: its state, a pin to one node, its trust level."""

from __future__ import annotations

from .. import reasons as r
from ..registry import register_filter
from ..types import DRAIN_EXEMPT_STATES, SCHEDULABLE_STATES, NodeView, Request


@register_filter(
    "node_pin",
    reasons=(r.NODE_PIN_MISMATCH,),
    reads=("name",),
    static=True,
    applies=lambda req: bool(req.node_pin),
)
def node_pin(req: Request, node: NodeView, policy) -> str | None:
    return r.NODE_PIN_MISMATCH if req.node_pin and req.node_pin != node.name else None


@register_filter(
    "node_schedulable",
    reasons=(r.NODE_NOT_SCHEDULABLE, r.NODE_UNREACHABLE),
    reads=("state", "healthy", "reachable"),
    # static: placing work changes none of these. Not ``never_lifted``: whether ``draining``
    # refuses depends on the request (``drain_exempt``), and the batch planner keys its classes
    # by the request, so a drain-exempt class never inherits another class's refusal
    static=True,
)
def node_schedulable(req: Request, node: NodeView, policy) -> str | None:
    """``node_not_schedulable`` carries why, e.g. ``node_not_schedulable(draining)``. A
    drain-exempt request (a volume's export) may go on a draining node too."""
    if node.state not in (DRAIN_EXEMPT_STATES if req.drain_exempt else SCHEDULABLE_STATES):
        return f"{r.NODE_NOT_SCHEDULABLE}({node.state})"
    if not node.healthy:
        return f"{r.NODE_NOT_SCHEDULABLE}(unhealthy)"
    if not node.reachable:
        return r.NODE_UNREACHABLE
    return None


@register_filter("trust_level", reasons=(r.TRUST_LEVEL,), reads=("trust_level",), static=True)
def trust_level(req: Request, node: NodeView, policy) -> str | None:
    return r.TRUST_LEVEL if node.trust_level < req.min_trust_level else None
