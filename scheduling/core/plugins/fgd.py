"""Fragmentation gradient (FGD, Weng et al., ATC'23): prefer the placement that raises the
expected GPU fragmentation of the node the least (the measure is ``core.fragmentation``)."""

from __future__ import annotations

import math

from ..context import Fit, ScoreContext
from ..registry import register_scorer
from ..types import NodeView, Request


@register_scorer("fragmentation")
def fragmentation(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Minus the growth of expected GPU fragmentation, in GPUs (FGD's gradient)."""
    w = ctx.workload
    model = node.gpu_model
    before = w.fragmentation(
        model, node.free_cpu_millicores, node.free_memory_mib, fit.frees_before
    )
    after = w.fragmentation(
        model,
        node.free_cpu_millicores - fit.cpu,
        node.free_memory_mib - fit.memory,
        fit.frees_after,
    )
    return (before - after) / 1000.0


@register_scorer("paper_fgd")
def paper_fgd(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """``fragmentation`` on the paper's 0..100 scale (a sigmoid of the change)."""
    delta = fragmentation(req, node, fit, ctx)  # in GPUs, = (F - F') / 1000
    return 100.0 / (1.0 + math.exp(-delta))
