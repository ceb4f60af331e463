"""How full a node is after the placement: pack (``bin_pack``, ``node_packing``,
``gpu_best_fit``, ``node_in_use``, ``best_fit_unpinned``) or spread (``spread``)."""

from __future__ import annotations

from ..context import Fit, ScoreContext
from ..registry import register_scorer
from ..types import NodeView, Request
from .paper import paper_best_fit

_FULLNESS = (
    "cpu_millicores",
    "free_cpu_millicores",
    "memory_mib",
    "free_memory_mib",
    "gpus",
)


@register_scorer("bin_pack", reads=_FULLNESS)
def bin_pack(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """How full the node is after placement, averaged over the dimensions it has (0..1)."""
    used = []
    if node.cpu_millicores:
        used.append(1 - (node.free_cpu_millicores - fit.cpu) / node.cpu_millicores)
    if node.memory_mib:
        used.append(1 - (node.free_memory_mib - fit.memory) / node.memory_mib)
    if node.gpus:
        used.append(1 - sum(fit.frees_after) / (1000 * len(node.gpus)))
    return sum(used) / len(used) if used else 0.0


@register_scorer("node_packing", reads=_FULLNESS)
def node_packing(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """``bin_pack`` in percent (0..100), to serve as an integer tie-breaker."""
    return 100.0 * bin_pack(req, node, fit, ctx)


@register_scorer("spread", reads=_FULLNESS)
def spread(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    return 1.0 - bin_pack(req, node, fit, ctx)


@register_scorer("node_in_use", reads=("free_cpu_millicores", "cpu_millicores"))
def node_in_use(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """100 for a node that already runs work: avoid opening empty nodes (keeps them whole)."""
    in_use = node.free_cpu_millicores < node.cpu_millicores or any(
        f < 1000 for f in fit.frees_before
    )
    return 100.0 if in_use else 0.0


@register_scorer("gpu_best_fit", reads=("free_cpu_millicores",))
def gpu_best_fit(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Tightness of the node after placement: 1 when CPU and GPU are used up (0..1)."""
    cpu_left = (node.free_cpu_millicores - fit.cpu) / ctx.max_cpu
    gpu_left = sum(fit.frees_after) / ctx.max_gpu_milli
    return 1.0 - 0.5 * (cpu_left + gpu_left)


@register_scorer("best_fit_unpinned", reads=("gpus", "gpu_model", "free_cpu_millicores"))
def best_fit_unpinned(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """``paper_best_fit`` on nodes whose GPU model no model-pinned request depends on, else 0.

    Packing the smallest nodes first keeps large ones whole, but when some requests accept only
    certain models, small nodes of those models are exactly what they need.
    """
    if node.gpus and node.gpu_model in ctx.workload.pinned_models:
        return 0.0
    return paper_best_fit(req, node, fit, ctx)
