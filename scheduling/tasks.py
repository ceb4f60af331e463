"""Thin Celery tasks for the control loop: each takes `now` (default: the time it runs) and is
safe to run on several workers at once (per-job transactions with SKIP LOCKED). One bad job
never fails a task: the pass records it on that job and goes on."""

from celery import shared_task

from leases.tasks import parse_now
from scheduling import drain, passes


@shared_task(name="scheduling.pass")
def scheduling_pass(now=None) -> dict:
    result = passes.scheduling_pass(now=parse_now(now))
    return {"placed": result.placed, "pending": result.pending}


@shared_task(name="scheduling.requeue_stranded_jobs")
def requeue_stranded_jobs(now=None) -> list[int]:
    return passes.requeue_jobs_without_lease(now=parse_now(now))


@shared_task(name="scheduling.drain_sweep")
def drain_sweep(now=None) -> dict[str, list[int]]:
    return drain.node_drain_sweep(now=parse_now(now))
