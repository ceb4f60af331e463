"""The planner: ``place`` one request (or a gang) on a snapshot, or explain why not.

Each node is evaluated (``evaluation``: the policy's filters, then devices and scores); nodes
that grant more preferred values win first, then the score, then the smallest name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from operator import attrgetter

from . import reasons as r
from .bookkeeping import apply_placement, with_zone_work
from .context import ScoreContext, make_context
from .evaluation import Evaluation, evaluate
from .explain import explain
from .plugins import data_locality
from .registry import random_scorer
from .types import (
    COLOCATE_INTERCONNECT,
    COLOCATE_RACK,
    COLOCATE_ZONE,
    EXCLUSIVE,
    GANG_NONE,
    MIG,
    SPREAD_HOSTS,
    SPREAD_ZONES,
    Explanation,
    GangPlacement,
    Grant,
    NodeView,
    Placement,
    Policy,
    Request,
)


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
    if request.zone_scoped:  # a node's fit depends on the work of its zone's other nodes
        nodes = with_zone_work(nodes)
    ctx = ctx or make_context(nodes, policy)
    invalid = _invalid(request)
    if invalid:
        return explain(request, nodes, {}, policy, message=invalid, reasons={r.INVALID_REQUEST: 0})
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
        key = (-_degraded(request, result), result.score, _neg_name(node.name))
        if best is None or key > best[0]:
            best = (key, node, result)
    if not feasible:
        return explain(request, nodes, rejected, policy)
    if random_scorer(policy):
        _, node, result = ctx.rng.choice([(None, n, res) for n, res in feasible])
    else:
        _, node, result = best
    return to_placement(request, node, result, policy, ctx)


def _request_key(req: Request) -> tuple:
    """A hashable identity of the request's content (its mappings become sorted tuples)."""
    return tuple(
        tuple(sorted(value.items())) if isinstance(value, Mapping) else value
        for value in (getattr(req, name) for name in _REQUEST_FIELDS)
    )


_REQUEST_FIELDS = tuple(f.name for f in fields(Request) if f.name != "name")
_EVALUATED_FIELDS = tuple(n for n in _REQUEST_FIELDS if n not in ("labels", "tenant"))
_evaluated = attrgetter(*_EVALUATED_FIELDS)
_MAPPINGS = tuple(
    i for i, f in enumerate(_EVALUATED_FIELDS) if f in ("affinity", "preferred_affinity")
)


def evaluation_key(req: Request, policy: Policy) -> tuple:
    """Requests with equal keys evaluate alike on every node (``evaluate``): the request key
    without the request's own labels (they only mark the node it lands on) and, unless it asks
    for a non-isolated share of a GPU where tenants may not mix, without its tenant (which only
    the tenant-mixing rule of shared devices reads)."""
    values = list(_evaluated(req))
    for i in _MAPPINGS:
        values[i] = tuple(sorted(values[i].items()))
    shares = req.sharing not in (EXCLUSIVE, MIG) and req.gpu_milli < 1000 and req.wants_gpu
    values.append(req.tenant if shares and not policy.allow_tenant_mixing else "")
    return tuple(values)


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


def to_placement(
    req: Request, node: NodeView, result: Evaluation, policy: Policy, ctx=None
) -> Placement:
    """The placement of ``req`` on ``node`` from its ``evaluate`` result; with the pass's
    context, what its data (image, inputs) costs there (``data_locality.estimate``)."""
    fit = result.fit
    data = {}
    if ctx is not None and (req.image or req.inputs):
        avoided, moved, seconds = data_locality.estimate(req, node, ctx.data_sizes)
        data = {
            "data_avoided_bytes": avoided,
            "data_moved_bytes": moved,
            "data_arrival_s": round(seconds, 3),
        }
    return Placement(
        node=node.name,
        request=req,
        cpu_millicores=fit.cpu,
        memory_mib=fit.memory,
        scratch_mib=fit.scratch,
        devices=fit.devices,
        grants=_grants(req, fit, result.gpu_count, result.gpu_memory_mib),
        score=result.score,
        score_breakdown=result.breakdown,
        policy_version=policy.version,
        policy_name=policy.name,
        numa_node=fit.numa_node,
        **data,
    )


def _degraded(req: Request, result: Evaluation) -> int:
    """How many preferred dimensions the evaluated fit had to degrade to the minimum."""
    fit = result.fit
    missed = 0
    for preferred, granted in (
        (req.preferred_cpu_millicores, fit.cpu),
        (req.preferred_memory_mib, fit.memory),
        (req.preferred_scratch_mib, fit.scratch),
        (req.preferred_gpu_count, result.gpu_count),
        (req.preferred_gpu_memory_mib, result.gpu_memory_mib),
    ):
        if preferred is not None and granted < preferred:
            missed += 1
    return missed


def _grants(req: Request, fit, count: int, gpu_mem: int) -> dict[str, Grant]:
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


# --- gangs ---------------------------------------------------------------------------------------


def place_gang(
    request: Request, nodes, policy: Policy, ctx: ScoreContext | None = None
) -> GangPlacement | Explanation:
    """Place all ``request.replicas`` replicas in one decision, or none (with the reason)."""
    nodes = with_zone_work(nodes) if request.zone_scoped else list(nodes)
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
            return _gang_failure(single, request.replicas, nodes, policy, ctx, topology)
        return GangPlacement(best[2], topology, best[1], policy.version)
    attempt = _place_sequence(single, request.replicas, nodes, ctx, topology)
    if isinstance(attempt, Explanation):
        return _gang_failure(single, request.replicas, nodes, policy, ctx, topology, attempt)
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
            return explain(req, nodes, {}, ctx.policy, message="no domain left")
        if req.zone_scoped:  # the replicas placed so far count in their zones
            allowed = {n.name for n in candidates}
            candidates = [n for n in with_zone_work(nodes) if n.name in allowed]
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


def _gang_failure(req, replicas, nodes, policy, ctx, topology, inner: Explanation | None = None):
    single = place(req, nodes, policy, ctx)
    base = single if isinstance(single, Explanation) else inner
    message = f"{r.GANG_UNPLACEABLE}: {replicas} replicas cannot all be placed ({topology})"
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
