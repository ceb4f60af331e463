"""Backfilled jobs are reclaimed before their reservation's window opens, each with
`backfill_window_closed`: checkpointed and re-queued, re-queued before start, or stopped (and
re-queued when their retry policy says so). The reservation's owner is never charged for them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_node, cpu_request, submit_job
from jobs.choices import JobState
from jobs.models import Job
from leases.choices import LeaseState
from leases.models import Lease
from leases.selectors import ledger_problems
from leases.services import Window, lease_commit, lease_release, lease_renew, lease_reserve
from leases.services.backfill import reclaim_lead
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from scheduling.backfill import reclaim_backfills
from scheduling.passes import scheduling_pass
from tests.clients import client_for

HOUR = timedelta(hours=1)


@pytest.fixture
def held(pool, other_tenant):
    """Another tenant's reservation of the whole node, its window an hour ahead."""
    node = build_node(pool, "only", cpu=4000, memory=8192)
    start = timezone.now() + HOUR
    request = cpu_request(node.cpu_millicores_allocatable, 4096) | {"scratch_mib": 4096}
    return lease_reserve(
        pool=pool,
        tenant=other_tenant,
        request=request,
        actor=SYSTEM,
        duration=1,
        window=Window(start, start + HOUR),
    )


def backfilled(pool, tenant, **fields) -> tuple[Job, Lease]:
    job = submit_job(pool, tenant, max_runtime_s=1800, **fields)
    assert scheduling_pass().placed == [job.pk], Job.objects.get(pk=job.pk).pending_reason
    lease = Lease.objects.get(job=job)
    assert lease.backfill_of_id is not None
    return job, lease


def report(job, lease, step, **body):
    body = {"step": step, "fencing_token": str(lease.fencing_token), **body}
    answer = client_for(node=lease.node).post(
        f"/api/v1/agent/jobs/{job.pk}/report", body, format="json"
    )
    assert answer.status_code == 200, answer.json()


def run(job, lease):
    for step in ("pulling", "starting", "running"):
        report(job, lease, step)


def reclaim_time(held):
    return held.window_start - reclaim_lead(held.pool) + timedelta(seconds=1)


def test_nothing_is_reclaimed_before_the_lead(pool, tenant, held):
    job, lease = backfilled(pool, tenant, checkpointable=True)
    run(job, lease)
    early = held.window_start - reclaim_lead(pool) - timedelta(seconds=1)
    assert reclaim_backfills(now=early) == []
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_checkpointable_backfill_checkpoints_and_goes_back_to_the_queue(pool, tenant, held):
    job, lease = backfilled(pool, tenant, checkpointable=True)
    run(job, lease)
    assert reclaim_backfills(now=reclaim_time(held)) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.CHECKPOINTING
    asked = job.events.last()
    assert asked.reason == Reason.BACKFILL_WINDOW_CLOSED and str(held.pk) in asked.message
    # the agent sees the request, checkpoints and reports: re-queued, its lease released
    [entry] = client_for(node=lease.node).get("/api/v1/agent/assignments").json()
    assert entry["checkpoint_requested"] is True
    report(job, lease, "checkpointed")
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.state == JobState.QUEUED and lease.state == LeaseState.RELEASED
    assert ledger_problems(pool) == []


def test_a_backfill_not_started_yet_is_requeued_and_its_lease_released(pool, tenant, held):
    job, lease = backfilled(pool, tenant)
    assert reclaim_backfills(now=reclaim_time(held)) == [job.pk]
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.state == JobState.QUEUED and lease.state == LeaseState.RELEASED
    assert job.events.last().reason == Reason.BACKFILL_WINDOW_CLOSED
    assert lease.events.last().reason == Reason.BACKFILL_WINDOW_CLOSED


@pytest.mark.parametrize(
    ("retry_on", "ends"), [(["node_lost"], JobState.FAILED), (["backfill_window_closed"], "queued")]
)
def test_a_running_backfill_that_cannot_checkpoint_stops_and_follows_its_retry_policy(
    pool, tenant, held, retry_on, ends
):
    policy = {"max_attempts": 3, "backoff_s": 0, "retry_on": retry_on}
    job, lease = backfilled(pool, tenant, retry_policy=policy)
    run(job, lease)
    assert reclaim_backfills(now=reclaim_time(held)) == [job.pk]
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.state == ends and job.events.last().reason == Reason.BACKFILL_WINDOW_CLOSED
    # the capacity stays held until the agent confirms the container stopped
    assert lease.state == LeaseState.STOPPING
    [entry] = client_for(node=lease.node).get("/api/v1/agent/assignments").json()
    assert entry["state"] == "stopping"
    report(job, lease, "stopped")
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED
    assert ledger_problems(pool) == []


def test_the_reservation_owner_is_never_charged_for_the_backfill(pool, tenant, other_tenant, held):
    from leases.selectors import tenant_accounting

    job, lease = backfilled(pool, tenant)
    run(job, lease)
    mine = tenant_accounting(tenant, pool)["held"]
    owner = tenant_accounting(other_tenant, pool)["held"]
    assert mine["leases"] == 1 and mine["cpu_millicores"] == 1000
    assert owner["leases"] == 1 and owner["cpu_millicores"] == held.cpu_millicores


def test_the_reservation_s_job_waits_until_its_backfill_s_container_has_stopped(
    pool, tenant, other_tenant, held
):
    """The window opens while a backfill is still stopping (its agent has not confirmed): the
    reservation's job is not handed the reservation — it would start beside the container —
    and its start could not claim it either; once the stop is confirmed it runs."""
    job, lease = backfilled(pool, tenant)
    run(job, lease)
    assert reclaim_backfills(now=reclaim_time(held)) == [job.pk]
    owner_job = submit_job(pool, other_tenant, cpu=1000, max_runtime_s=600, reservation=held.pk)
    opened = held.window_start + timedelta(seconds=1)
    assert owner_job.pk not in scheduling_pass(now=opened).placed
    owner_job.refresh_from_db()
    assert owner_job.pending_reason["code"] == Reason.RESERVATION_BACKFILLS_STOPPING
    assert str(lease.pk) in owner_job.pending_reason["message"]
    # and the claim itself refuses while the container may run
    with pytest.raises(TransitionRefused) as refused:
        lease_commit(lease=held, fencing_token=held.fencing_token, actor=SYSTEM, now=opened)
    assert refused.value.code == Reason.RESERVATION_BACKFILLS_STOPPING
    report(job, lease, "stopped")
    assert scheduling_pass(now=opened).placed == [owner_job.pk]
    held.refresh_from_db()
    assert held.job_id == owner_job.pk
    assert ledger_problems(pool) == []


def test_a_reservation_ended_before_its_window_leaves_its_backfills_running_on_their_own(
    pool, tenant, other_tenant, held
):
    """Its owner releases the reservation while a backfilled job runs inside it: the job is not
    stopped; its lease holds its own capacity on the node from then (the ledger counts it, so
    nothing else is placed onto it) and is renewed past the old window like any lease."""
    job, lease = backfilled(pool, tenant, cpu=2000)
    run(job, lease)
    lease_release(lease=held, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    lease.refresh_from_db()
    assert lease.state == LeaseState.COMMITTED and lease.backfill_of_id is None
    adopted = lease.events.last()
    assert adopted.reason == Reason.BACKFILL_ADOPTED and adopted.data["backfill_of"] == held.pk
    node = lease.node
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 2000
    assert ledger_problems(pool) == []
    # a job that would need the backfill's cores waits; one that fits the rest is placed
    small = submit_job(pool, other_tenant, cpu=1000)
    assert scheduling_pass().placed == [small.pk], Job.objects.get(pk=small.pk).pending_reason
    big = submit_job(pool, other_tenant, cpu=1000)
    assert scheduling_pass().placed == []
    big.refresh_from_db()
    assert big.pending_reason["code"] == Reason.NO_CAPACITY
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 3000 < node.cpu_millicores_allocatable
    assert ledger_problems(pool) == []
    # the heartbeat renews it past the window start it was capped at
    renewed = lease_renew(
        lease=lease,
        fencing_token=lease.fencing_token,
        actor=SYSTEM,
        duration=2 * HOUR,
        now=timezone.now(),
    )
    assert renewed.expires_at > held.window_start
    report(job, lease, "succeeded")
    lease.refresh_from_db()
    node.refresh_from_db()
    assert lease.state == LeaseState.RELEASED and node.cpu_millicores_reserved == 1000
    assert ledger_problems(pool) == []
