"""Every transition of every state machine, allowed and refused, through the real services."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import build_node, submit_job
from jobs.choices import JOB_TRANSITIONS, JobState
from jobs.models import Job, JobEvent
from jobs.services import job_transition
from leases.choices import LEASE_TRANSITIONS, LeaseState
from leases.models import Lease, LeaseEvent
from leases.services import lease_transition
from nodes.choices import NODE_TRANSITIONS, NodeState
from nodes.models import Node, NodeEvent
from nodes.services import node_transition, nodes_register_ready
from pools.reasons import Reason
from pools.statemachine import TransitionRefused, create_many


def _node(pool, system, state):
    node = build_node(pool, "n", cpu=1000, memory=1024, ready=False, actor=system)
    Node.objects.filter(pk=node.pk).update(state=state)  # a fixture in that state
    return node


def _job(pool, tenant, system, state):
    job = submit_job(pool, tenant, "j", cpu=100, memory=64, actor=system)
    Job.objects.filter(pk=job.pk).update(state=state)
    return job


def _lease(pool, tenant, system, state):
    node = _node(pool, system, NodeState.READY)
    return Lease.objects.create(
        pool=pool,
        tenant=tenant,
        node=node,
        state=state,
        cpu_millicores=0,
        memory_mib=0,
        expires_at=timezone.now() + timedelta(minutes=5),
    )


MACHINES = {
    "node": (
        NodeState,
        NODE_TRANSITIONS,
        NodeEvent,
        "node",
        lambda obj, to, actor: node_transition(
            node=obj, to=to, actor=actor, reason=Reason.OPERATOR_ACTION
        ),
    ),
    "job": (
        JobState,
        JOB_TRANSITIONS,
        JobEvent,
        "job",
        lambda obj, to, actor: job_transition(job=obj, to=to, actor=actor, reason=Reason.REQUEUED),
    ),
    "lease": (
        LeaseState,
        LEASE_TRANSITIONS,
        LeaseEvent,
        "lease",
        lambda obj, to, actor: lease_transition(
            lease=obj, to=to, actor=actor, reason=Reason.RELEASED_BY_CLIENT
        ),
    ),
}
CASES = [
    pytest.param(machine, frm, to, to in allowed[frm], id=f"{machine}:{frm}->{to}")
    for machine, (states, allowed, *_rest) in MACHINES.items()
    for frm in states.values
    for to in states.values
    if frm != to
]


@pytest.mark.parametrize(("machine", "frm", "to", "allowed"), CASES)
def test_transition(machine, frm, to, allowed, pool, tenant, system):
    _, _, event_model, subject, change = MACHINES[machine]
    make = {
        "node": lambda: _node(pool, system, frm),
        "job": lambda: _job(pool, tenant, system, frm),
        "lease": lambda: _lease(pool, tenant, system, frm),
    }[machine]
    obj = make()
    events_before = event_model.objects.filter(**{subject: obj}).count()
    if allowed:
        changed = change(obj, to, system)
        assert changed.state == to
        event = event_model.objects.filter(**{subject: obj}).latest("id")
        assert (event.from_state, event.to_state) == (frm, to)
        assert event.actor_label == "system:builders" and event.reason and event.at
    else:
        with pytest.raises(TransitionRefused) as refused:
            change(obj, to, system)
        assert refused.value.code == "transition_not_allowed"
        obj.refresh_from_db()
        assert obj.state == frm  # nothing half-changed
        assert event_model.objects.filter(**{subject: obj}).count() == events_before


def test_terminal_states_have_no_way_out():
    from jobs.choices import TERMINAL as JOB_TERMINAL
    from leases.choices import TERMINAL as LEASE_TERMINAL
    from nodes.choices import TERMINAL as NODE_TERMINAL

    for terminal, allowed in (
        (JOB_TERMINAL, JOB_TRANSITIONS),
        (NODE_TERMINAL, NODE_TRANSITIONS),
        (LEASE_TERMINAL, LEASE_TRANSITIONS),
    ):
        assert all(not allowed[state] for state in terminal)


def test_unknown_reason_code_is_refused_and_rolls_back(pool, system):
    node = _node(pool, system, NodeState.REGISTERED)
    with pytest.raises(ValueError, match="unknown reason code"):
        node_transition(node=node, to=NodeState.VERIFIED, actor=system, reason="because")
    node.refresh_from_db()
    assert node.state == NodeState.REGISTERED


def test_rows_created_in_bulk_walk_the_map_and_get_an_event_per_step(pool, system):
    """`create_many` (the bulk builders of the benchmark): the rows end in the path's last state,
    each step is an event with its reason; a path the map forbids writes nothing."""
    fleet = [{"name": f"n{i}", "cpu_millicores": 1000, "memory_mib": 1024} for i in range(2)]
    nodes = nodes_register_ready(pool=pool, specs=fleet, actor=system)
    assert {node.state for node in Node.objects.filter(pool=pool)} == {NodeState.READY}
    assert list(nodes[1].events.order_by("id").values_list("from_state", "to_state", "reason")) == [
        ("", NodeState.REGISTERED, Reason.ENROLLED),
        (NodeState.REGISTERED, NodeState.VERIFIED, Reason.AGENT_AUTHENTICATED),
        (NodeState.VERIFIED, NodeState.READY, Reason.OPERATOR_ACTION),
    ]

    skipping = [
        (NodeState.REGISTERED, Reason.ENROLLED, ""),
        (NodeState.READY, Reason.OPERATOR_ACTION, ""),
    ]
    with pytest.raises(TransitionRefused) as refused:
        create_many(
            [Node(pool=pool, name="skips-verification")],
            path=skipping,
            allowed=NODE_TRANSITIONS,
            event_model=NodeEvent,
            actor=system,
            now=timezone.now(),
        )
    assert refused.value.code == "transition_not_allowed"
    assert "cannot go from registered to ready" in refused.value.message
    assert not Node.objects.filter(name="skips-verification").exists()
