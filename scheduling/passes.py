"""The scheduling pass: queued jobs become leases, highest priority first, oldest first.

Each job is placed in its own short transaction that locks the job row (SKIP LOCKED, so passes
running on several workers share the queue instead of waiting on each other), reserves through
`lease_reserve` — the same guarded ledger path as the lease API — and moves the job to `leased`
in the same commit. A job that does not fit keeps the scheduler's explanation in
`Job.pending_reason`: "why is this pending" is answered from there.

One bad job never stops the pass: an unexpected error on it rolls back its own transaction and
is recorded on that job (`scheduling_error`), and the pass goes on with the next. Tenants at
their quota are noted pending in bulk, without a placement attempt, and the window of jobs a
pass looks at is taken round-robin over tenants, so one tenant's backlog cannot starve another.

Fair share, quotas over time, aging and preemption (roadmap item 5) will change the order in
`queued_jobs`; the apply path stays as it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import F, Q, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from jobs.choices import JobState
from jobs.lifecycle import job_lost
from jobs.models import Job, JobEvent
from jobs.services import job_note_pending, job_transition, jobs_note_pending
from leases.choices import HOLDING
from leases.services import SCHEDULER_KEY_PREFIX, NoCapacity, lease_reserve, tenants_at_quota
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused, error_summary, record_sweep_failure

SCHEDULER = Actor.system("scheduler")
logger = logging.getLogger(__name__)
# highest priority first, then oldest
PASS_ORDER = (
    F("priority_class__value").desc(nulls_last=True),
    F("created_at").asc(),
    F("id").asc(),
)


@dataclass
class PassResult:
    placed: list[int] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)  # job id → reason code


def queued_jobs(*, pool_id=None, limit: int, skip=frozenset(), now=None):
    """The pass's window: (job id, tenant id, pool id) of up to `limit` queued jobs, in
    PASS_ORDER. It is filled round-robin over (tenant, pool) — every tenant's first job, then
    every tenant's second, … — so one tenant's backlog cannot keep another's job out of it.
    `skip`: (tenant id, pool id) pairs left out (at their quota). A retried job waits out its
    backoff (`not_before`)."""
    jobs = Job.objects.filter(state=JobState.QUEUED)
    jobs = jobs.filter(Q(not_before__isnull=True) | Q(not_before__lte=now or timezone.now()))
    if pool_id is not None:
        jobs = jobs.filter(pool_id=pool_id)
    for tenant_id, skipped_pool_id in skip:
        jobs = jobs.exclude(tenant_id=tenant_id, pool_id=skipped_pool_id)
    turn = Window(RowNumber(), partition_by=[F("tenant_id"), F("pool_id")], order_by=PASS_ORDER)
    window = jobs.annotate(turn=turn).order_by("turn", *PASS_ORDER).values("id")[:limit]
    return (
        Job.objects.filter(pk__in=Subquery(window))
        .order_by(*PASS_ORDER)
        .values_list("id", "tenant_id", "pool_id")
    )


def scheduling_pass(*, now=None, pool_id=None, limit: int = 500) -> PassResult:
    now = now or timezone.now()
    result = PassResult()
    at_quota = _note_tenants_at_quota(now, pool_id=pool_id)
    for job_id, tenant_id, job_pool_id in list(
        queued_jobs(pool_id=pool_id, limit=limit, skip=at_quota, now=now)
    ):
        if (tenant_id, job_pool_id) in at_quota:
            continue  # reached its quota earlier in this pass: noted in bulk
        try:
            outcome = _place_one(job_id, now)
        except Exception as error:  # one bad job never stops the pass
            outcome = _scheduling_error(job_id, error, now)
        if outcome is True:
            result.placed.append(job_id)
        elif outcome:
            result.pending[job_id] = outcome
        if outcome == "quota_exceeded":  # the tenant's other jobs need no attempt if it is full
            at_quota |= _note_tenants_at_quota(now, pool_id=job_pool_id, tenant_id=tenant_id)
    return result


def _note_tenants_at_quota(now, **scope) -> set[tuple[int, int]]:
    """Every queued job of a tenant without quota left is noted pending with the reason, in one
    UPDATE per tenant and pool instead of a placement attempt per job."""
    blocked = tenants_at_quota(**scope)
    for (tenant_id, pool_id), explanation in blocked.items():
        jobs_note_pending(tenant_id=tenant_id, pool_id=pool_id, explanation=explanation, now=now)
    return set(blocked)


def _scheduling_error(job_id: int, error: Exception, now) -> str:
    """Record an unexpected error on its job, after the job's transaction rolled back: a
    transient database error (lock, timeout, lost connection) leaves the job queued for the next
    pass with the error as its pending reason; anything else (a corrupt stored request, a row
    the database refuses) fails the job with the error, so it stops blocking the queue."""
    logger.exception("scheduling pass: job %s failed", job_id)
    message = error_summary(error)
    explanation = {"code": Reason.SCHEDULING_ERROR.value, "message": message}
    job = Job(pk=job_id)
    try:
        if isinstance(error, OperationalError):
            job_note_pending(job=job, explanation=explanation, now=now)
        else:
            job_transition(
                job=job,
                to=JobState.FAILED,
                actor=SCHEDULER,
                reason=Reason.SCHEDULING_ERROR,
                message=message,
                now=now,
                changes={"pending_reason": explanation},
                check=_still_queued,
            )
    except Exception:
        logger.exception("scheduling pass: could not record the error on job %s", job_id)
    return Reason.SCHEDULING_ERROR.value


def _still_queued(job) -> None:
    if job.state != JobState.QUEUED:  # another pass or the tenant moved it meanwhile
        raise TransitionRefused("transition_not_allowed", f"job {job.pk} is {job.state}")


def _place_one(job_id: int, now) -> bool | str | None:
    """True when placed; a reason code when it must wait; None when another pass has it."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("pool", "tenant")
            .filter(pk=job_id, state=JobState.QUEUED)
            .first()
        )
        if job is None:
            return None
        try:
            lease = lease_reserve(
                pool=job.pool,
                tenant=job.tenant,
                request=job.resources,
                actor=SCHEDULER,
                duration=settings.LEASE_DEFAULT_TTL,
                job=job,
                idempotency_key=f"{SCHEDULER_KEY_PREFIX}{job.pk}-attempt-{job.attempts + 1}",
                now=now,
            )
        except NoCapacity as refusal:
            explanation = refusal.explanation
        except TransitionRefused as refusal:  # quota and other policy refusals
            explanation = {"code": refusal.code, "message": refusal.message}
        else:
            node = lease.placement.get("node", "")
            job_transition(
                job=job,
                to=JobState.LEASED,
                actor=SCHEDULER,
                reason=Reason.PLACED,
                message=f"placed on {node} (lease {lease.pk})",
                now=now,
                changes={"attempts": job.attempts + 1, "pending_reason": {}},
                data={"lease": lease.pk, "node": node, "policy_version": lease.policy_version},
            )
            return True
    job_note_pending(job=job, explanation=explanation, now=now)
    return explanation.get("code", "pending")


def _still_without_lease(job) -> None:
    # Checked under the job's row lock: a pass may have placed it again meanwhile.
    if job.leases.filter(state__in=HOLDING).exists():
        raise TransitionRefused("job_has_lease", f"job {job.pk} holds a lease again")


def requeue_jobs_without_lease(*, now=None) -> list[int]:
    """Jobs whose lease ended under them, so nothing placed is silently lost (returns the ids
    it moved): placed but not yet running → back to the queue (`lease_expired`); running or
    checkpointing → the node went silent past its uncertain deadline (or the lease ran out
    unrenewed), so the job is `lost` (`node_lost`), or queued again by its retry policy."""
    now = now or timezone.now()
    moved = []
    stranded = Job.objects.filter(state__in=(JobState.LEASED, JobState.STARTING)).exclude(
        leases__state__in=HOLDING
    )
    for job in stranded.only("pk", "state"):
        if _handle_stranded(job, now, _requeue):
            moved.append(job.pk)
    lost = Job.objects.filter(state__in=(JobState.RUNNING, JobState.CHECKPOINTING)).exclude(
        leases__state__in=HOLDING
    )
    for job in lost.only("pk", "state"):
        if _handle_stranded(job, now, _lose):
            moved.append(job.pk)
    return moved


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


def _handle_stranded(job, now, handle) -> bool:
    try:
        handle(job, now)
    except TransitionRefused:
        return False  # someone else moved it first
    except Exception as error:  # one bad job never stops the sweep
        record_sweep_failure(
            Job, job.pk, event_model=JobEvent, actor=SCHEDULER, error=error, now=now
        )
        return False
    return True
