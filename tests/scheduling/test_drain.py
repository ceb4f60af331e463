"""Drain enforcement on a node's work (scheduling/drain.py): at the deadline jobs checkpoint,
re-queue or fail per the pool's policy; the agent's checkpoint ends the lease there."""

from datetime import timedelta

import pytest

from config.builders import SYSTEM
from jobs.choices import JobState
from leases.choices import LeaseState
from nodes import services
from nodes.errors import NodeScopeRefused
from nodes.models import NodeEvent
from pools.actors import Actor
from pools.reasons import Reason
from pools.services import policy_version_publish
from pools.statemachine import TransitionRefused
from scheduling import drain
from tests.nodes.conftest import last_event


def test_drain_deadline_checkpoints_requeues_and_fails_per_policy(ready_node, make_job, now):
    node = ready_node.node
    ckpt, ckpt_lease = make_job(node, checkpointable=True)
    plain, plain_lease = make_job(node)
    early, early_lease = make_job(node, state=JobState.LEASED)
    node = services.node_drain(
        node=node, actor=SYSTEM, deadline=now + timedelta(minutes=5), now=now
    )
    assert drain.node_drain_sweep(now=now + timedelta(minutes=4)) == {
        "enforced": [],
        "completed": [],
    }
    result = drain.node_drain_sweep(now=now + timedelta(minutes=5))
    assert result["enforced"] == [node.pk]
    for job in (ckpt, plain, early):
        job.refresh_from_db()
    assert ckpt.state == JobState.CHECKPOINTING
    assert plain.state == JobState.FAILED
    assert early.state == JobState.QUEUED
    for job in (ckpt, plain, early):
        assert job.events.last().reason == Reason.DRAIN_DEADLINE
    plain_lease.refresh_from_db()
    early_lease.refresh_from_db()
    assert plain_lease.state == early_lease.state == LeaseState.RELEASED
    event = NodeEvent.objects.filter(node=node, reason=Reason.DRAIN_DEADLINE).get()
    assert event.data["checkpointing"] == [ckpt.pk] and event.data["policy"] == "fail"
    # enforced once only
    drain.node_drain_sweep(now=now + timedelta(minutes=6))
    assert NodeEvent.objects.filter(node=node, reason=Reason.DRAIN_DEADLINE).count() == 1
    # the agent reports the checkpoint: re-queued, lease released, drain complete
    agent = Actor.for_node(node)
    later = now + timedelta(minutes=6)
    stale = ckpt_lease.fencing_token - 1  # a stale attempt on the node cannot re-queue it
    with pytest.raises(TransitionRefused):
        drain.agent_job_checkpointed(node=node, job=ckpt, actor=agent, fencing_token=stale)
    ckpt = drain.agent_job_checkpointed(
        node=node, job=ckpt, actor=agent, fencing_token=ckpt_lease.fencing_token, now=later
    )
    assert ckpt.state == JobState.QUEUED
    assert ckpt.events.last().reason == Reason.CHECKPOINT_DONE
    result = drain.node_drain_sweep(now=now + timedelta(minutes=7))
    assert result["completed"] == [node.pk]
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 0 and node.drained_at is not None
    assert last_event(node).reason == Reason.DRAIN_COMPLETED


def test_drain_policy_wait_leaves_non_checkpointable_work_running(ready_node, make_job, now):
    node = ready_node.node
    policy_version_publish(
        policy=node.pool.scheduling_policy,
        weights={"bin_pack": 1.0},
        knobs={"drain_noncheckpointable": "wait"},
        comment="let it run",
        actor=SYSTEM,
    )
    job, _ = make_job(node)
    services.node_drain(node=node, actor=SYSTEM, deadline=now + timedelta(minutes=1), now=now)
    outcome = drain.node_drain_enforce(node=node, actor=SYSTEM, now=now + timedelta(minutes=1))
    assert outcome["left_running"] == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert drain.node_drain_complete(node=node, actor=SYSTEM) is False


def test_agent_cannot_checkpoint_a_job_placed_elsewhere(ready_node, enroll, private_pool, make_job):
    other = enroll(private_pool).node
    job, _ = make_job(other, checkpointable=True)
    with pytest.raises(NodeScopeRefused):
        drain.agent_job_checkpointed(
            node=ready_node.node, job=job, actor=Actor.for_node(ready_node.node), fencing_token=1
        )
