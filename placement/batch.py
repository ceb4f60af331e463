"""Batch planning: many requests placed one after another on ONE snapshot, making the decisions
``place`` would make one by one, without evaluating every node for every request.

``plan(requests, nodes, policy)`` walks the requests in order. Requests with the same
``evaluation_key`` form a class that keeps, per node, its last evaluation (a reason or a fit),
the counts of rejections per reason, and a heap of the feasible nodes in ``place``'s order
(fewest degraded preferences, highest score, smallest name). Each placement changes one node,
which is appended to a log; when a request of a class comes up, the class re-evaluates only the
nodes logged since it last looked, except those refused for good (by a static filter, which
reads only what placing work does not change, or for a reason a plugin or the core declares
``never_lifted``: ``stays_rejected``), and
drops stale heap entries lazily. A plan of M requests in K classes on N nodes costs about
K·N + M·K evaluations instead of M·N.

Nodes that differ only in what no filter or scorer reads (``node_kind_of``: the fields the plugins
declare they read, ``registry``, and the core's own; not the name or device UUIDs) are of one
*kind*, and a class evaluates a kind
once: a fresh fleet of thousands of nodes has a few hundred kinds, and placing work often turns
a node into a kind already seen. The evaluation is the same function of the request and the
kind; only the device UUIDs of the chosen node are its own (``_on``). A class whose plugins read
node names (pinned to a node, or scored against a gang's peers) evaluates node by node.

Deliberate differences from calling ``place`` one by one, both tested:
- a class that fits nowhere keeps the explanation of its first failure (per tenant when the
  nodes list lease ends) for the rest of the plan: counts and nearest miss may be a few
  placements old, never the decision;
- a policy that draws random numbers (the ``random`` scorer, ``gpu_choice="random"``), a gang,
  an invalid request or one whose anti-affinity is scoped to zones is planned by ``place``
  itself on the same, updated snapshot. (A zone-scoped request's fit on one node depends on
  the work of the other nodes of its zone, which no node kind or change log of one node
  captures; ``place`` completes each node's zone labels from the whole snapshot, at the cost
  of evaluating every node for each such request.)

Every placement comes with a bounded decision record (``Outcome.decision``): policy version,
how many nodes each filter reason rejected, the top candidates with their score breakdown,
the chosen node.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import NamedTuple

from . import plugins  # noqa: F401  (registered before the plugins' declarations are read)
from .bookkeeping import apply_placement
from .context import ScoreContext, make_context
from .evaluation import CORE_NEVER_LIFTED, CORE_READS, Evaluation, evaluate
from .explain import explain
from .planner import _degraded, _invalid, evaluation_key, place, to_placement
from .registry import active_filters, all_reads, draws_random, never_lifted, reads_for
from .types import GANG_NONE, Explanation, GpuView, NodeView, Placement, Policy, Request

TOP_CANDIDATES = 3  # candidates kept in a decision record
_new = tuple.__new__  # a NamedTuple without its Python-level __new__: a fifth of the cost

# A node's name is its own: a class whose plugins read it (a pin to a node, the peers' spread
# scorer) evaluates node by node.
PER_NODE = frozenset({"name"})
_GPU_KIND = attrgetter(*(f.name for f in fields(GpuView) if f.name not in ("uuid", "mig_slices")))
_NODE_FIELDS = frozenset(f.name for f in fields(NodeView))


def stays_rejected() -> frozenset[str]:
    """Rejections that placing more work on the node never lifts, as the plugins and the core
    declare them (``never_lifted``): a node refused for one is not re-evaluated
    (tests/placement/test_batch.py checks the claim)."""
    return never_lifted() | CORE_NEVER_LIFTED


def node_kind_of() -> Callable[[NodeView], tuple]:
    """The node as evaluation sees it, from what the registered plugins and the core declare
    they read, but the name: nodes with equal kinds evaluate alike for any request whose
    plugins do not read names (a property test holds this). Labels and devices enter as
    hashable tuples, devices without their UUIDs (copied into the placement, ``_on``) and MIG
    slices without their tenants (bookkeeping)."""
    read = ((all_reads() | CORE_READS) & _NODE_FIELDS) - PER_NODE
    scalars = attrgetter(*sorted(read - {"labels", "gpus"}))

    def kind(node: NodeView) -> tuple:
        return (
            scalars(node),
            tuple(sorted(node.labels.items())) if "labels" in read else (),
            tuple(
                (_GPU_KIND(g), tuple((s.profile, s.start) for s in g.mig_slices)) for g in node.gpus
            ),
        )

    return kind


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the plan decided for one request: a placement (with its decision record), an
    explanation, a refusal by ``admit`` (e.g. over quota), or the error planning it raised."""

    placement: Placement | None = None
    decision: dict | None = None
    explanation: Explanation | None = None
    refusal: str = ""
    error: Exception | None = None


class Candidate(NamedTuple):
    """A feasible node in a class's heap, in ``place``'s order; stale once the node changed."""

    degraded: int  # preferred dimensions degraded to the minimum
    neg_score: float
    name: str
    index: int
    version: int


class _Class:
    """The evaluations of one class of requests against every node of the plan."""

    __slots__ = (
        "by_kind",
        "counts",
        "ctx",
        "cursor",
        "explanations",
        "heap",
        "kinds",
        "reasons",
        "req",
        "results",
        "settled",
    )

    def __init__(self, req: Request, ctx: ScoreContext, n: int, cursor: int):
        # The class evaluates with its first request and a context of its own, whose caches of
        # the filters and scorers that apply to that request then always hit.
        self.req = req
        self.ctx = replace(ctx, filters=(None, (), (), ()), active=(None, ()), evaluations={})
        # node kind → its evaluation (a result, or _Refused); not for a class that reads names
        self.by_kind = not reads_for(req, self.ctx) & PER_NODE
        self.kinds: dict[int, object] = {}
        self.results: list[Evaluation | None] = [None] * n  # a feasible node's evaluation
        self.reasons: list[str | None] = [None] * n  # the rejection reason, None when feasible
        # 1: refused for good (a static filter or stays_rejected): never re-evaluated
        self.settled = bytearray(n)
        self.counts: Counter = Counter()  # rejections per reason
        self.heap: list[Candidate] = []
        self.cursor = cursor  # position in the change log this class has seen
        self.explanations: dict[str, Explanation] = {}  # tenant → first failure's explanation


class Planner:
    """The state of one plan: the snapshot as placements change it, and the classes."""

    def __init__(self, nodes: Sequence[NodeView], policy: Policy, ctx: ScoreContext | None):
        self.nodes = list(nodes)
        self.policy = policy
        self.ctx = ctx or make_context(self.nodes, policy)
        self.random = draws_random(policy)  # planned by ``place`` itself
        # what the plugins registered now declare: read once per plan
        self.stays_rejected = stays_rejected()
        self.node_kind = node_kind_of()
        self.version = [0] * len(self.nodes)
        self.log: list[int] = []  # indices of changed nodes, in order
        self.index = {node.name: i for i, node in enumerate(self.nodes)}
        self.classes: dict[tuple, _Class] = {}
        self.keys: dict[int, tuple] = {}  # id(request) → (request, its evaluation key)
        self.kind_ids: dict[tuple, int] = {}  # node kind → a small number naming it
        self.kind = [self._kind_id(node) for node in self.nodes]
        # an explanation names the requester's own leases: shared per tenant only when it may
        self.own_leases = any(node.leases for node in self.nodes)

    # --- one request ---------------------------------------------------------------------------

    def place(self, req: Request, admit=None, position: int = 0) -> Outcome:
        if (
            req.replicas > 1
            or req.gang != GANG_NONE
            or _invalid(req)
            or self.random
            or req.zone_scoped
        ):
            result = place(req, self.nodes, self.policy, self.ctx)
            if isinstance(result, Explanation):
                return Outcome(explanation=result)
            return self._take(result, None, admit, position)
        cls = self._class(req)
        best = self._best(cls)
        if best is None:
            who = req.tenant if self.own_leases else ""
            explanation = cls.explanations.get(who)
            if explanation is None:
                rejected = {n.name: cls.reasons[i] for i, n in enumerate(self.nodes)}
                explanation = explain(req, self.nodes, rejected, self.policy)
                cls.explanations[who] = explanation
            return Outcome(explanation=explanation)
        top = self._top(cls, TOP_CANDIDATES)
        i = top[0].index
        placement = to_placement(
            req, self.nodes[i], _on(self.nodes[i], cls.results[i]), self.policy, self.ctx
        )
        decision = {
            "policy_version": self.policy.version,
            "nodes": len(self.nodes),
            "rejected": dict(cls.counts.most_common()),
            "candidates": [
                {
                    "node": entry.name,
                    "score": cls.results[entry.index].score,
                    "breakdown": dict(cls.results[entry.index].breakdown),
                }
                for entry in top
            ],
            "chosen": placement.node,
        }
        return self._take(placement, decision, admit, position)

    def _take(self, placement: Placement, decision, admit, position) -> Outcome:
        refusal = admit(position, placement) if admit is not None else ""
        if refusal:
            return Outcome(refusal=refusal)
        i = self.index[placement.node]
        self.nodes[i] = apply_placement(self.nodes[i], placement)
        self.kind[i] = self._kind_id(self.nodes[i])
        self.version[i] += 1
        self.log.append(i)
        return Outcome(placement=placement, decision=decision)

    def _kind_id(self, node: NodeView) -> int:
        # a kind is hashed once, here; the classes look their evaluations up by its number
        return self.kind_ids.setdefault(self.node_kind(node), len(self.kind_ids))

    # --- classes -------------------------------------------------------------------------------

    def _class(self, req: Request) -> _Class:
        cached = self.keys.get(id(req))
        if cached is None or cached[0] is not req:
            cached = self.keys[id(req)] = (req, evaluation_key(req, self.policy))
        key = cached[1]
        cls = self.classes.get(key)
        if cls is None:
            cls = _Class(req, self.ctx, len(self.nodes), len(self.log))
            static, _, _ = active_filters(req, cls.ctx)
            for i in range(len(self.nodes)):
                self._evaluate(cls, i, static=static)
            heapq.heapify(cls.heap)
            self.classes[key] = cls  # only once complete: an error above leaves no half class
        elif cls.cursor < len(self.log):
            for i in set(self.log[cls.cursor :]):
                if not cls.settled[i]:
                    self._evaluate(cls, i)
            cls.cursor = len(self.log)
        return cls

    def _evaluate(self, cls: _Class, i: int, static=None) -> None:
        """Node i's evaluation for the class: its kind's when the class has seen the kind.
        `static`: the class's static filters, when the node is evaluated the first time."""
        kind = self.kind[i]
        result = cls.kinds.get(kind) if cls.by_kind else None
        if result is None:
            result = self._evaluation(cls, self.nodes[i], static)
            if cls.by_kind:
                cls.kinds[kind] = result
        if static is None and cls.reasons[i] is not None:
            cls.counts[cls.reasons[i]] -= 1
            if not cls.counts[cls.reasons[i]]:
                del cls.counts[cls.reasons[i]]
        if result.__class__ is _Refused:
            cls.reasons[i], cls.results[i] = result.reason, None
            cls.counts[result.reason] += 1
            cls.settled[i] = result.for_good
            return
        cls.reasons[i], cls.results[i] = None, result
        entry = _new(
            Candidate,
            (_degraded(cls.req, result), -result.score, self.nodes[i].name, i, self.version[i]),
        )
        if static is None:
            heapq.heappush(cls.heap, entry)
        else:
            cls.heap.append(entry)  # heapified once the class is complete

    def _evaluation(self, cls: _Class, node: NodeView, static):
        if static is not None:
            for check in static:
                if reason := check(cls.req, node, self.policy):
                    return _Refused(reason, 1)
        result = evaluate(cls.req, node, cls.ctx, static_checked=True)
        if isinstance(result, str):
            return _Refused(result, 1 if result in self.stays_rejected else 0)
        return result

    def _valid(self, entry: Candidate) -> bool:
        return entry.version == self.version[entry.index]

    def _best(self, cls: _Class):
        heap = cls.heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _top(self, cls: _Class, count: int) -> list:
        """The best ``count`` valid entries (popped, then pushed back)."""
        taken = []
        while cls.heap and len(taken) < count:
            entry = heapq.heappop(cls.heap)
            if self._valid(entry):
                taken.append(entry)
        for entry in taken:
            heapq.heappush(cls.heap, entry)
        return taken


@dataclass(frozen=True, slots=True)
class _Refused:
    reason: str
    for_good: int  # 1: a static filter or stays_rejected refused it; never re-evaluated


def _on(node: NodeView, result: Evaluation) -> Evaluation:
    """An evaluation of the node's kind with the node's own device UUIDs."""
    fit = result.fit
    uuids = {g.index: g.uuid for g in node.gpus}
    if all(d.uuid == uuids[d.index] for d in fit.devices):
        return result
    devices = tuple(replace(d, uuid=uuids[d.index]) for d in fit.devices)
    return result._replace(fit=replace(fit, devices=devices))


def plan(
    requests: Sequence[Request],
    nodes: Sequence[NodeView],
    policy: Policy,
    ctx: ScoreContext | None = None,
    admit: Callable[[int, Placement], str] | None = None,
    waited: Callable[[int, Explanation], None] | None = None,
) -> tuple[list[Outcome], list[NodeView]]:
    """Place ``requests`` in order on ``nodes`` (each placement taken before the next request is
    placed); returns one Outcome per request and the nodes as the placements left them.

    ``admit(position, placement)`` may refuse a placement with a reason (a tenant's quota): it
    is then not taken. ``waited(position, explanation)`` hears of each request that fits
    nowhere now, before the next is placed (the queue's gate reserves for it). An error planning
    one request is that request's outcome; the others go on.
    """
    planner = Planner(nodes, policy, ctx)
    outcomes = []
    for position, req in enumerate(requests):
        try:
            outcome = planner.place(req, admit, position)
            if outcome.explanation is not None and waited is not None:
                waited(position, outcome.explanation)
        except Exception as error:  # one bad request never stops the plan
            outcome = Outcome(error=error)
        outcomes.append(outcome)
    return outcomes, planner.nodes
