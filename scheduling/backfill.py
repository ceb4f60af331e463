"""Backfilled jobs reclaimed before their reservation's window opens (docs/leases.md "Backfill").

A job that runs inside a reservation's hold (`Lease.backfill_of`) is renewed by heartbeats up to
the window start. `reclaim_lead` before it (the pool's stop grace and a margin), this sweep takes
the capacity back, each job with `backfill_window_closed`:
- running and checkpointable: asked to checkpoint; the agent's `checkpointed` report re-queues
  it and releases its lease (as a drain's or a preemption's checkpoint);
- not started yet (leased, starting): re-queued, its lease ended (a started container stops);
- running, not checkpointable (it overran: a start later than planned): re-queued when its retry
  policy retries `backfill_window_closed`, else failed; its lease stays `stopping` until the
  agent confirms the container stopped.
A backfill of the lease API needs no reclaim: its own expiry is at most the window start.
"""

from __future__ import annotations

from django.utils import timezone

from jobs.choices import JobState
from jobs.lifecycle import job_request_checkpoint, retry_allowed
from jobs.models import Job, JobEvent
from jobs.services import job_transition
from leases.choices import HOLDING, LeaseState
from leases.models import Lease
from leases.services import lease_release, lease_stop
from leases.services.backfill import reclaim_lead
from pools.actors import Actor
from pools.models import ComputePool
from pools.reasons import Reason
from pools.sweeps import sweep

RECLAIM = Actor.system("backfill-reclaim")
_ON_NODE = (JobState.LEASED, JobState.STARTING, JobState.RUNNING)


def reclaim_backfills(*, now=None) -> list[int]:
    """Reclaim the backfilled jobs whose reservation's window opens within their pool's
    `reclaim_lead`; returns the jobs reclaimed. One failing job is recorded on its row and the
    others go on (pools.sweeps.sweep)."""
    now = now or timezone.now()
    backfills = Lease.objects.filter(
        state__in=HOLDING - {LeaseState.STOPPING},
        backfill_of__isnull=False,
        job__state__in=_ON_NODE,
    )
    reclaimed = []
    for pool in ComputePool.objects.filter(pk__in=backfills.values("pool_id")).order_by("pk"):
        soon = backfills.filter(pool=pool, backfill_of__window_start__lte=now + reclaim_lead(pool))
        due = Job.objects.filter(state__in=_ON_NODE, pk__in=soon.values("job_id"))
        done = sweep(
            due, lambda job: _reclaim(job, now), event_model=JobEvent, actor=RECLAIM, now=now
        )
        reclaimed += [pk for pk, moved in done.items() if moved]
    return reclaimed


def _reclaim(job: Job, now) -> bool:
    lease = (
        Lease.objects.filter(job=job, state__in=HOLDING - {LeaseState.STOPPING})
        .exclude(backfill_of=None)
        .select_related("backfill_of")
        .first()
    )
    if lease is None:
        return False
    window_start = lease.backfill_of.window_start
    opens = f"reservation {lease.backfill_of_id}'s window opens at {window_start:%H:%M:%S}"
    details = {"actor": RECLAIM, "reason": Reason.BACKFILL_WINDOW_CLOSED, "now": now}
    if job.state == JobState.RUNNING and job.checkpointable:
        job_request_checkpoint(job=job, message=f"{opens}: checkpoint, then re-queue", **details)
        return True
    if job.state == JobState.RUNNING and not retry_allowed(job, Reason.BACKFILL_WINDOW_CLOSED):
        job_transition(job=job, to=JobState.FAILED, message=f"{opens}: stopped", **details)
    else:  # not started, or its retry policy retries it
        job_transition(
            job=job,
            to=JobState.QUEUED,
            message=f"{opens}: stopped and re-queued",
            changes={"pending_reason": {}},
            **details,
        )
    if lease.state == LeaseState.RESERVED:  # no container was created under it
        lease_release(
            lease=lease, actor=RECLAIM, reason=Reason.BACKFILL_WINDOW_CLOSED, message=opens, now=now
        )
    else:
        lease_stop(
            lease=lease,
            actor=RECLAIM,
            message=f"{opens}: held until its container stopped",
            now=now,
        )
    return True
