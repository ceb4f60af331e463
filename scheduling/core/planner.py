"""The planner: ``place`` one request (or a gang) on a snapshot, and apply or release the result."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import fields, replace
from random import Random

from . import filters
from . import reasons as r
from .fragmentation import generic_workload
from .mig import free_starts, occupied_slices, profiles_for
from .scorers import Fit, ScoreContext, active_scorers, gpu_class
from .types import (
    COLOCATE_INTERCONNECT,
    COLOCATE_RACK,
    COLOCATE_ZONE,
    EXCLUSIVE,
    GANG_NONE,
    MIG,
    SPREAD_HOSTS,
    SPREAD_ZONES,
    DeviceShare,
    Explanation,
    GangPlacement,
    GpuView,
    Grant,
    LeaseEnd,
    MigSlice,
    NearMiss,
    NodeView,
    Placement,
    Policy,
    Request,
)

_GIB = 1024


def make_context(nodes, policy: Policy, peers=(), rng: Random | None = None) -> ScoreContext:
    max_cpu = max((n.cpu_millicores for n in nodes), default=1) or 1
    max_gpu = max((1000 * len(n.gpus) for n in nodes), default=1000) or 1000
    workload = policy.workload or _GENERIC
    return ScoreContext(
        policy=policy,
        workload=workload,
        max_cpu=max_cpu,
        max_gpu_milli=max_gpu,
        peers=tuple(peers),
        rng=rng or Random(policy.seed),
    )


_GENERIC = generic_workload()


# --- one node --------------------------------------------------------------------------------


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


def _share_candidates(devices, req: Request, policy: Policy, ctx: ScoreContext):
    """Devices a fractional share may go to, in the order the policy prefers them."""
    if policy.gpu_choice == "best_fit":
        return [min(devices, key=lambda d: (d.free_milli, d.index))]
    if policy.gpu_choice == "random":
        return [ctx.rng.choice(devices)]
    if policy.gpu_choice == "lowest_index":
        return [devices[0]]
    seen, out = set(), []  # fragmentation: every distinct free level, lowest index first
    for d in devices:
        if d.free_milli not in seen:
            seen.add(d.free_milli)
            out.append(d)
    return out


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
            for start in free_starts(profile, used):
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
        for d in _share_candidates(devices, req, policy, ctx):
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


def evaluate(req: Request, node: NodeView, ctx: ScoreContext, static_checked: bool = False):
    """Best way to place ``req`` on ``node``: (score, fit, breakdown, gpu count, gpu memory).

    Returns a reason code string when the node is not eligible.
    """
    policy = ctx.policy
    if not static_checked:
        reason = filters.static_reason(req, node, policy)
        if reason:
            return reason
    reason = filters.anti_affinity(req, node, policy) or filters.warm_image(req, node, policy)
    if reason:
        return reason
    reason = filters.capacity_reason(req, node)
    if reason:
        return reason
    cpu = _granted(req.cpu_millicores, req.preferred_cpu_millicores, node.free_cpu_millicores)
    mem = _granted(req.memory_mib, req.preferred_memory_mib, node.free_memory_mib)
    scratch = _granted(req.scratch_mib, req.preferred_scratch_mib, node.free_scratch_mib)
    count = req.gpu_count
    gpu_mem = req.gpu_memory_mib
    devices = []
    if req.wants_gpu:
        devices = "unset"
        if req.preferred_gpu_memory_mib and req.preferred_gpu_memory_mib > gpu_mem:
            preferred = filters.eligible_devices(req, node, policy, req.preferred_gpu_memory_mib)
            if not isinstance(preferred, str):
                devices, gpu_mem = preferred, req.preferred_gpu_memory_mib
        if devices == "unset":
            devices = filters.eligible_devices(req, node, policy)
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
            best = (total, fit, breakdown, count, gpu_mem)
    return best


def _degraded(req: Request, result) -> int:
    """How many preferred dimensions the evaluated fit had to degrade to the minimum."""
    _, fit, _, count, gpu_mem = result
    missed = 0
    for preferred, granted in (
        (req.preferred_cpu_millicores, fit.cpu),
        (req.preferred_memory_mib, fit.memory),
        (req.preferred_scratch_mib, fit.scratch),
        (req.preferred_gpu_count, count),
        (req.preferred_gpu_memory_mib, gpu_mem),
    ):
        if preferred is not None and granted < preferred:
            missed += 1
    return missed


def _grants(req: Request, fit: Fit, count: int, gpu_mem: int) -> dict[str, Grant]:
    grants = {
        "cpu_millicores": Grant(req.cpu_millicores, _pref(req, "cpu_millicores"), fit.cpu),
        "memory_mib": Grant(req.memory_mib, _pref(req, "memory_mib"), fit.memory),
        "scratch_mib": Grant(req.scratch_mib, _pref(req, "scratch_mib"), fit.scratch),
    }
    if req.wants_gpu:
        grants["gpu_count"] = Grant(req.gpu_count, _pref(req, "gpu_count"), count)
        grants["gpu_memory_mib"] = Grant(req.gpu_memory_mib, _pref(req, "gpu_memory_mib"), gpu_mem)
    return grants


def _pref(req: Request, name: str) -> int:
    preferred = getattr(req, f"preferred_{name}")
    minimum = getattr(req, name)
    return max(preferred, minimum) if preferred is not None else minimum


# --- one request -----------------------------------------------------------------------------


def place(
    request: Request,
    nodes: list[NodeView] | tuple[NodeView, ...],
    policy: Policy,
    ctx: ScoreContext | None = None,
) -> Placement | Explanation:
    """Place one replica of ``request`` on the best node of ``nodes``, or explain why not.

    Ties go to the node with the smallest name, so a decision is reproducible.
    ``request.replicas > 1`` is placed as a gang: use ``place_gang`` to get all replicas.
    """
    if request.replicas > 1 or request.gang != GANG_NONE:
        gang = place_gang(request, nodes, policy, ctx)
        return gang.placements[0] if isinstance(gang, GangPlacement) else gang
    ctx = ctx or make_context(nodes, policy)
    invalid = _invalid(request)
    if invalid:
        return _explain(request, nodes, {}, policy, message=invalid, reasons={r.INVALID_REQUEST: 0})
    best = None
    feasible = []
    rejected: dict[str, str] = {}
    cache = ctx.evaluations
    if len(cache) > 200_000:
        cache.clear()
    request_key = _request_key(request)
    for node in nodes:
        cached = cache.get((request_key, id(node)))
        if cached is not None and cached[0] is node:
            result = cached[1]
        else:
            result = evaluate(request, node, ctx)
            cache[(request_key, id(node))] = (node, result)
        if isinstance(result, str):
            rejected[node.name] = result
            continue
        feasible.append((node, result))
        # Nodes that grant more preferred values win first, then the score, then the name.
        key = (-_degraded(request, result), result[0], _neg_name(node.name))
        if best is None or key > best[0]:
            best = (key, node, result)
    if not feasible:
        return _explain(request, nodes, rejected, policy)
    if "random" in policy.weights:
        _, node, result = ctx.rng.choice([(None, n, res) for n, res in feasible])
    else:
        _, node, result = best
    return _placement(request, node, result, policy)


def _request_key(req: Request) -> tuple:
    """A hashable identity of the request's content (its mappings become sorted tuples)."""
    return tuple(
        tuple(sorted(value.items())) if isinstance(value, Mapping) else value
        for value in (getattr(req, name) for name in _REQUEST_FIELDS)
    )


_REQUEST_FIELDS = tuple(f.name for f in fields(Request) if f.name != "name")


class _neg_name(str):
    """Orders names in reverse, so that max() over (score, _neg_name) prefers the smallest name."""

    __slots__ = ()

    def __lt__(self, other):
        return str.__gt__(self, other)

    def __gt__(self, other):
        return str.__lt__(self, other)


def _invalid(req: Request) -> str:
    if req.sharing not in ("exclusive", "mig", "timeslice", "mps"):
        return f"unknown sharing class {req.sharing!r}"
    if req.sharing == MIG and not req.mig_profile:
        return "a MIG request needs a profile such as 1g.10gb"
    if req.sharing == MIG and req.gpu_count > 1:
        return "a MIG request takes one slice; ask for replicas to get several"
    if req.gpu_count and not 0 < req.gpu_milli <= 1000:
        return "gpu_milli must be within 1..1000"
    if req.sharing == EXCLUSIVE and req.gpu_count and req.gpu_milli < 1000:
        return "exclusive GPUs cannot be fractional; use timeslice or mps"
    return ""


def _placement(req: Request, node: NodeView, result, policy: Policy) -> Placement:
    total, fit, breakdown, count, gpu_mem = result
    return Placement(
        node=node.name,
        request=req,
        cpu_millicores=fit.cpu,
        memory_mib=fit.memory,
        scratch_mib=fit.scratch,
        devices=fit.devices,
        grants=_grants(req, fit, count, gpu_mem),
        score=total,
        score_breakdown=breakdown,
        policy_version=policy.version,
        policy_name=policy.name,
        numa_node=fit.numa_node,
    )


# --- explanations ----------------------------------------------------------------------------


def _lacking(req: Request, node: NodeView, reason: str) -> dict[str, int] | None:
    """What a node rejected for capacity lacks; None when the rejection is not about capacity."""
    if reason == r.INSUFFICIENT_CPU:
        return {"cpu_millicores": req.cpu_millicores - node.free_cpu_millicores}
    if reason == r.INSUFFICIENT_MEMORY:
        return {"memory_mib": req.memory_mib - node.free_memory_mib}
    if reason == r.INSUFFICIENT_SCRATCH:
        return {"scratch_mib": req.scratch_mib - node.free_scratch_mib}
    if reason == r.GPU_MEMORY_TOO_SMALL:
        biggest = max((filters.usable_memory_mib(g, req) for g in node.gpus), default=0)
        return {"gpu_memory_mib": req.gpu_memory_mib - biggest}
    if reason == r.INSUFFICIENT_GPU and node.gpus:
        if req.gpu_milli >= 1000 or req.sharing == EXCLUSIVE:
            free = sum(1 for g in node.gpus if g.is_free)
            return {"gpus": max(req.gpu_count, 1) - free}
        best = max(g.free_milli for g in node.gpus)
        return {"gpu_milli": req.gpu_milli - best}
    return None


_SCALE = {
    "cpu_millicores": 1000,
    "memory_mib": 4 * _GIB,
    "scratch_mib": 16 * _GIB,
    "gpu_memory_mib": 4 * _GIB,
    "gpus": 1,
    "gpu_milli": 250,
}


def _describe(lacking: dict[str, int]) -> str:
    parts = []
    for dim, amount in lacking.items():
        if dim == "cpu_millicores":
            parts.append(f"{amount / 1000:g} fewer CPU cores")
        elif dim in ("memory_mib", "scratch_mib", "gpu_memory_mib"):
            label = {
                "memory_mib": "memory",
                "scratch_mib": "scratch",
                "gpu_memory_mib": "GPU memory",
            }
            parts.append(f"{math.ceil(amount / _GIB)} GiB less {label[dim]}")
        elif dim == "gpus":
            parts.append(f"{amount} fewer GPU{'s' if amount > 1 else ''}")
        else:
            parts.append(f"{amount} milli-GPU less")
    return " and ".join(parts)


# Rejections that ending leases can cure (they are about capacity in use, not about the node).
_WAITABLE = frozenset(
    {
        r.INSUFFICIENT_CPU,
        r.INSUFFICIENT_MEMORY,
        r.INSUFFICIENT_SCRATCH,
        r.INSUFFICIENT_GPU,
        r.TENANT_MIXING_REFUSED,
        r.NUMA_UNAVAILABLE,
        r.INTERCONNECT_UNAVAILABLE,
    }
)


def _without_leases(node: NodeView, leases) -> NodeView:
    """The node once ``leases`` have ended and given their capacity back."""
    freed_milli: dict[int, int] = {}
    freed_slots: dict[int, int] = {}
    for lease in leases:
        for index, milli in lease.gpu_milli:
            freed_milli[index] = freed_milli.get(index, 0) + milli
        for index, mask in lease.mig_slots:
            freed_slots[index] = freed_slots.get(index, 0) | mask
    gpus = []
    for g in node.gpus:
        if g.index in freed_slots:
            gpus.append(_without_mig_slots(g, freed_slots[g.index]))
            continue
        extra = freed_milli.get(g.index, 0)
        if not extra:
            gpus.append(g)
            continue
        free = min(1000, g.free_milli + extra)
        gpus.append(replace(g, free_milli=free, tenants=() if free >= 1000 else g.tenants))
    return replace(
        node,
        free_cpu_millicores=node.free_cpu_millicores + sum(x.cpu_millicores for x in leases),
        free_memory_mib=node.free_memory_mib + sum(x.memory_mib for x in leases),
        free_scratch_mib=node.free_scratch_mib + sum(x.scratch_mib for x in leases),
        gpus=tuple(gpus),
    )


def _without_mig_slots(gpu: GpuView, mask: int) -> GpuView:
    """A MIG device once the slices covering ``mask``'s memory slices are destroyed."""
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    kept = tuple(s for s in gpu.mig_slices if not occupied_slices((s,), profiles) & _bits(mask))
    carved = len(occupied_slices(kept, profiles))
    return replace(gpu, mig_slices=kept, free_milli=max(0, 1000 - 125 * carved))


def _bits(mask: int) -> set[int]:
    return {bit for bit in range(8) if mask >> bit & 1}


def fits_after_leases(req: Request, node: NodeView, ctx: ScoreContext):
    """(end time, leases) of the earliest set of this node's leases whose end makes room for
    ``req`` (leases end in order of ``ends_at``), or None when even all of them do not."""
    ordered = sorted(node.leases, key=lambda x: (x.ends_at, x.lease_id))
    for count in range(1, len(ordered) + 1):
        if count < len(ordered) and ordered[count].ends_at == ordered[count - 1].ends_at:
            continue  # leases ending at the same moment free their capacity together
        ended = ordered[:count]
        if isinstance(evaluate(req, _without_leases(node, ended), ctx), str):
            continue
        # Name only the leases that matter: drop earlier ones the request does not need.
        needed = list(ended)
        for lease in ended[:-1]:
            trial = [x for x in needed if x is not lease]
            if not isinstance(evaluate(req, _without_leases(node, trial), ctx), str):
                needed = trial
        return ended[-1].ends_at, tuple(needed)
    return None


def _when(moment) -> str:
    if hasattr(moment, "strftime"):
        offset = moment.utcoffset() if hasattr(moment, "utcoffset") else None
        suffix = " UTC" if offset is not None and not offset else ""
        return f"{moment:%Y-%m-%d %H:%M}{suffix}"
    return str(moment)


def _wait_text(needed: tuple[LeaseEnd, ...], moment, tenant: str) -> tuple[str, tuple[str, ...]]:
    """The wait and the lease ids it may name: only the requester's own. Another tenant's
    leases, and when each of them ends, are not its business; when capacity frees up is."""
    own = tuple(x.lease_id for x in needed if not x.tenant or x.tenant == tenant)
    when = _when(moment)
    if len(own) < len(needed):
        yours = ""
        if own:
            yours = f" (your lease{'s' if len(own) > 1 else ''} {', '.join(own)} among them)"
        return f"when capacity frees up at {when}{yours}", own
    if len(own) == 1:
        return f"when lease {own[0]} ends at {when}", own
    return f"when leases {', '.join(own)} have ended ({when})", own


def _earliest_wait(req, nodes, rejected, policy):
    """(end time, node, leases) for the node that frees room for ``req`` first, or None."""
    ctx = None
    best = None
    for node in nodes:
        if not node.leases or rejected.get(node.name) not in _WAITABLE:
            continue
        ctx = ctx or make_context(nodes, policy)
        found = fits_after_leases(req, node, ctx)
        if found and (best is None or found[0] < best[0]):
            best = (found[0], node, found[1])
    return best


def _explain(req, nodes, rejected, policy, message="", reasons=None) -> Explanation:
    counts = Counter(rejected.values()) if reasons is None else Counter(reasons)
    nearest = None
    for node in nodes:
        reason = rejected.get(node.name)
        if reason is None:
            continue
        lacking = _lacking(req, node, reason)
        if not lacking or min(lacking.values()) <= 0:
            continue
        distance = sum(v / _SCALE[k] for k, v in lacking.items())
        if nearest is None or distance < nearest[0]:
            nearest = (distance, node, reason, lacking)
    wait = _earliest_wait(req, nodes, rejected, policy) if rejected else None
    near = None
    if nearest:
        _, node, reason, lacking = nearest
        text = f"would fit on {node.name} with {_describe(lacking)}"
        near = NearMiss(node.name, reason, lacking, text)
    if wait:
        moment, wait_node, needed = wait
        waiting, lease_ids = _wait_text(needed, moment, req.tenant)
        if near is None:
            text = f"would fit on {wait_node.name} {waiting}"
            lacking = _lacking(req, wait_node, rejected[wait_node.name]) or {}
            near = NearMiss(wait_node.name, rejected[wait_node.name], lacking, text)
        elif wait_node.name == near.node:
            text = f"{near.message}, or {waiting}"
        else:
            text = f"{near.message}, or on {wait_node.name} {waiting}"
        near = replace(
            near, message=text, fits_at=moment, fits_on=wait_node.name, after_leases=lease_ids
        )
    if not message:
        summary = ", ".join(f"{n} {code}" for code, n in counts.most_common())
        message = f"0 of {len(nodes)} nodes: {summary}" if summary else f"0 of {len(nodes)} nodes"
        if near:
            message += f"; {near.message}"
    return Explanation(
        total_nodes=len(nodes),
        reasons=dict(counts.most_common()),
        nearest_miss=near,
        policy_version=policy.version,
        message=message,
    )


# --- gangs -----------------------------------------------------------------------------------


def place_gang(
    request: Request, nodes, policy: Policy, ctx: ScoreContext | None = None
) -> GangPlacement | Explanation:
    """Place all ``request.replicas`` replicas in one decision, or none (with the reason)."""
    nodes = list(nodes)
    topology = request.gang
    single = replace(request, replicas=1, gang=GANG_NONE)
    ctx = ctx or make_context(nodes, policy)
    if topology in (COLOCATE_ZONE, COLOCATE_RACK, COLOCATE_INTERCONNECT):
        attr = {COLOCATE_ZONE: "zone", COLOCATE_RACK: "rack", COLOCATE_INTERCONNECT: "name"}
        domains: dict[str, list[NodeView]] = {}
        for n in nodes:
            key = getattr(n, attr[topology])
            if key:
                domains.setdefault(key, []).append(n)
        if topology == COLOCATE_INTERCONNECT:
            single = replace(single, require_interconnect=True)
        best = None
        for domain in sorted(domains):
            members = domains[domain]
            if topology == COLOCATE_INTERCONNECT:
                attempt = _place_one_node_interconnect(single, request.replicas, members[0], ctx)
            else:
                attempt = _place_sequence(single, request.replicas, members, ctx, None)
            if isinstance(attempt, tuple):
                total = sum(p.score for p in attempt)
                if best is None or total > best[0]:
                    best = (total, domain, attempt)
        if best is None:
            return _gang_failure(single, nodes, policy, ctx, topology)
        return GangPlacement(best[2], topology, best[1], policy.version)
    attempt = _place_sequence(single, request.replicas, nodes, ctx, topology)
    if isinstance(attempt, Explanation):
        return _gang_failure(single, nodes, policy, ctx, topology, attempt)
    return GangPlacement(attempt, topology, "", policy.version)


def _place_sequence(req, replicas, nodes, ctx, topology):
    nodes = list(nodes)
    placed: list[Placement] = []
    peers: list[NodeView] = []
    for _ in range(replicas):
        candidates = nodes
        if topology == SPREAD_HOSTS:
            used = {p.node for p in placed}
            candidates = [n for n in nodes if n.name not in used]
        elif topology == SPREAD_ZONES:
            used_zones = {n.zone for n in peers}
            candidates = [n for n in nodes if n.zone not in used_zones]
        if not candidates:
            return _explain(req, nodes, {}, ctx.policy, message="no domain left")
        step_ctx = replace(ctx, peers=tuple(peers), active=(None, ()), evaluations={})
        result = place(req, candidates, ctx.policy, step_ctx)
        if isinstance(result, Explanation):
            return result
        placed.append(result)
        index = next(i for i, n in enumerate(nodes) if n.name == result.node)
        nodes[index] = apply_placement(nodes[index], result)
        peers.append(nodes[index])
    return tuple(placed)


def _place_one_node_interconnect(req, replicas, node, ctx):
    """All replicas on one node, their devices in a single interconnect group."""
    groups = sorted({g.interconnect_group for g in node.gpus if g.interconnect_group})
    for group in groups:
        restricted = replace(
            node, gpus=tuple(g for g in node.gpus if g.interconnect_group == group)
        )
        attempt = _place_sequence(req, replicas, [restricted], ctx, None)
        if isinstance(attempt, tuple):
            return attempt
    return None


def _gang_failure(req, nodes, policy, ctx, topology, inner: Explanation | None = None):
    single = place(req, nodes, policy, ctx)
    base = single if isinstance(single, Explanation) else inner
    message = f"{r.GANG_UNPLACEABLE}: {req.replicas} replicas cannot all be placed ({topology})"
    if base is not None and base.message:
        message += f"; {base.message}"
    return Explanation(
        total_nodes=len(nodes),
        reasons=dict(base.reasons) if base else {},
        nearest_miss=base.nearest_miss if base else None,
        policy_version=policy.version,
        message=message,
        gang_reason=r.GANG_UNPLACEABLE,
    )


# --- applying and releasing ------------------------------------------------------------------


def apply_placement(node: NodeView, placement: Placement, sign: int = 1) -> NodeView:
    """The node with the placement's capacity reserved (``sign=-1`` releases it)."""
    if placement.node != node.name:
        raise ValueError(f"placement is for {placement.node}, not {node.name}")
    req = placement.request
    by_index = {d.index: d for d in placement.devices}
    gpus = []
    for g in node.gpus:
        share = by_index.get(g.index)
        if share is None:
            gpus.append(g)
            continue
        if share.mig_profile:
            if sign > 0:
                slices = (*g.mig_slices, MigSlice(share.mig_profile, share.mig_start, req.tenant))
            else:
                slices = tuple(
                    s
                    for s in g.mig_slices
                    if not (s.profile == share.mig_profile and s.start == share.mig_start)
                )
            gpus.append(replace(g, mig_slices=slices, free_milli=g.free_milli - sign * share.milli))
            continue
        tenants = list(g.tenants)
        if share.milli < 1000:
            if sign > 0:
                tenants.append(req.tenant)
            elif req.tenant in tenants:
                tenants.remove(req.tenant)
        gpus.append(
            replace(g, free_milli=g.free_milli - sign * share.milli, tenants=tuple(tenants))
        )
    numa = node.numa
    if placement.numa_node is not None:
        numa = tuple(
            replace(
                n,
                free_cpu_millicores=n.free_cpu_millicores - sign * placement.cpu_millicores,
                free_memory_mib=n.free_memory_mib - sign * placement.memory_mib,
            )
            if n.id == placement.numa_node
            else n
            for n in node.numa
        )
    labels = set(node.workload_labels)
    own = set(req.labels) | ({gpu_class(req)} if req.gpu_count else set())
    tenants = set(node.tenants)
    if sign > 0:
        labels |= own
        tenants.add(req.tenant)
    return replace(
        node,
        free_cpu_millicores=node.free_cpu_millicores - sign * placement.cpu_millicores,
        free_memory_mib=node.free_memory_mib - sign * placement.memory_mib,
        free_scratch_mib=node.free_scratch_mib - sign * placement.scratch_mib,
        gpus=tuple(gpus),
        workload_labels=frozenset(labels),
        tenants=frozenset(tenants),
        numa=numa,
    )


def release(node: NodeView, placement: Placement) -> NodeView:
    """The node with the placement's capacity given back.

    Workload labels and tenants are kept: a snapshot does not know which other work carries
    them; the next snapshot from the database recomputes them.
    """
    return apply_placement(node, placement, sign=-1)


def apply_to_nodes(nodes, placement: Placement) -> list[NodeView]:
    """The node list with ``placement`` applied to its node."""
    return [apply_placement(n, placement) if n.name == placement.node else n for n in nodes]
