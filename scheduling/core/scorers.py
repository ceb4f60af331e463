"""Scorers: rank the eligible nodes. Higher is better.

A scorer is ``f(request, node, fit, ctx) -> float`` where ``fit`` is one concrete way of placing
the request on the node (devices chosen, capacity after). The planner sums
``policy.weights[name] * f(...)`` over the policy's scorers, optionally truncating each term to
an integer (``policy.integer_scores``, as the Kubernetes framework does for the paper policies).

Product scorers return values of order 0..1 (fragmentation: the change in GPUs); the six policies
of the FGD paper (``paper_*``) return their published 0..100 integer-able scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from random import Random

from .fragmentation import Workload
from .types import NodeView, Request


@dataclass(slots=True)
class Fit:
    """One way to place a request on a node: the devices and the node's capacity after."""

    devices: tuple  # tuple[DeviceShare, ...]
    cpu: int  # reserved amounts (granted)
    memory: int
    scratch: int
    frees_before: tuple[int, ...]
    frees_after: tuple[int, ...]
    numa_node: int | None = None  # set when the request required NUMA alignment


@dataclass(slots=True)
class ScoreContext:
    policy: object
    workload: Workload
    max_cpu: int = 1
    max_gpu_milli: int = 1
    peers: tuple[NodeView, ...] = ()  # nodes already holding replicas of the same gang/group
    rng: Random = field(default_factory=Random)
    active: tuple = (None, ())  # (request, scorers that can tell nodes apart for it)
    # (request key, id(node)) -> (node, evaluation): a NodeView is immutable, and
    # apply_to_nodes keeps unchanged nodes as the same objects, so placing many requests on one
    # snapshot re-evaluates only the nodes that changed.
    evaluations: dict = field(default_factory=dict)


def gpu_demand(req: Request) -> int:
    return req.gpu_count * req.gpu_milli if req.gpu_count else 0


# --- product scorers -------------------------------------------------------------------------


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


def node_packing(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """``bin_pack`` in percent (0..100), to serve as an integer tie-breaker."""
    return 100.0 * bin_pack(req, node, fit, ctx)


def node_in_use(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """100 for a node that already runs work: avoid opening empty nodes (keeps them whole)."""
    in_use = node.free_cpu_millicores < node.cpu_millicores or any(
        f < 1000 for f in fit.frees_before
    )
    return 100.0 if in_use else 0.0


def spread(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    return 1.0 - bin_pack(req, node, fit, ctx)


def failure_domain_spread(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Replicas prefer hosts, racks and zones their peers do not use (0..1)."""
    if not ctx.peers:
        return 1.0
    shared_host = any(p.name == node.name for p in ctx.peers)
    shared_rack = any(p.rack and p.rack == node.rack for p in ctx.peers)
    shared_zone = any(p.zone and p.zone == node.zone for p in ctx.peers)
    return 1.0 - 0.5 * shared_host - 0.3 * shared_rack - 0.2 * shared_zone


def locality(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    score = 0.0
    if req.preferred_regions and node.region in req.preferred_regions:
        score += 0.5
    if req.preferred_zones and node.zone in req.preferred_zones:
        score += 0.5
    return score


def price(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Cheaper and more energy-efficient nodes first (0..1)."""
    return 1.0 / (1.0 + node.price_per_hour) - 0.1 * node.energy_class


def warm_image(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    return 1.0 if req.image and req.image in node.warm_images else 0.0


def affinity(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    if not req.preferred_affinity:
        return 0.0
    matched = sum(node.labels.get(k) == v for k, v in req.preferred_affinity.items())
    return matched / len(req.preferred_affinity)


def gpu_best_fit(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """Tightness of the node after placement: 1 when CPU and GPU are used up (0..1)."""
    cpu_left = (node.free_cpu_millicores - fit.cpu) / ctx.max_cpu
    gpu_left = sum(fit.frees_after) / ctx.max_gpu_milli
    return 1.0 - 0.5 * (cpu_left + gpu_left)


# --- the six policies of the FGD paper (scores 0..100) ---------------------------------------


def paper_dotprod(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    cpu = node.free_cpu_millicores / ctx.max_cpu * (req.cpu_millicores / ctx.max_cpu)
    gpu = sum(fit.frees_before) / ctx.max_gpu_milli * (gpu_demand(req) / ctx.max_gpu_milli)
    return 100 * (1 - 0.5 * (cpu + gpu))


def gpu_class(req: Request) -> str:
    if not req.gpu_count:
        return ""
    return "gpu-class=share" if req.gpu_milli < 1000 else f"gpu-class={req.gpu_count}"


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


def paper_best_fit(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    cpu_left = (node.free_cpu_millicores - req.cpu_millicores) / ctx.max_cpu
    gpu_left = (sum(fit.frees_before) - gpu_demand(req)) / ctx.max_gpu_milli
    return 100 * (1 - (0.5 * cpu_left + 0.5 * gpu_left))


def best_fit_unpinned(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    """``paper_best_fit`` on nodes whose GPU model no model-pinned request depends on, else 0.

    Packing the smallest nodes first keeps large ones whole, but when some requests accept only
    certain models, small nodes of those models are exactly what they need.
    """
    if node.gpus and node.gpu_model in ctx.workload.pinned_models:
        return 0.0
    return paper_best_fit(req, node, fit, ctx)


def paper_fgd(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    delta = fragmentation(req, node, fit, ctx)  # in GPUs, = (F - F') / 1000
    return 100.0 / (1.0 + math.exp(-delta))


def constant(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    return 0.0


# Scorers that give every node the same value unless the request (or gang) asks for something;
# skipping them changes all totals by the same constant, so never a decision.
APPLIES = {
    "affinity": lambda req, ctx: bool(req.preferred_affinity),
    "locality": lambda req, ctx: bool(req.preferred_regions or req.preferred_zones),
    "warm_image": lambda req, ctx: bool(req.image),
    "failure_domain_spread": lambda req, ctx: bool(ctx.peers),
}


def active_scorers(req: Request, ctx: ScoreContext) -> tuple:
    """(name, weight, function) of the policy's scorers that matter for ``req``; cached."""
    if ctx.active[0] is not req:
        chosen = tuple(
            (name, weight, SCORERS[name])
            for name, weight in ctx.policy.weights.items()
            if name not in APPLIES or APPLIES[name](req, ctx)
        )
        ctx.active = (req, chosen)
    return ctx.active[1]


SCORERS = {
    "fragmentation": fragmentation,
    "bin_pack": bin_pack,
    "node_packing": node_packing,
    "node_in_use": node_in_use,
    "spread": spread,
    "failure_domain_spread": failure_domain_spread,
    "locality": locality,
    "price": price,
    "warm_image": warm_image,
    "affinity": affinity,
    "gpu_best_fit": gpu_best_fit,
    "paper_dotprod": paper_dotprod,
    "paper_gpu_clustering": paper_gpu_clustering,
    "paper_gpu_packing": paper_gpu_packing,
    "paper_best_fit": paper_best_fit,
    "paper_fgd": paper_fgd,
    "best_fit_unpinned": best_fit_unpinned,
    "random": constant,  # the planner picks uniformly among feasible nodes
}
