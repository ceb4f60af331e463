"""A node's own drain states: draining (no new placements), cancelled, drained. What happens
to the work on a draining node (the deadline, checkpoints, its leases) is the control loop's:
scheduling/drain.py."""

from django.utils import timezone

from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from ..choices import NodeState
from ..models import Node
from .base import must_be, node_event
from .lifecycle import node_transition


def node_drain(*, node: Node, actor: Actor, deadline=None, message: str = "", now=None) -> Node:
    """No new placements from now; running work continues until it ends or `deadline`."""
    now = now or timezone.now()
    if deadline is not None and deadline <= now:
        raise TransitionRefused("deadline_in_past", "A drain deadline must be in the future.")
    text = message or (f"drain until {deadline:%Y-%m-%d %H:%M:%S %Z}" if deadline else "drain")
    return node_transition(
        node=node,
        to=NodeState.DRAINING,
        actor=actor,
        reason=Reason.DRAIN_REQUESTED,
        message=text,
        now=now,
        data={"deadline": deadline.isoformat() if deadline else None},
        changes={"drain_deadline": deadline, "drain_enforced_at": None, "drained_at": None},
    )


def node_drain_cancel(*, node: Node, actor: Actor, message: str = "", now=None) -> Node:
    return node_transition(
        node=node,
        to=NodeState.READY,
        actor=actor,
        reason=Reason.DRAIN_CANCELLED,
        message=message or "drain cancelled",
        now=now,
        check=must_be(NodeState.DRAINING, "not_draining"),
        changes={"drain_deadline": None, "drain_enforced_at": None, "drained_at": None},
    )


def node_mark_drained(*, node: Node, actor: Actor, now=None) -> bool:
    """Record, once, that a draining node has no work left. The caller has checked that it
    holds no lease (the ledger is a layer above); guarded: False if not draining or already
    recorded."""
    now = now or timezone.now()
    changed = Node.objects.filter(
        pk=node.pk, state=NodeState.DRAINING, drained_at__isnull=True
    ).update(drained_at=now)
    if changed:
        node.refresh_from_db()
        node_event(
            node,
            actor=actor,
            reason=Reason.DRAIN_COMPLETED,
            message="no work left on the node; it can be retired or made ready",
            now=now,
        )
    return bool(changed)
