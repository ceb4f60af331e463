"""Thin Celery tasks of the jobs app: each takes `now` (default: the time it runs) and is safe
to run on several workers at once. One bad job never fails a task: the sweep records it on
that job and goes on."""

from celery import shared_task

from jobs import artifacts
from pools.tasktime import parse_now


@shared_task(name="jobs.expire_artifacts")
def expire_artifacts(now=None) -> int:
    """Daily (config/celery.py): outputs and logs of jobs ended past their pool's retention."""
    return artifacts.expire_artifacts(now=parse_now(now))
