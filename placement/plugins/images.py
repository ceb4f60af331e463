"""The image cache: a shape may require the image to be warm on the node (filter); otherwise a
warm node is preferred (scorer)."""

from __future__ import annotations

from .. import reasons as r
from ..context import Fit, ScoreContext
from ..registry import register_filter, register_scorer
from ..types import NodeView, Request


@register_filter(
    "warm_image",
    reasons=(r.IMAGE_NOT_WARM,),
    reads=("warm_images",),
    static=False,  # the node's cache changes as images are pulled
    applies=lambda req: bool(req.require_warm_image and req.image),
)
def require_warm_image(req: Request, node: NodeView, policy) -> str | None:
    if req.require_warm_image and req.image and req.image not in node.warm_images:
        return r.IMAGE_NOT_WARM
    return None


@register_scorer("warm_image", reads=("warm_images",), applies=lambda req, ctx: bool(req.image))
def warm_image(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    return 1.0 if req.image and req.image in node.warm_images else 0.0
