"""Jobs whose lease ended under them, so nothing placed is silently lost: placed but not yet
running → back to the queue (`lease_expired`); running or checkpointing → `lost` (or queued
again by their retry policy)."""

from __future__ import annotations

from django.utils import timezone

from jobs.choices import JobState
from jobs.lifecycle import job_lost
from jobs.models import Job, JobEvent
from jobs.services import job_transition
from leases.choices import HOLDING
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from pools.sweeps import sweep

from .outcomes import SCHEDULER


def requeue_jobs_without_lease(*, now=None) -> list[int]:
    """Jobs whose lease ended under them (returns the ids it moved): placed but not yet running
    → back to the queue (`lease_expired`); running or checkpointing → the node went silent past
    its uncertain deadline (or the lease ran out unrenewed), so the job is `lost` (`node_lost`),
    or queued again by its retry policy. Each job in its own transaction (pools.sweeps.sweep)."""
    now = now or timezone.now()
    without_lease = Job.objects.exclude(leases__state__in=HOLDING)
    moved = []
    for states, handle in (
        ((JobState.LEASED, JobState.STARTING), _requeue),
        ((JobState.RUNNING, JobState.CHECKPOINTING), _lose),
    ):
        moved += sweep(
            without_lease.filter(state__in=states),
            lambda job, handle=handle: handle(job, now),
            event_model=JobEvent,
            actor=SCHEDULER,
            now=now,
        )
    return moved


def _still_without_lease(job) -> None:
    # Checked under the job's row lock: a pass may have placed it again meanwhile.
    if job.leases.filter(state__in=HOLDING).exists():
        raise TransitionRefused("job_has_lease", f"job {job.pk} holds a lease again")


def _requeue(job, now) -> None:
    job_transition(
        job=job,
        to=JobState.QUEUED,
        actor=SCHEDULER,
        reason=Reason.LEASE_EXPIRED,
        message="its lease ended before the job started; back in the queue",
        now=now,
        check=_still_without_lease,
    )


def _lose(job, now) -> None:
    job_lost(job=job, actor=SCHEDULER, now=now, check=_still_without_lease)
