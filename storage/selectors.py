"""Reads of persistent volumes, over `Volume.objects.visible_to(actor)`: a tenant's people see
their tenants' volumes, operators all, a node's agent those on its node; others 404."""

from __future__ import annotations

from django.db.models import QuerySet, Sum

from nodes.choices import NodeState, Reachability
from pools.actors import Actor

from .choices import LIVE
from .models import Volume

# a node in one of these states (or unreachable) puts its volumes at risk: their data is on its
# disk alone (docs/storage.md "Persistent volumes")
AT_RISK_STATES = {
    NodeState.DRAINING: "node_draining",
    NodeState.QUARANTINED: "node_quarantined",
    NodeState.RETIRED: "node_retired",
}


def volumes_visible_to(actor: Actor) -> QuerySet:
    return Volume.objects.visible_to(actor).select_related("tenant", "pool", "node")


def at_risk(volume: Volume) -> str:
    """Why a live volume's data is at risk ("" = it is not): its node is draining,
    quarantined, retired or unreachable."""
    if volume.state not in LIVE:
        return ""
    node = volume.node
    if node.state in AT_RISK_STATES:
        return AT_RISK_STATES[node.state]
    if node.reachability == Reachability.UNREACHABLE:
        return "node_unreachable"
    return ""


def disk_held_by_node(node_ids=None) -> dict[int, int]:
    """node id → MiB its volumes hold on its disk ledger (live ones, and gone ones whose image
    the node has not yet confirmed removed)."""
    volumes = Volume.objects.filter(disk_released_at__isnull=True)
    if node_ids is not None:
        volumes = volumes.filter(node_id__in=node_ids)
    rows = volumes.values("node_id").annotate(size=Sum("size_mib"))
    return {row["node_id"]: row["size"] for row in rows}
