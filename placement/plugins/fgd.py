"""Fragmentation gradient (FGD, Weng et al., ATC'23): prefer the placement that raises the
expected GPU fragmentation of the node the least (the measure is ``core.fragmentation``).

``memory_fgd`` measures it coupled to the node's free memory (``coupled_fragmentation``): GPUs
left without the memory to run typical requests on them are the fragments they really are.
"""

from __future__ import annotations

import math

from ..context import Fit, ScoreContext
from ..registry import register_scorer
from ..types import NodeView, Request

# what Workload.of_node measures of the node as it is, beside what _gradient reads
_MEASURED = ("gpus", "gpu_model", "free_cpu_millicores", "free_memory_mib")


def _gradient(workload, coupled: bool, node: NodeView, fit: Fit) -> float:
    """Minus the growth of the node's fragmentation from placing ``fit``, in GPUs."""
    measure = workload.coupled_fragmentation if coupled else workload.fragmentation
    after = measure(
        node.gpu_model,
        node.free_cpu_millicores - fit.cpu,
        node.free_memory_mib - fit.memory,
        fit.frees_after,
    )
    return (workload.of_node(node, coupled) - after) / 1000.0


def _sigmoid_scale(delta: float) -> float:
    """The paper's 0..100 scale: 50 is no change, higher is less fragmentation."""
    return 100.0 / (1.0 + math.exp(-delta))


@register_scorer("fragmentation", reads=_MEASURED)
def fragmentation(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Minus the growth of expected GPU fragmentation, in GPUs (FGD's gradient)."""
    return _gradient(ctx.workload, False, node, fit)


@register_scorer("paper_fgd", reads=_MEASURED)
def paper_fgd(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """``fragmentation`` on the paper's 0..100 scale (a sigmoid of the change)."""
    return _sigmoid_scale(fragmentation(req, node, fit, ctx))


@register_scorer("memory_fgd", reads=_MEASURED)
def memory_fgd(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """The memory-coupled fragmentation gradient on the paper's 0..100 scale."""
    return _sigmoid_scale(_gradient(ctx.workload, True, node, fit))
