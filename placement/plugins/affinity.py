"""Node labels the request requires (filter) or prefers (scorer), and workload labels it must
avoid on the node or, scoped to zones, anywhere in the node's zone (anti-affinity, a filter on
what placing work changes)."""

from __future__ import annotations

from .. import reasons as r
from ..context import Fit, ScoreContext
from ..registry import register_filter, register_scorer
from ..types import ZONE_SCOPE, NodeView, Request


@register_filter(
    "affinity",
    reasons=(r.AFFINITY_MISMATCH,),
    reads=("labels",),
    static=True,
    never_lifted=(r.AFFINITY_MISMATCH,),
    applies=lambda req: bool(req.affinity),
)
def affinity(req: Request, node: NodeView, policy) -> str | None:
    for key, value in req.affinity.items():
        if node.labels.get(key) != value:
            return r.AFFINITY_MISMATCH
    return None


@register_filter(
    "anti_affinity",
    reasons=(r.ANTI_AFFINITY,),
    reads=("workload_labels", "zone_workload_labels", "zone"),
    static=False,
    never_lifted=(r.ANTI_AFFINITY,),  # the node and its zone only gain workload labels
    applies=lambda req: bool(req.anti_affinity),
)
def anti_affinity(req: Request, node: NodeView, policy) -> str | None:
    """Scope "zone": the work of every node of the node's zone counts (``zone_workload_labels``,
    which the planner completes with the nodes it is given); a node without a zone falls back
    to its own work, as scope "host"."""
    if not req.anti_affinity:
        return None
    seen = node.workload_labels
    if req.anti_affinity_scope == ZONE_SCOPE and node.zone:
        seen = seen | node.zone_workload_labels
    return r.ANTI_AFFINITY if seen.intersection(req.anti_affinity) else None


@register_scorer(
    "affinity", reads=("labels",), applies=lambda req, ctx: bool(req.preferred_affinity)
)
def preferred_affinity(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    if not req.preferred_affinity:
        return 0.0
    matched = sum(node.labels.get(k) == v for k, v in req.preferred_affinity.items())
    return matched / len(req.preferred_affinity)
