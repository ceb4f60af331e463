"""Where the node is: allowed regions and zones (filter), preferred ones and replica spread
across hosts, racks and zones (scorers)."""

from __future__ import annotations

from .. import reasons as r
from ..context import Fit, ScoreContext
from ..registry import register_filter, register_scorer
from ..types import NodeView, Request


@register_filter(
    "region",
    reasons=(r.REGION_EXCLUDED,),
    reads=("region", "zone"),
    static=True,
    applies=lambda req: bool(req.regions or req.zones),
)
def region(req: Request, node: NodeView, policy) -> str | None:
    if (req.regions and node.region not in req.regions) or (
        req.zones and node.zone not in req.zones
    ):
        return r.REGION_EXCLUDED
    return None


@register_scorer(
    "locality",
    reads=("region", "zone"),
    applies=lambda req, ctx: bool(req.preferred_regions or req.preferred_zones),
)
def locality(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    score = 0.0
    if req.preferred_regions and node.region in req.preferred_regions:
        score += 0.5
    if req.preferred_zones and node.zone in req.preferred_zones:
        score += 0.5
    return score


@register_scorer(
    "failure_domain_spread",
    reads=("name", "rack", "zone"),
    applies=lambda req, ctx: bool(ctx.peers),
)
def failure_domain_spread(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Replicas prefer hosts, racks and zones their peers do not use (0..1)."""
    if not ctx.peers:
        return 1.0
    shared_host = any(p.name == node.name for p in ctx.peers)
    shared_rack = any(p.rack and p.rack == node.rack for p in ctx.peers)
    shared_zone = any(p.zone and p.zone == node.zone for p in ctx.peers)
    return 1.0 - 0.5 * shared_host - 0.3 * shared_rack - 0.2 * shared_zone
