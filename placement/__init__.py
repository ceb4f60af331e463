"""The scheduler core: pure placement logic over a snapshot (no Django, no ORM, no numpy).

Build a snapshot, call ``place``, apply the result::

    from placement import NodeView, GpuView, Request, Policy, place, apply_to_nodes
    from placement import DEFAULT_POLICY, Placement, Explanation

    nodes = [NodeView.from_dict(row) for row in rows]     # or NodeView(name=..., ...)
    result = place(Request(cpu_millicores=4000, gpu_count=1), nodes, DEFAULT_POLICY)
    if isinstance(result, Placement):                     # an Explanation is falsy
        nodes = apply_to_nodes(nodes, result)             # reserve it in the snapshot
    else:
        print(result.message)   # "0 of 42 nodes: 30 gpu_memory_too_small, 12 ..."

API (all snapshot and decision types are frozen dataclasses in ``types``):

* ``place(request, nodes, policy, ctx=None) -> Placement | Explanation`` — one replica.
  The policy's filters reject nodes with reason codes (``reasons``); its scorers rank the rest
  with its weights; ties go to the smallest node name. Preferred values are granted where they
  fit (``Placement.grants``), and nodes that grant more preferences win first.
* ``place_gang(request, nodes, policy, ctx=None) -> GangPlacement | Explanation`` — all
  ``request.replicas`` replicas or none, by ``request.gang`` topology.
* ``batch.plan(requests, nodes, policy, ctx=None, admit=None) -> (outcomes, nodes)`` — many
  requests in order on one snapshot, with ``place``'s decisions, each with a decision record
  (the scheduling pass).
* ``apply_placement(node, placement) -> NodeView``, ``release(node, placement) -> NodeView``,
  ``apply_to_nodes(nodes, placement) -> list[NodeView]`` — capacity bookkeeping.
* ``make_context(nodes, policy, peers=(), rng=None) -> ScoreContext`` — build once per pass and
  pass to ``place`` when placing many requests on the same snapshot.
* ``evaluate(request, node, ctx) -> tuple | str`` — one node's best fit or rejection reason.
* ``Policy(name, version, weights, filters, gpu_choice, allow_tenant_mixing, integer_scores,
  truncated, workload, seed)``; ``DEFAULT_POLICY``; ``policy_from(weights, filters=None,
  **fields)`` builds a policy from edited values and refuses unknown names;
  ``policy_problems(weights, filters)`` says what is wrong with them, by field.
* ``FILTERS``, ``SCORERS``: the plugin registry (``registry``), filled by ``plugins``.

Modules: ``types`` (snapshot and decisions), ``reasons`` (reason-code catalogue), ``registry``
and ``plugins/`` (filters and scorers), ``policy`` (the default policy), ``context`` (fit and
pass context), ``devices`` (device eligibility), ``evaluation`` (one request on one node),
``planner`` (place, gangs), ``explain`` (why not, nearest miss, wait), ``bookkeeping``
(apply/release), ``fragmentation`` (the FGD measure), ``mig`` (MIG profiles and placements).
The trace replay and the FGD paper's policies are ``scheduling.replay``'s.
"""

from . import batch, plugins
from .bookkeeping import apply_placement, apply_to_nodes, release
from .context import make_context
from .evaluation import evaluate
from .planner import place, place_gang
from .policy import DEFAULT_POLICY, policy_from, policy_problems
from .registry import FILTERS, SCORERS
from .types import (
    DeviceShare,
    Explanation,
    GangPlacement,
    GpuView,
    Grant,
    MigSlice,
    NearMiss,
    NodeView,
    NumaView,
    Placement,
    Policy,
    Request,
)

__all__ = [
    "DEFAULT_POLICY",
    "FILTERS",
    "SCORERS",
    "DeviceShare",
    "Explanation",
    "GangPlacement",
    "GpuView",
    "Grant",
    "MigSlice",
    "NearMiss",
    "NodeView",
    "NumaView",
    "Placement",
    "Policy",
    "Request",
    "apply_placement",
    "apply_to_nodes",
    "batch",
    "evaluate",
    "make_context",
    "place",
    "place_gang",
    "plugins",
    "policy_from",
    "policy_problems",
    "release",
]
