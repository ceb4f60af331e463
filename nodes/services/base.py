"""What every node service shares: the condition event and the state precondition."""

from pools.actors import Actor
from pools.statemachine import TransitionRefused

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
