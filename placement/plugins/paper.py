"""The scorers of the FGD paper's baseline policies (0..100, truncated to integers by those
policies): DotProd, GpuClustering, GpuPacking, BestFit, and Random (a constant: the planner then
picks uniformly among feasible nodes). The policies themselves are ``scheduling.replay``'s."""

from __future__ import annotations

import math

from ..bookkeeping import gpu_class
from ..context import Fit, ScoreContext
from ..registry import register_scorer
from ..types import NodeView, Request


def gpu_demand(req: Request) -> int:
    return req.gpu_count * req.gpu_milli if req.gpu_count else 0


@register_scorer("paper_dotprod", reads=("free_cpu_millicores",))
def paper_dotprod(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    cpu = node.free_cpu_millicores / ctx.max_cpu * (req.cpu_millicores / ctx.max_cpu)
    gpu = sum(fit.frees_before) / ctx.max_gpu_milli * (gpu_demand(req) / ctx.max_gpu_milli)
    return 100 * (1 - 0.5 * (cpu + gpu))


@register_scorer("paper_gpu_clustering", reads=("workload_labels",))
def paper_gpu_clustering(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    own = gpu_class(req)
    if not own:
        return 0.0
    present = {label for label in node.workload_labels if label.startswith("gpu-class=")}
    if present == {own}:
        base = 75
    elif own in present:
        base = 50
    elif not present:
        base = 25
    else:
        base = 0
    return base + math.floor(25 * (ctx.max_gpu_milli - sum(fit.frees_before)) / ctx.max_gpu_milli)


@register_scorer("paper_gpu_packing", reads=())
def paper_gpu_packing(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    if not req.gpu_count:
        return 0.0
    n_gpus = len(fit.frees_before)
    if all(f >= 1000 for f in fit.frees_before):
        return max(33 - n_gpus, n_gpus)
    newly_used = sum(1 for d in fit.devices if fit.frees_before[d.index] >= 1000)
    if newly_used:
        return max(50 - newly_used, 33)
    free = fit.frees_before[fit.devices[0].index]
    return 100 - (free // 10) // 10


@register_scorer("paper_best_fit", reads=("free_cpu_millicores",))
def paper_best_fit(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    cpu_left = (node.free_cpu_millicores - req.cpu_millicores) / ctx.max_cpu
    gpu_left = (sum(fit.frees_before) - gpu_demand(req)) / ctx.max_gpu_milli
    return 100 * (1 - (0.5 * cpu_left + 0.5 * gpu_left))


@register_scorer("random", reads=(), draws_random=True)
def constant(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    return 0.0
