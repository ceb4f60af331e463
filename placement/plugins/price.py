"""Cost: cheaper and more energy-efficient nodes first."""

from __future__ import annotations

from ..context import Fit, ScoreContext
from ..registry import register_scorer
from ..types import NodeView, Request


@register_scorer("price", reads=("price_per_hour", "energy_class"))
def price(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Cheaper and more energy-efficient nodes first (0..1)."""
    return 1.0 / (1.0 + node.price_per_hour) - 0.1 * node.energy_class
