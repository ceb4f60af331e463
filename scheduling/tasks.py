"""Thin Celery tasks: each sweep takes `now` (default: the time it runs) and is safe to run on
several workers at once (per-lease transactions with SKIP LOCKED; a second run finds nothing).
One bad row never fails a task: the pass and the sweeps record it on that row and go on."""

from datetime import datetime, timedelta

from celery import shared_task
from django.utils import timezone

from scheduling import passes, services

UNCERTAIN_DEADLINE = timedelta(minutes=10)


def _now(now):
    if now is None:
        return timezone.now()
    return datetime.fromisoformat(now) if isinstance(now, str) else now


@shared_task(name="scheduling.expire_leases")
def expire_leases(now=None) -> int:
    return services.expire_leases(now=_now(now))


@shared_task(name="scheduling.expire_uncertain")
def expire_uncertain(now=None, deadline_s=None) -> int:
    deadline = timedelta(seconds=deadline_s) if deadline_s is not None else UNCERTAIN_DEADLINE
    return services.expire_uncertain(now=_now(now), deadline=deadline)


@shared_task(name="scheduling.release_unclaimed_reservations")
def release_unclaimed_reservations(now=None) -> int:
    return services.release_unclaimed_reservations(now=_now(now))


@shared_task(name="scheduling.pass")
def scheduling_pass(now=None) -> dict:
    result = passes.scheduling_pass(now=_now(now))
    return {"placed": result.placed, "pending": result.pending}


@shared_task(name="scheduling.requeue_stranded_jobs")
def requeue_stranded_jobs(now=None) -> list[int]:
    return passes.requeue_jobs_without_lease(now=_now(now))
