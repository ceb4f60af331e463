"""Preemption: which running work to stop so that a higher-priority request fits. Pure.

`choose_victims` looks, node by node, at the running work that may be preempted for the request
(strictly lower priority, a preemptible class, checkpointable, running at least the minimum
runtime) and at the set whose capacity, once given back, lets the request fit there — tested with
the core's own `evaluate` on the node with the victims' leases ended. Victims are taken lowest
priority first and least lost work first until the request fits, then any the request does not
need are spared. Among nodes the cheapest set wins: the lowest highest victim priority, then the
least lost work, then the fewest victims, then the node name. Lost work is the time since the
victim last checkpointed (or started) times the share of its node it holds, so the work that
checkpointed most recently is stopped first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .context import ScoreContext, make_context
from .evaluation import evaluate
from .explain import without_leases
from .types import LeaseEnd, NodeView, Policy, Request

# Work younger than this is never preempted: the core's default, which the pool knob
# `preemption_min_runtime_s` (pools/knobs.py) takes; the caller passes the pool's value.
DEFAULT_MIN_RUNTIME_S = 300


@dataclass(frozen=True)
class Candidate:
    """Running work that might be preempted. Times are seconds on the caller's clock (`now`)."""

    job: int
    node: str
    lease: LeaseEnd  # what it holds on its node, as the snapshot sees it
    priority: int
    preemptible: bool  # its priority class lets it be preempted
    checkpointable: bool
    started_at: float
    checkpointed_at: float | None = None
    tenant: str = ""


@dataclass(frozen=True)
class Preemption:
    """The node to free room on and the work to stop there."""

    node: str
    victims: tuple[Candidate, ...]
    lost_work: float  # node-share-seconds: each victim's seconds since its checkpoint × share

    @property
    def cost(self) -> tuple:
        top = max(v.priority for v in self.victims)
        return (top, round(self.lost_work, 6), len(self.victims), self.node)


def eligible(c: Candidate, req: Request, now: float, min_runtime_s: float) -> bool:
    """May `c` be stopped for `req`: lower priority, its class allows it, it can checkpoint,
    and it has run long enough not to be churned."""
    return (
        c.priority < req.priority
        and c.preemptible
        and c.checkpointable
        and now - c.started_at >= min_runtime_s
    )


def node_share(lease: LeaseEnd, node: NodeView) -> float:
    """The largest fraction of any of the node's resources the lease holds (its dominant
    share): CPU, memory, or GPUs (a MIG slice counts its memory slices out of 8)."""
    shares = [0.0]
    if node.cpu_millicores:
        shares.append(lease.cpu_millicores / node.cpu_millicores)
    if node.memory_mib:
        shares.append(lease.memory_mib / node.memory_mib)
    if node.gpus:
        milli = sum(m for _, m in lease.gpu_milli)
        milli += sum(125 * bin(mask).count("1") for _, mask in lease.mig_slots)
        shares.append(milli / (1000 * len(node.gpus)))
    return max(shares)


def lost_seconds(c: Candidate, now: float) -> float:
    """How long it has run since it last checkpointed (or started): what stopping it loses."""
    return max(0.0, now - max(c.started_at, c.checkpointed_at or c.started_at))


def lost_work(c: Candidate, node: NodeView, now: float) -> float:
    return lost_seconds(c, now) * node_share(c.lease, node)


def free_leases(nodes, lease_ids) -> list[NodeView]:
    """The nodes once the leases `lease_ids` have ended and given their capacity back."""
    ending = {str(x) for x in lease_ids}
    result = []
    for node in nodes:
        ended = [x for x in node.leases if x.lease_id in ending]
        if ended:
            node = without_leases(node, ended)
            node = replace(node, leases=tuple(x for x in node.leases if x not in ended))
        result.append(node)
    return result


def choose_victims(
    req: Request,
    nodes,
    candidates,
    policy: Policy,
    *,
    now: float,
    min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
    ctx: ScoreContext | None = None,
) -> Preemption | None:
    """The cheapest victims whose end lets `req` fit on one node, or None when no eligible set
    makes room anywhere. Only sets of at least one victim: the caller places `req` first.
    A gang (replicas > 1) is not preempted for."""
    if req.replicas > 1:
        return None
    by_node: dict[str, list[Candidate]] = {}
    for c in candidates:
        if eligible(c, req, now, min_runtime_s):
            by_node.setdefault(c.node, []).append(c)
    best = None
    for node in sorted(nodes, key=lambda n: n.name):
        if node.name not in by_node:
            continue
        ctx = ctx or make_context(nodes, policy)
        found = _victims_on(req, node, by_node[node.name], ctx, now)
        if found is not None and (best is None or found.cost < best.cost):
            best = found
    return best


def _victims_on(req, node, pool, ctx, now) -> Preemption | None:
    work = {c.job: lost_work(c, node, now) for c in pool}
    order = sorted(pool, key=lambda c: (c.priority, work[c.job], c.job))

    def fits(victims) -> bool:
        freed = without_leases(node, [v.lease for v in victims])
        return not isinstance(evaluate(req, freed, ctx), str)

    if not fits(order):
        return None  # even all of them gone would not make room here
    taken = next(order[:k] for k in range(1, len(order) + 1) if fits(order[:k]))
    for c in reversed(taken):  # spare the costliest first, where the request does not need it
        if len(taken) > 1 and fits([v for v in taken if v is not c]):
            taken = [v for v in taken if v is not c]
    victims = tuple(sorted(taken, key=lambda c: c.job))
    return Preemption(node.name, victims, sum(work[v.job] for v in victims))
