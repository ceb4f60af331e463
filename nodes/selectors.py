from django.db.models import OuterRef, Subquery

from .models import EnrollmentToken, Node, NodeEvent


def nodes_with_latest_event():
    """Nodes with the reason and message of their latest event: why a node is where it is."""
    latest = NodeEvent.objects.filter(node=OuterRef("pk")).order_by("-at", "-id")
    return (
        Node.objects.select_related("pool")
        .prefetch_related("gpus")
        .annotate(
            latest_reason=Subquery(latest.values("reason")[:1]),
            latest_message=Subquery(latest.values("message")[:1]),
            latest_at=Subquery(latest.values("at")[:1]),
        )
        .order_by("pool__slug", "name")
    )


def nodes_for_operators():
    return (
        Node.objects.select_related("pool").prefetch_related("gpus").order_by("pool__slug", "name")
    )


def enrollment_tokens():
    return EnrollmentToken.objects.order_by("-created_at", "-id")
