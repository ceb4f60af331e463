"""A cancelled job's capacity is not placed again until its container has stopped: its lease is
`stopping` (holding: ledger, snapshot, the pass's free capacity) until the node's agent confirms
the stop, its heartbeat no longer lists the lease, or the lost-node rules end it. Before, the
lease was released at the cancel and the next job landed during the stop grace."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_pool, build_tenant, submit_job
from jobs.assignments import node_assignments
from jobs.choices import JobState
from jobs.lifecycle import job_report
from jobs.services import job_cancel
from leases import services
from leases.choices import HOLDING, LeaseState
from leases.selectors import ledger_problems
from leases.snapshot import pool_snapshot
from nodes.services import node_heartbeat, node_mark_unreachable
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from scheduling.passes import scheduling_pass

S = LeaseState


@pytest.fixture
def world(db):
    """One node that fits exactly one job, a tenant, and a first job running on the node."""
    pool = build_pool("stop", exact_capacity=True)
    node = build_node(pool, "n1", cpu=1000, memory=1024)
    tenant = build_tenant("stopper", name="Stopper")
    first = submit_job(pool, tenant, "first", cpu=1000, memory=1024)
    assert scheduling_pass(pool_id=pool.pk).placed == [first.pk]
    lease = first.leases.get()
    for step in ("pulling", "starting", "running"):
        report(first, node, lease, step)
    return pool, node, tenant, first, lease


def report(job, node, lease, step, **fields):
    return job_report(
        job=job,
        node=node,
        fencing_token=lease.fencing_token,
        step=step,
        actor=Actor.for_node(node),
        **fields,
    )


def heartbeat(node, *leases):
    workloads = [{"lease": lease.pk, "job": lease.job_id, "state": "running"} for lease in leases]
    return node_heartbeat(node=node, actor=Actor.for_node(node), workloads=workloads)


def free_cpu(pool, node) -> int:
    """The node's free CPU as the scheduling pass sees it (its snapshot)."""
    return pool_snapshot(pool.pk).node(node.name).free_cpu_millicores


def test_the_capacity_of_a_cancelled_running_job_is_held_until_the_agent_confirms_the_stop(world):
    pool, node, tenant, first, lease = world
    job_cancel(job=first, actor=SYSTEM)
    lease.refresh_from_db()
    assert lease.state == S.STOPPING and lease.state in HOLDING
    assert lease.events.last().reason == Reason.STOP_REQUESTED
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 1000 and free_cpu(pool, node) == 0
    assert ledger_problems(pool) == []
    # the node is told to stop it: the lease listed as stopping, without the job's secrets
    (listed,) = node_assignments(node=node)
    assert (listed["lease"], listed["state"], listed["secrets"]) == (lease.pk, "stopping", {})

    second = submit_job(pool, tenant, "second", cpu=1000, memory=1024)
    outcome = scheduling_pass(pool_id=pool.pk)
    assert outcome.placed == [] and second.pk in outcome.pending  # not during the stop grace
    heartbeat(node, lease)  # the agent still lists it: still stopping
    lease.refresh_from_db()
    assert lease.state == S.STOPPING

    report(first, node, lease, "stopped")
    lease.refresh_from_db()
    assert lease.state == S.RELEASED and lease.events.last().reason == Reason.STOP_CONFIRMED
    assert lease.final_report_at is not None  # its callbacks end here (lease_ended)
    first.refresh_from_db()
    assert first.state == JobState.CANCELLED  # the stop changes nothing of the job
    assert free_cpu(pool, node) == 1000 and ledger_problems(pool) == []
    assert scheduling_pass(pool_id=pool.pk).placed == [second.pk]


def test_a_job_cancelled_before_it_started_frees_its_capacity_at_once(db):
    """Reserved: the agent creates a container only once `starting` committed the lease."""
    pool = build_pool("stop", exact_capacity=True)
    node = build_node(pool, "n1", cpu=1000, memory=1024)
    tenant = build_tenant("stopper", name="Stopper")
    job = submit_job(pool, tenant, cpu=1000, memory=1024)
    assert scheduling_pass(pool_id=pool.pk).placed == [job.pk]
    job_cancel(job=job, actor=SYSTEM)
    assert job.leases.get().state == S.RELEASED
    assert free_cpu(pool, node) == 1000


def test_reports_under_a_stopping_lease(world):
    """An earlier step (the agent had not seen the cancel) changes nothing, so the agent goes
    on to stop it; an end of the run confirms the stop; `stopped` of a live job is refused."""
    pool, node, tenant, first, lease = world
    job_cancel(job=first, actor=SYSTEM)
    assert report(first, node, lease, "running").state == JobState.CANCELLED
    lease.refresh_from_db()
    assert lease.state == S.STOPPING
    report(first, node, lease, "failed", reason="exited_nonzero", exit_code=143)
    lease.refresh_from_db()
    assert lease.state == S.RELEASED and lease.events.last().reason == Reason.STOP_CONFIRMED

    other = submit_job(pool, tenant, "other", cpu=1000, memory=1024)
    scheduling_pass(pool_id=pool.pk)
    live = other.leases.get()
    report(other, node, live, "starting")
    with pytest.raises(TransitionRefused) as refused:
        report(other, node, live, "stopped")
    assert refused.value.code == "transition_not_allowed"


def test_nobody_but_the_stop_releases_a_stopping_lease(world):
    _, _, _, first, lease = world
    job_cancel(job=first, actor=SYSTEM)
    with pytest.raises(TransitionRefused):
        services.lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    assert services.expire_leases(now=timezone.now() + timedelta(days=1)) == 0
    lease.refresh_from_db()
    assert lease.state == S.STOPPING


def test_a_heartbeat_that_no_longer_lists_it_ends_it(world):
    """The agent lists every run it has until it ends: one not listed has nothing running."""
    pool, node, _, first, lease = world
    job_cancel(job=first, actor=SYSTEM)
    heartbeat(node)
    lease.refresh_from_db()
    assert lease.state == S.RELEASED and lease.events.last().reason == Reason.RECONCILED_GONE
    assert free_cpu(pool, node) == 1000


def test_a_silent_node_follows_the_lost_node_rules(world):
    """Its node silent, nobody can confirm the stop: the capacity stays held; the node's
    return settles it (still there: stopping, else released), else the uncertain deadline."""
    pool, node, _, first, lease = world
    job_cancel(job=first, actor=SYSTEM)
    now = timezone.now()
    assert node_mark_unreachable(node=node, cutoff=now + timedelta(seconds=1), actor=SYSTEM)
    lease.refresh_from_db()
    assert lease.state == S.STOPPING and lease.uncertain_since is not None
    assert lease.events.last().reason == Reason.NODE_SILENT
    assert services.expire_uncertain(now=now + timedelta(minutes=5), deadline=600) == 0
    heartbeat(node, lease)  # back, still running it: its agent will stop it
    lease.refresh_from_db()
    assert lease.state == S.STOPPING and lease.uncertain_since is None

    node.refresh_from_db()
    assert node_mark_unreachable(
        node=node, cutoff=timezone.now() + timedelta(seconds=1), actor=SYSTEM
    )
    later = timezone.now() + timedelta(minutes=11)
    assert services.expire_uncertain(now=later, deadline=600) == 1
    lease.refresh_from_db()
    assert lease.state == S.EXPIRED and lease.events.last().reason == Reason.UNCERTAIN_DEADLINE
    node.refresh_from_db()  # (an unreachable node is left out of the pass's snapshot)
    assert node.cpu_millicores_reserved == 0 and ledger_problems(pool) == []


def test_a_silent_node_back_without_it_releases_it(world):
    _, node, _, first, lease = world
    job_cancel(job=first, actor=SYSTEM)
    assert node_mark_unreachable(
        node=node, cutoff=timezone.now() + timedelta(seconds=1), actor=SYSTEM
    )
    heartbeat(node)
    lease.refresh_from_db()
    assert lease.state == S.RELEASED and lease.events.last().reason == Reason.RECONCILED_GONE
