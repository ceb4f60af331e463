"""Job submission and lifecycle. Every state change writes a JobEvent and publishes it live."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from leases.choices import HOLDING
from leases.services import check_ever_fits, lease_release
from pools.actors import Actor
from pools.models import ComputePool, PriorityClass, ResourceShape, Tenant
from pools.reasons import Reason
from pools.statemachine import transition

from .choices import JOB_TRANSITIONS, JobState
from .events import publish_job_event
from .models import Job, JobEvent


def job_submit(
    *,
    tenant: Tenant,
    pool: ComputePool,
    name: str,
    image: str,
    actor: Actor,
    shape: ResourceShape | None = None,
    resources: dict | None = None,
    command: list[str] | None = None,
    env: dict | None = None,
    priority_class: PriorityClass | None = None,
    checkpointable: bool = False,
    max_runtime_s: int = 3600,
) -> Job:
    if (shape is None) == (resources is None):
        raise ValueError("give exactly one of shape or resources")
    resources = shape.as_request() if shape else resources
    # A shape no node of the pool could ever hold is refused now (NeverFits, 422), not queued
    # forever: the same answer as POST /compute-leases.
    check_ever_fits(pool=pool, tenant=tenant, request=resources)
    with transaction.atomic():
        job = Job.objects.create(
            tenant=tenant,
            pool=pool,
            name=name,
            image=image,
            shape=shape,
            resources=resources,
            command=command or [],
            env=env or {},
            priority_class=priority_class,
            checkpointable=checkpointable,
            max_runtime_s=max_runtime_s,
            submitted_by=actor.user,
        )
        event = JobEvent.record(
            job,
            actor=actor,
            from_state="",
            to_state=JobState.QUEUED,
            reason=Reason.SUBMITTED,
            message=f"submitted to pool {pool.slug}",
        )
        transaction.on_commit(lambda: publish_job_event(job, event))
    return job


def job_transition(
    *,
    job: Job,
    to: str,
    actor: Actor,
    reason: str,
    message: str = "",
    now=None,
    changes: dict | None = None,
    data: dict | None = None,
    check=None,
) -> Job:
    return transition(
        Job,
        job.pk,
        to=to,
        allowed=JOB_TRANSITIONS,
        event_model=JobEvent,
        actor=actor,
        reason=reason,
        message=message,
        now=now or timezone.now(),
        changes=changes,
        data=data,
        check=check,
        on_commit=publish_job_event,
    )


def job_note_pending(*, job: Job, explanation: dict, now=None) -> None:
    """Record why the scheduler could not place a queued job (not a state change)."""
    Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
        pending_reason=explanation, pending_checked_at=now or timezone.now()
    )


def jobs_note_pending(*, tenant_id: int, pool_id: int, explanation: dict, now=None) -> int:
    """The same for every queued job of a tenant in a pool at once (the scheduling pass skips a
    tenant at its quota); jobs that already say so are not rewritten on every pass."""
    return (
        Job.objects.filter(state=JobState.QUEUED, tenant_id=tenant_id, pool_id=pool_id)
        .exclude(pending_reason=explanation)
        .update(pending_reason=explanation, pending_checked_at=now or timezone.now())
    )


def job_cancel(*, job: Job, actor: Actor, message: str = "") -> Job:
    """Cancelled, and its leases released in the same transaction: the capacity is back at
    once, and the node cannot keep renewing a lease for work nobody wants."""
    with transaction.atomic():
        job = job_transition(
            job=job,
            to=JobState.CANCELLED,
            actor=actor,
            reason=Reason.CANCELLED_BY_USER,
            message=message or "cancelled",
        )
        # after the job's row lock: a pass that placed it meanwhile has committed its lease
        for lease in job.leases.filter(state__in=HOLDING).order_by("id"):
            lease_release(
                lease=lease,
                actor=actor,
                reason=Reason.RELEASED_JOB_ENDED,
                message=f"job {job.pk} was cancelled",
            )
    return job


def job_finish(*, job: Job, actor: Actor, exit_code: int, message: str = "") -> Job:
    """A process exit: 0 succeeds, anything else fails with the code in the reason."""
    if exit_code == 0:
        return job_transition(
            job=job,
            to=JobState.SUCCEEDED,
            actor=actor,
            reason=Reason.EXITED_ZERO,
            changes={"exit_code": 0},
            message=message or "process exited with 0",
        )
    return job_transition(
        job=job,
        to=JobState.FAILED,
        actor=actor,
        reason=Reason.EXITED_NONZERO,
        changes={"exit_code": exit_code},
        message=message or f"process exited with {exit_code}",
    )
