"""Capacity bookkeeping on a snapshot: take a placement's capacity from its node, or give it
back."""

from __future__ import annotations

from dataclasses import fields

from .types import MigSlice, NodeView, Placement, Request

_FIELDS: dict[type, tuple[str, ...]] = {}


def _evolve(view, **changes):
    """``dataclasses.replace`` for the snapshot's frozen views, without re-running ``__init__``
    (a batch pass evolves tens of thousands of them; replace's field checks were ~0.2 s of a
    pass). Only for changes that need no ``__post_init__``: every free value given is final."""
    cls = type(view)
    names = _FIELDS.get(cls) or _FIELDS.setdefault(cls, tuple(f.name for f in fields(cls)))
    new = object.__new__(cls)
    for name in names:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(view, name))
    return new


def gpu_class(req: Request) -> str:
    """The workload label a GPU request leaves on its node (read by the GPU-clustering scorer)."""
    if not req.gpu_count:
        return ""
    return "gpu-class=share" if req.gpu_milli < 1000 else f"gpu-class={req.gpu_count}"


def emptied(node: NodeView) -> NodeView:
    """The node with no work on it: every resource free, no tenants, labels or MIG slices.
    Its NUMA nodes stay as they are (a view does not know their totals)."""
    gpus = tuple(_evolve(g, free_milli=1000, tenants=(), mig_slices=()) for g in node.gpus)
    return _evolve(
        node,
        free_cpu_millicores=node.cpu_millicores,
        free_memory_mib=node.memory_mib,
        free_scratch_mib=node.scratch_mib,
        gpus=gpus,
        tenants=frozenset(),
        workload_labels=frozenset(),
        zone_workload_labels=frozenset(),
        leases=(),
    )


def with_zone_work(nodes) -> list[NodeView]:
    """The nodes, each with the workload labels of every node of its zone in ``nodes`` added to
    its ``zone_workload_labels`` (what zone-scoped anti-affinity reads): a placement changes one
    node, and this is how its zone hears of it. A node without a zone is left as it is (its own
    work is what counts there), and so is one that already knew every label (the same object)."""
    nodes = list(nodes)
    by_zone: dict[str, set[str]] = {}
    for node in nodes:
        if node.zone:
            by_zone.setdefault(node.zone, set()).update(node.workload_labels)
    out = []
    for node in nodes:
        labels = by_zone.get(node.zone) if node.zone else None
        if labels and not labels <= node.zone_workload_labels:
            node = _evolve(node, zone_workload_labels=node.zone_workload_labels | labels)
        out.append(node)
    return out


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
            gpus.append(_evolve(g, mig_slices=slices, free_milli=g.free_milli - sign * share.milli))
            continue
        tenants = list(g.tenants)
        if share.milli < 1000:
            if sign > 0:
                tenants.append(req.tenant)
            elif req.tenant in tenants:
                tenants.remove(req.tenant)
        gpus.append(
            _evolve(g, free_milli=g.free_milli - sign * share.milli, tenants=tuple(tenants))
        )
    numa = node.numa
    if placement.numa_node is not None:
        numa = tuple(
            _evolve(
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
    return _evolve(
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
