"""One request on one node: run the policy's filters, choose devices, score the ways it fits.

``evaluate`` returns the best fit as an ``Evaluation`` or the reason code of the first check
that refused the node.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from . import reasons as r
from .context import Fit, ScoreContext
from .devices import eligible_devices
from .mig import layout_starts, occupied_slices, profiles_for
from .registry import GPU_CHOICES, active_filters, active_scorers, check_reads
from .types import EXCLUSIVE, MIG, DeviceShare, NodeView, Request


class Evaluation(NamedTuple):
    """The best way a request fits a node, with what it was granted of its preferences."""

    score: float
    fit: Fit
    breakdown: dict[str, float]
    gpu_count: int
    gpu_memory_mib: int


_new = tuple.__new__  # a NamedTuple without its Python-level __new__ (the hot path)

# What the core reads of a node itself, beside its plugins: free room, devices, NUMA nodes.
CORE_READS = frozenset(
    {"free_cpu_millicores", "free_memory_mib", "free_scratch_mib", "gpus", "numa"}
)
# Refusals of the core's device eligibility (``devices.eligible_devices``) that placing more
# work never lifts: devices only fill, shared ones only gain tenants, the rest is what the
# device is. Not here: NUMA and interconnect refusals, which a fuller node can lift when a
# preferred amount it no longer has is no longer granted.
CORE_NEVER_LIFTED = frozenset(
    {
        r.INSUFFICIENT_GPU,
        r.TENANT_MIXING_REFUSED,
        r.DEVICE_UNHEALTHY,
        r.GPU_MODEL_MISMATCH,
        r.GPU_MEMORY_TOO_SMALL,
        r.GPU_DRIVER_TOO_OLD,
        r.GPU_COMPUTE_CAPABILITY_TOO_LOW,
        r.GPU_SHARING_CLASS_UNAVAILABLE,
    }
)


def evaluate(
    req: Request, node: NodeView, ctx: ScoreContext, static_checked: bool = False
) -> Evaluation | str:
    """Best way to place ``req`` on ``node``.

    Returns a reason code string when the node is not eligible. ``static_checked``: the caller
    already ran the static filters on this node (a pass or replay re-evaluating a changed node).
    """
    policy = ctx.policy
    _, dynamic, chain = active_filters(req, ctx)
    for check in dynamic if static_checked else chain:
        reason = check(req, node, policy)
        if reason:
            return reason
    cpu = _granted(req.cpu_millicores, req.preferred_cpu_millicores, node.free_cpu_millicores)
    mem = _granted(req.memory_mib, req.preferred_memory_mib, node.free_memory_mib)
    scratch = _granted(req.scratch_mib, req.preferred_scratch_mib, node.free_scratch_mib)
    count = req.gpu_count
    gpu_mem = req.gpu_memory_mib
    devices = []
    if req.wants_gpu:
        devices = None
        if req.preferred_gpu_memory_mib and req.preferred_gpu_memory_mib > gpu_mem:
            preferred = eligible_devices(req, node, policy, req.preferred_gpu_memory_mib)
            if not isinstance(preferred, str):
                devices, gpu_mem = preferred, req.preferred_gpu_memory_mib
        if devices is None:
            devices = eligible_devices(req, node, policy)
            if isinstance(devices, str):
                return devices
        if req.preferred_gpu_count and count < req.preferred_gpu_count <= len(devices):
            count = req.preferred_gpu_count
    numa_node = None
    if req.require_numa and node.numa:
        aligned = _numa_devices(req, node, devices, cpu, mem)
        if aligned is None:
            return r.NUMA_UNAVAILABLE
        numa_node, devices = aligned
    fits = _fits(req, node, devices, count, cpu, mem, scratch, policy, ctx)
    if isinstance(fits, str):
        return fits
    if numa_node is not None:
        for fit in fits:
            fit.numa_node = numa_node
    best = None
    for fit in fits:  # first wins ties: lowest device index
        total, breakdown = score_fit(req, node, fit, ctx)
        if best is None or total > best[0]:
            best = _new(Evaluation, (total, fit, breakdown, count, gpu_mem))
    return best


check_reads("the core's evaluation", evaluate, CORE_READS)


def score_fit(req, node, fit, ctx) -> tuple[float, dict[str, float]]:
    policy = ctx.policy
    breakdown = {}
    total = 0.0
    for name, weight, scorer in active_scorers(req, ctx):
        value = scorer(req, node, fit, ctx)
        if policy.integer_scores or name in policy.truncated:
            value = math.floor(value)
        breakdown[name] = value
        total += weight * value
    return total, breakdown


def _granted(minimum: int, preferred: int | None, free: int) -> int:
    if preferred is not None and preferred > minimum and free >= preferred:
        return preferred
    return minimum


def _choose_whole(devices, count: int, req: Request):
    """Whole devices: one interconnect group when possible (the tightest that fits)."""
    if count > 1:
        groups: dict[str, list] = {}
        for d in devices:
            if d.interconnect_group:
                groups.setdefault(d.interconnect_group, []).append(d)
        fitting = [g for g in groups.values() if len(g) >= count]
        if fitting:
            best = min(fitting, key=lambda g: (len(g), g[0].index))
            return best[:count]
        if req.require_interconnect:
            return None
    return devices[:count]


def _fits(req, node, devices, count, cpu, mem, scratch, policy, ctx):
    frees = tuple(g.free_milli for g in node.gpus)
    if not req.wants_gpu:
        return [Fit((), cpu, mem, scratch, frees, frees)]
    if req.sharing == MIG:
        best = None
        for d in devices:
            profiles = profiles_for(d.model, d.memory_mib)
            profile = profiles[req.mig_profile]
            used = occupied_slices(d.mig_slices, profiles)
            for start in layout_starts(profile, used, d.mig_layout):
                key = (-len(used), start, d.index)  # fill carved devices first
                if best is None or key < best[0]:
                    best = (key, d, start, profile)
        _, d, start, profile = best
        after = list(frees)
        position = node.gpus.index(d)
        after[position] = max(0, after[position] - profile.compute_milli)
        share = DeviceShare(d.index, profile.compute_milli, profile.name, start, d.uuid)
        return [Fit((share,), cpu, mem, scratch, frees, tuple(after))]
    position = {g.index: i for i, g in enumerate(node.gpus)}
    if req.gpu_milli >= 1000 or req.sharing == EXCLUSIVE:
        chosen = _choose_whole(devices, count, req)
        if chosen is None:
            return r.INTERCONNECT_UNAVAILABLE
        after = list(frees)
        for d in chosen:
            after[position[d.index]] = 0
        shares = tuple(DeviceShare(d.index, 1000, uuid=d.uuid) for d in chosen)
        return [Fit(shares, cpu, mem, scratch, frees, tuple(after))]
    out = []
    if count == 1:
        for d in GPU_CHOICES[policy.gpu_choice].choose(devices, req, ctx):
            after = list(frees)
            after[position[d.index]] -= req.gpu_milli
            share = DeviceShare(d.index, req.gpu_milli, uuid=d.uuid)
            out.append(Fit((share,), cpu, mem, scratch, frees, tuple(after)))
        return out
    chosen = sorted(devices, key=lambda d: (d.free_milli, d.index))[:count]
    after = list(frees)
    for d in chosen:
        after[position[d.index]] -= req.gpu_milli
    shares = tuple(DeviceShare(d.index, req.gpu_milli, uuid=d.uuid) for d in chosen)
    return [Fit(shares, cpu, mem, scratch, frees, tuple(after))]


def _numa_devices(req: Request, node: NodeView, devices, cpu: int, mem: int):
    """(NUMA node id, its devices) for the first NUMA node that has the CPU, the memory and
    enough of the eligible devices, or None."""
    good = {n.id for n in node.numa if n.free_cpu_millicores >= cpu and n.free_memory_mib >= mem}
    if not req.wants_gpu:
        return (min(good), devices) if good else None
    needed = max(req.gpu_count, 1)
    for numa_id in sorted(good):
        on_numa = [d for d in devices if d.numa_node == numa_id]
        if len(on_numa) >= needed:
            return numa_id, on_numa
    return None
