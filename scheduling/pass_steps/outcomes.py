"""What a pass records of each job it considers: placed (one note of a placement, for both
paths' `placed` events), waiting (its `pending_reason`), or failed (`scheduling_error`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import OperationalError

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_note_pending, job_transition, jobs_note_pending
from leases.services import tenants_at_quota
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused, error_summary

SCHEDULER = Actor.system("scheduler")
# a refusal that holds for every queued job of the tenant in the pool
TENANT_WIDE = (Reason.QUOTA_EXCEEDED.value, Reason.CREDIT_EXHAUSTED.value)
logger = logging.getLogger(__name__)


@dataclass
class PassResult:
    placed: list[int] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)  # job id → reason code
    gangs: set[int] = field(default_factory=set)  # gang members: never preempted for one by one


def placement_note(node: str, lease_id: int, policy_version, gang: str = "") -> tuple[str, dict]:
    """The `placed` event's message and data, as both paths write it (`gang`: the name of the
    gang the job was placed with)."""
    message = f"placed on {node}{f' with gang {gang}' if gang else ''} (lease {lease_id})"
    data = {"lease": lease_id, "node": node, "policy_version": policy_version}
    if gang:
        data["gang"] = gang
    return message, data


def note_tenants_at_quota(now, **scope) -> set[tuple[int, int]]:
    """Every queued job of a tenant without quota left is noted pending with the reason, in one
    UPDATE per tenant and pool instead of a placement attempt per job."""
    blocked = tenants_at_quota(**scope)
    for (tenant_id, pool_id), explanation in blocked.items():
        jobs_note_pending(tenant_id=tenant_id, pool_id=pool_id, explanation=explanation, now=now)
    return set(blocked)


def scheduling_error(job_id: int, error: Exception, now) -> str:
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
