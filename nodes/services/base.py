"""What every node service shares: the condition event and the per-node sweep loop."""

from django.db import transaction

from pools.actors import Actor
from pools.statemachine import TransitionRefused, record_sweep_failure

from ..models import Node, NodeEvent


def node_event(node: Node, *, actor: Actor, reason: str, message: str = "", now=None, data=None):
    """An event that does not change the lifecycle state (condition, device, capacity …)."""
    return NodeEvent.record(
        node,
        actor=actor,
        from_state=node.state,
        to_state=node.state,
        reason=reason,
        message=message,
        at=now,
        data=data,
    )


def must_be(state: str, code: str):
    """A precondition checked under the row lock: the node must be in `state`."""

    def check(obj):
        if obj.state != state:
            raise TransitionRefused(code, f"node {obj} is not {state}")

    return check


def each_node(nodes, step, *, actor: Actor, now) -> dict:
    """{node id: step(node)} for each node, each in its own transaction. A node whose step
    raises is rolled back, left out, and the error recorded on it (`sweep_failed`, once per
    distinct error) and logged; the sweep goes on with the next node."""
    results = {}
    for node in nodes:
        try:
            with transaction.atomic():
                results[node.pk] = step(node)
        except Exception as error:
            record_sweep_failure(
                Node, node.pk, event_model=NodeEvent, actor=actor, error=error, now=now
            )
    return results
