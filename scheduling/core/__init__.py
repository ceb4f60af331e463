"""The scheduler core: pure placement logic over a snapshot (no Django, no ORM).

Build a snapshot, call ``place``, apply the result::

    from scheduling.core import NodeView, GpuView, Request, Policy, place, apply_placement
    from scheduling.core import DEFAULT_POLICY, Placement, Explanation

    nodes = [NodeView.from_dict(row) for row in rows]     # or NodeView(name=..., ...)
    result = place(Request(cpu_millicores=4000, gpu_count=1), nodes, DEFAULT_POLICY)
    if isinstance(result, Placement):                     # an Explanation is falsy
        nodes = apply_to_nodes(nodes, result)             # reserve it in the snapshot
    else:
        print(result.message)   # "0 of 42 nodes: 30 gpu_memory_too_small, 12 ..."

API (all types are frozen dataclasses in ``types``):

* ``place(request, nodes, policy, ctx=None) -> Placement | Explanation`` — one replica.
  Filters reject nodes with reason codes (``reasons``); scorers rank the rest with the policy's
  weights; ties go to the smallest node name. Preferred values are granted where they fit
  (``Placement.grants``), and nodes that grant more preferences win first.
* ``place_gang(request, nodes, policy, ctx=None) -> GangPlacement | Explanation`` — all
  ``request.replicas`` replicas or none, by ``request.gang`` topology.
* ``apply_placement(node, placement) -> NodeView``, ``release(node, placement) -> NodeView``,
  ``apply_to_nodes(nodes, placement) -> list[NodeView]`` — capacity bookkeeping.
* ``make_context(nodes, policy, peers=(), rng=None) -> ScoreContext`` — build once per pass and
  pass to ``place`` when placing many requests on the same snapshot.
* ``evaluate(request, node, ctx) -> tuple | str`` — one node's best fit or rejection reason.
* ``Policy(name, version, weights, gpu_choice, allow_tenant_mixing, integer_scores, truncated,
  workload, seed)``; ``DEFAULT_POLICY``; ``PAPER_POLICIES``; ``policy_for(name)``.

Modules: ``types`` (snapshot and decisions), ``reasons`` (reason-code catalogue), ``filters``,
``scorers``, ``fragmentation`` (the FGD measure), ``mig`` (MIG profiles and placements),
``planner``, ``policies``, ``replay`` (the OpenB trace replay used by ``replay_trace``).
"""

from .planner import (
    apply_placement,
    apply_to_nodes,
    evaluate,
    make_context,
    place,
    place_gang,
    release,
)
from .policies import DEFAULT_POLICY, PAPER_POLICIES, policy_for
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
    "PAPER_POLICIES",
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
    "evaluate",
    "make_context",
    "place",
    "place_gang",
    "policy_for",
    "release",
]
