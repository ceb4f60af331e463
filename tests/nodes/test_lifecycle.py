"""The node state machine and the operator actions (nodes/services/lifecycle.py, drain.py)."""

from datetime import timedelta

import pytest

from config.builders import SYSTEM
from nodes import services
from nodes.choices import NODE_TRANSITIONS, NodeState
from nodes.models import NodeCredential, NodeEvent
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from .conftest import last_event

S = NodeState


def drive_to(enrolled, state):
    """Bring a freshly enrolled (registered) node to `state` through services."""
    node = enrolled.node
    if state == S.REGISTERED:
        return node
    if state == S.RETIRED:
        return services.node_retire(node=node, actor=SYSTEM)
    if state == S.QUARANTINED:
        return services.node_quarantine(node=node, actor=SYSTEM, message="test")
    node = services.node_verify(node=node, actor=SYSTEM)
    if state == S.VERIFIED:
        return node
    node = services.node_mark_ready(node=node, actor=SYSTEM)
    if state == S.DRAINING:
        node = services.node_drain(node=node, actor=SYSTEM)
    return node


ALL_PAIRS = [(a, b) for a in S.values for b in S.values]


@pytest.mark.parametrize(("source", "target"), ALL_PAIRS)
def test_every_transition_allowed_or_refused_with_event(enroll, private_pool, source, target):
    node = drive_to(enroll(private_pool), source)
    before = NodeEvent.objects.filter(node=node).count()
    if target in NODE_TRANSITIONS[source]:
        node = services.node_transition(
            node=node, to=target, actor=SYSTEM, reason=Reason.OPERATOR_ACTION, message="t"
        )
        assert node.state == target
        event = last_event(node)
        assert (event.from_state, event.to_state, event.reason) == (
            source,
            target,
            Reason.OPERATOR_ACTION,
        )
        assert event.actor_label == SYSTEM.label
        assert NodeEvent.objects.filter(node=node).count() == before + 1
    else:
        with pytest.raises(TransitionRefused):
            services.node_transition(
                node=node, to=target, actor=SYSTEM, reason=Reason.OPERATOR_ACTION
            )
        node.refresh_from_db()
        assert node.state == source
        assert NodeEvent.objects.filter(node=node).count() == before


def test_operator_actions_and_their_refusals(ready_node, operator, now):
    actor = Actor.for_user(operator)
    node = ready_node.node
    with pytest.raises(TransitionRefused, match="future"):
        services.node_drain(node=node, actor=actor, deadline=now - timedelta(seconds=1))
    with pytest.raises(TransitionRefused):  # ready → ready is not a transition
        services.node_drain_cancel(node=node, actor=actor)
    with pytest.raises(TransitionRefused):
        services.node_release(node=node, actor=actor)

    node = services.node_drain(node=node, actor=actor, deadline=now + timedelta(hours=1))
    assert node.drain_deadline == now + timedelta(hours=1)
    assert last_event(node).reason == Reason.DRAIN_REQUESTED
    assert last_event(node).actor_label == "user:olga"
    node = services.node_drain_cancel(node=node, actor=actor)
    assert (node.state, node.drain_deadline) == (S.READY, None)
    assert last_event(node).reason == Reason.DRAIN_CANCELLED

    node = services.node_quarantine(node=node, actor=actor, message="flaky NIC")
    assert last_event(node).message == "flaky NIC"
    node = services.node_release(node=node, actor=actor)
    assert node.state == S.READY
    assert last_event(node).reason == Reason.QUARANTINE_RELEASED

    node = services.node_retire(node=node, actor=actor)
    assert node.state == S.RETIRED
    assert not NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exists()
    for step in (services.node_quarantine, services.node_release, services.node_drain):
        with pytest.raises(TransitionRefused):
            step(node=node, actor=actor, message="x")
