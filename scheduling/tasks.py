"""Thin Celery tasks for the control loop: each takes `now` (default: the time it runs) and is
safe to run on several workers at once (per-job transactions with SKIP LOCKED). One bad job
never fails a task: the pass records it on that job and goes on."""

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from pools.tasktime import parse_now
from scheduling import backfill, drain, forecast, health, mig_plan, passes, queue_selectors
from scheduling.coalesce import PoolPasses

logger = logging.getLogger(__name__)


# A pass that hangs (a lock wait without end, a connection gone silent) is stopped: past this
# the worker kills the process running it and starts another; the database rolls its open
# transaction back. 30 periods (60 s at 2 s): a full window (SCHEDULER_PASS_MAX_JOBS, 2,000)
# plans and applies in well under one period on 5,000 nodes, and even the benchmark's single
# pass of 20,000 jobs took 26-38 s with the machine's 2 cores at a load of 10. The single path
# (SQLite's, and the fallback after a failed plan) is slower on a large pool (2.6 s a job on
# 5,000 nodes at that load) but commits job by job: a pass cut short there keeps what it placed
# and the next one goes on. A hard limit only: the soft one raises an Exception inside the pass,
# which its own isolation of failures would catch and go on with.
PASS_TIME_LIMIT_S = 30 * settings.SCHEDULER_PASS_PERIOD_S


@shared_task(name="scheduling.pass", time_limit=PASS_TIME_LIMIT_S)
def scheduling_pass(now=None) -> dict:
    """Beat's pass over every pool, the safety net of the passes events ask for."""
    result = passes.scheduling_pass(now=parse_now(now), hand_over=request_pass)
    return {"placed": result.placed, "pending": result.pending}


@shared_task(name="scheduling.pool_pass", time_limit=PASS_TIME_LIMIT_S)
def pool_pass(pool_id: int) -> dict:
    """The pass of one pool an event asked for (`request_pass`)."""
    PoolPasses(pool_id).unqueue()  # requests from now on are this pass's to miss: they send
    result = passes.event_pass(pool_id, hand_over=request_pass)
    return {"placed": result.placed, "pending": result.pending}


def request_pass(pool_id: int) -> None:
    """Ask for a pass of the pool (scheduling/receivers.py, once a submit, a lease's end or a
    node's readiness committed): one `pool_pass` task, delayed until the pool's minimum
    interval since its last pass has passed, unless one is already on its way (it has not
    started, so it will read what this request's transaction wrote). Never raises: a failure
    is logged, and beat's pass places the job."""
    if not settings.SCHEDULER_EVENT_PASSES:
        return
    state = PoolPasses(pool_id)
    delay = state.delay(settings.SCHEDULER_EVENT_MIN_INTERVAL_S)
    if not state.queue(delay):
        return
    try:
        pool_pass.apply_async(args=[pool_id], countdown=delay or None)
    except Exception:
        state.unqueue()
        logger.exception("pool %s: could not ask for a pass", pool_id)


@shared_task(name="scheduling.requeue_stranded_jobs")
def requeue_stranded_jobs(now=None) -> list[int]:
    return passes.requeue_jobs_without_lease(now=parse_now(now))


@shared_task(name="scheduling.checkpoint_deadline_sweep")
def checkpoint_deadline_sweep(now=None) -> list[int]:
    return drain.checkpoint_deadline_sweep(now=parse_now(now))


@shared_task(name="scheduling.reclaim_backfills")
def reclaim_backfills(now=None) -> list[int]:
    return backfill.reclaim_backfills(now=parse_now(now))


@shared_task(name="scheduling.drain_sweep")
def drain_sweep(now=None) -> dict[str, list[int]]:
    return drain.node_drain_sweep(now=parse_now(now))


@shared_task(name="scheduling.forecast_refresh")
def forecast_refresh(now=None) -> dict[int, int]:
    """Each pool's queued jobs get their queue class and predicted start window (one pool's
    failure is logged and the others go on)."""
    now = parse_now(now)
    refreshed = {}
    # order_by(): without it the model's ordering joins the DISTINCT, one pool per queued job
    pools = Job.objects.filter(state=JobState.QUEUED).order_by().values_list("pool_id", flat=True)
    for pool_id in pools.distinct():
        try:
            refreshed[pool_id] = forecast.refresh(pool_id, now)
        except Exception:
            logger.exception("forecast of pool %s failed", pool_id)
    return refreshed


@shared_task(name="scheduling.sample_capacity")
def sample_capacity() -> int:
    """Each pool's capacity sampled for the operators' utilisation charts (one pool's failure
    is recorded on its sample and the others go on), with its queued jobs by pending reason
    (the queue depth chart)."""
    now = timezone.now()
    taken = health.sample_capacity(now=now)
    queue_selectors.record_queue_depth(now)
    return taken


@shared_task(name="scheduling.roll_up_health")
def roll_up_health() -> int:
    """Each pool's hours of capacity samples and pass records folded into hourly rollups for
    the 7-day charts (kept 30 days; one pool-hour's failure is recorded on its row and the
    others go on)."""
    return health.roll_up()


@shared_task(name="scheduling.mig_layout_plan")
def mig_layout_plan(now=None) -> dict[int, dict]:
    """Each pool with `mig_reconfiguration` on: idle MIG GPUs asked for the layouts its waiting
    MIG jobs need (scheduling/mig_plan.py; one pool's or node's failure recorded, the others go
    on). UNVERIFIED ON HARDWARE."""
    return mig_plan.mig_plan(now=parse_now(now))
