"""The scheduling pass: queued jobs become leases, highest priority first, oldest first.

Each job is placed in its own short transaction that locks the job row (SKIP LOCKED, so passes
running on several workers share the queue instead of waiting on each other), reserves through
`lease_reserve` — the same guarded ledger path as the lease API — and moves the job to `leased`
in the same commit. A job that does not fit keeps the scheduler's explanation in
`Job.pending_reason`: "why is this pending" is answered from there.

Fair share, quotas over time, aging and preemption (roadmap item 5) will change the order in
`queued_jobs`; the apply path stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_note_pending, job_transition
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from .choices import HOLDING
from .services import NoCapacity, lease_reserve

SCHEDULER = Actor.system("scheduler")


@dataclass
class PassResult:
    placed: list[int] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)  # job id → reason code


def queued_jobs(*, pool_id=None, limit: int):
    jobs = Job.objects.filter(state=JobState.QUEUED)
    if pool_id is not None:
        jobs = jobs.filter(pool_id=pool_id)
    return jobs.order_by(
        F("priority_class__value").desc(nulls_last=True), "created_at", "id"
    ).values_list("id", flat=True)[:limit]


def scheduling_pass(*, now=None, pool_id=None, limit: int = 500) -> PassResult:
    now = now or timezone.now()
    result = PassResult()
    for job_id in list(queued_jobs(pool_id=pool_id, limit=limit)):
        outcome = _place_one(job_id, now)
        if outcome is True:
            result.placed.append(job_id)
        elif outcome:
            result.pending[job_id] = outcome
    return result


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
                idempotency_key=f"job-{job.pk}-attempt-{job.attempts + 1}",
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
    """Jobs placed but not yet running whose lease ended (expired, released, node lost) go back
    to the queue with the reason, so nothing placed is silently lost."""
    now = now or timezone.now()
    stranded = Job.objects.filter(state__in=(JobState.LEASED, JobState.STARTING)).exclude(
        leases__state__in=HOLDING
    )
    requeued = []
    for job in stranded.only("pk", "state"):
        try:
            job_transition(
                job=job,
                to=JobState.QUEUED,
                actor=SCHEDULER,
                reason=Reason.LEASE_EXPIRED,
                message="its lease ended before the job started; back in the queue",
                now=now,
                check=_still_without_lease,
            )
        except TransitionRefused:
            continue  # someone else moved it first
        requeued.append(job.pk)
    return requeued
