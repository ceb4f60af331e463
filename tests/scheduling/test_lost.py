"""A running job whose node goes silent for good: its lease turns uncertain, then expires at
the deadline, and the stranded-jobs sweep marks the job `lost` (node_lost) — or, when its retry
policy retries node_lost, puts it back in the queue after the backoff, never beyond
max_attempts."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import submit_job
from jobs.choices import JobState
from jobs.lifecycle import job_report
from leases.choices import LeaseState
from leases.services import expire_uncertain
from nodes.services import node_heartbeat, node_heartbeat_sweep
from pools.actors import Actor
from pools.reasons import Reason
from scheduling.passes import requeue_jobs_without_lease, scheduling_pass

RETRY_LOST = {"max_attempts": 2, "backoff_s": 30, "retry_on": ["node_lost"]}


def run_on_node(agent, job, now):
    """Placed by the pass, started and running as the agent reports it."""
    assert job.pk in scheduling_pass(pool_id=job.pool_id, now=now).placed
    lease = job.leases.get(state=LeaseState.RESERVED)
    actor = Actor.for_node(agent.node)
    for step in ("starting", "running"):
        job_report(
            job=job,
            node=agent.node,
            fencing_token=lease.fencing_token,
            step=step,
            actor=actor,
            now=now,
        )
    return lease


def silence(agent, now):
    """The node stops heartbeating: unreachable, its leases uncertain, then expired."""
    later = now + timedelta(hours=1)
    assert agent.node.pk in node_heartbeat_sweep(now=later)
    assert expire_uncertain(now=later + timedelta(minutes=10), deadline=timedelta(minutes=5))
    return later + timedelta(minutes=10)


@pytest.fixture
def start():
    return timezone.now()


def test_job_of_a_silent_node_is_lost(agent, tenant, start):
    job = submit_job(agent.node.pool, tenant)  # default policy: one attempt
    lease = run_on_node(agent, job, start)
    # while the lease is only uncertain, the job is left alone: the node may come back
    node_heartbeat_sweep(now=start + timedelta(hours=1))
    assert requeue_jobs_without_lease(now=start + timedelta(hours=1)) == []
    later = start + timedelta(hours=1, minutes=10)
    assert expire_uncertain(now=later, deadline=timedelta(minutes=5))

    assert requeue_jobs_without_lease(now=later) == [job.pk]

    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.state == JobState.LOST and lease.state == LeaseState.EXPIRED
    event = job.events.latest("id")
    assert (event.from_state, event.reason) == ("running", Reason.NODE_LOST)
    assert requeue_jobs_without_lease(now=later) == []  # nothing twice


def test_lost_job_is_retried_after_backoff_but_not_beyond_max_attempts(
    agent, enroll, tenant, start
):
    job = submit_job(agent.node.pool, tenant, retry_policy=RETRY_LOST)
    run_on_node(agent, job, start)
    later = silence(agent, start)

    assert requeue_jobs_without_lease(now=later) == [job.pk]

    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.not_before == later + timedelta(seconds=30)
    event = job.events.latest("id")
    assert event.reason == Reason.RETRY_SCHEDULED and event.data["failure"] == "node_lost"
    # the second attempt runs on another node, which goes silent too
    second = enroll(agent.node.pool)
    node_heartbeat(node=second.node, actor=Actor.for_node(second.node), now=later)
    assert job.pk not in scheduling_pass(pool_id=job.pool_id, now=later).placed  # backoff
    retry_at = later + timedelta(seconds=31)
    run_on_node(second, job, retry_at)
    job.refresh_from_db()
    assert job.attempts == 2 and job.state == JobState.RUNNING
    end = silence(second, retry_at)

    assert requeue_jobs_without_lease(now=end) == [job.pk]

    job.refresh_from_db()
    assert job.state == JobState.LOST
    assert job.events.latest("id").reason == Reason.NODE_LOST
