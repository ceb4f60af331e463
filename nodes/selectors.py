"""Reads of nodes, already filtered to what the actor may see (operators: every node)."""

from django.db.models import OuterRef, Subquery

from .models import ControlPlane, EnrollmentToken, Node, NodeEvent


def control_plane_id() -> str:
    """This control plane's UUID (the row is made on the first read where none exists)."""
    plane, _ = ControlPlane.objects.get_or_create(pk=ControlPlane.SINGLETON)
    return str(plane.uuid)


def nodes_visible_to(actor):
    return (
        Node.objects.visible_to(actor)
        .select_related("pool")
        .prefetch_related("gpus")
        .order_by("pool__slug", "name")
    )


def nodes_with_latest_event(actor):
    """Nodes with the reason and message of their latest event: why a node is where it is."""
    latest = NodeEvent.objects.filter(node=OuterRef("pk")).order_by("-at", "-id")
    return nodes_visible_to(actor).annotate(
        latest_reason=Subquery(latest.values("reason")[:1]),
        latest_message=Subquery(latest.values("message")[:1]),
        latest_at=Subquery(latest.values("at")[:1]),
    )


def enrollment_tokens_visible_to(actor):
    return (
        EnrollmentToken.objects.visible_to(actor)
        .select_related("pool")
        .order_by("-created_at", "-id")
    )
