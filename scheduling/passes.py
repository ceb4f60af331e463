"""The scheduling pass: queued jobs become leases, in the queue's order, planned together.

One pass per pool. On PostgreSQL (`batch_pass`): read a window of queued jobs, order it by fair
share and take ONE snapshot of the pool (`plan.read`), plan every job on it in the pure core
(`plan.plan`), then write the plan in ONE transaction (`apply.apply_plan`). Elsewhere, and for
the jobs of a plan whose apply failed, the single path places them one by one
(`single.one_by_one`). Each step is a module of `scheduling/pass_steps/`; docs/scheduler.md
"The scheduling pass" tells the whole story.

A pool's passes never overlap: each runs under the pool's lock, and a pass asked for while
another holds it is run by that holder right after its own (`scheduling/coalesce.py`); beat's
pass over every pool (`scheduling_pass`) and the pass of one pool an event asks for
(`event_pass`) go through the same lock.

One bad job never stops the pass: a job whose request cannot be planned is recorded on its own
(`scheduling_error`); a plan whose apply fails rolls back as a whole and its jobs then go one by
one, which isolates the bad one.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

from django.conf import settings
from django.utils import timezone

from leases import backend
from pools.models import ComputePool
from pools.reasons import Reason
from scheduling import fairshare
from scheduling.coalesce import EVENT_BUDGET_S, run_exclusive
from scheduling.health import record_pass
from scheduling.pass_steps import apply, plan, reserved, single
from scheduling.pass_steps.outcomes import TENANT_WIDE, PassResult, note_tenants_at_quota
from scheduling.pass_steps.stranded import requeue_jobs_without_lease
from scheduling.pass_steps.window import queued_jobs
from scheduling.preemption import noticed_pools, preempt_for

__all__ = [
    "PassResult",
    "batch_pass",
    "event_pass",
    "pool_pass",
    "queued_jobs",
    "requeue_jobs_without_lease",
    "scheduling_pass",
]
logger = logging.getLogger(__name__)


def scheduling_pass(
    *,
    now=None,
    pool_id=None,
    limit: int | None = None,
    hand_over: Callable[[int], None] | None = None,
) -> PassResult:
    """Every pool's pass (or `pool_id`'s) on one window, each under its pool's lock: a pool whose
    lock another holds is left to it (it runs one more pass after its own). A holder asked for
    another pass meanwhile runs it at once (on a window of its pool read afresh); asked again,
    it calls `hand_over(pool_id)` (beat's task: an event pass) and goes on with the next pool."""
    given_now, now = now, now or timezone.now()
    result = PassResult()
    at_quota = note_tenants_at_quota(now, pool_id=pool_id)
    limit = limit or settings.SCHEDULER_PASS_MAX_JOBS
    window: dict[int, list[int]] = defaultdict(list)
    for job_id, _, job_pool_id in queued_jobs(pool_id=pool_id, limit=limit, skip=at_quota, now=now):
        window[job_pool_id].append(job_id)
    for job_pool_id in noticed_pools(pool_id) - window.keys():  # no queued job in its window
        window[job_pool_id] = []  # its notices settled all the same

    for job_pool_id, job_ids in window.items():

        def one_pass(n: int, pool=job_pool_id, ids=job_ids) -> None:
            if n == 0:  # on this window
                _pool_round(pool, ids, now, result)
            else:  # asked for while it ran: on the pool's window as it is now
                _pool_round(pool, None, given_now or timezone.now(), result, limit)

        run_exclusive(
            job_pool_id,
            one_pass,
            pace_s=settings.SCHEDULER_EVENT_MIN_INTERVAL_S,
            hand_over=hand_over,
        )
    return result


def event_pass(pool_id: int, hand_over: Callable[[int], None] | None = None) -> PassResult:
    """The pass of one pool an event asked for (scheduling/tasks.py `pool_pass`), under the
    pool's lock, paced: it starts `SCHEDULER_EVENT_MIN_INTERVAL_S` after the pool's previous
    pass ended, and so does each further pass asked for while it runs."""
    result = PassResult()
    run_exclusive(
        pool_id,
        lambda n: _pool_round(pool_id, None, timezone.now(), result),
        pace_s=settings.SCHEDULER_EVENT_MIN_INTERVAL_S,
        pace_first=True,
        budget_s=EVENT_BUDGET_S,
        hand_over=hand_over,
    )
    return result


def _pool_round(pool_id: int, job_ids, now, result: PassResult, limit: int | None = None):
    """One pass of one pool, on `job_ids`, or (None) on a window of the pool read now; a pool
    without queued jobs has its preemption notices settled."""
    if job_ids is None:
        at_quota = note_tenants_at_quota(now, pool_id=pool_id)
        limit = limit or settings.SCHEDULER_PASS_MAX_JOBS
        rows = queued_jobs(pool_id=pool_id, limit=limit, skip=at_quota, now=now)
        job_ids = [job_id for job_id, _, _ in rows]
    if job_ids:
        pool_pass(pool_id, job_ids, now, result)
    elif pool_id in noticed_pools(pool_id):
        _preempt_for_waiting(pool_id, {}, result, now)


def pool_pass(pool_id: int, job_ids: list[int], now, result: PassResult) -> None:
    """One pool's part of a pass, recorded for the operators' health charts (its phases'
    seconds among the figures): the batch plan, or the single path."""
    started, clock = timezone.now(), time.perf_counter()
    before = PassResult(list(result.placed), dict(result.pending))
    try:  # the tenants' decayed usage brought up to now, before their standings are read
        fairshare.charge(pool_id, now)
    except Exception:
        logger.exception("scheduling pass: fair-share charge of pool %s failed", pool_id)
    phases, considered = {}, len(job_ids)
    if handled := reserved.place_into_reservations(pool_id, job_ids, now, result):
        job_ids = [job_id for job_id in job_ids if job_id not in handled]
    if not backend.postgresql():
        single.one_by_one(job_ids, now, result)
    else:
        try:
            phases = batch_pass(pool_id, job_ids, now, result)
        except Exception:  # the plan rolled back as a whole: one by one isolates a bad job
            logger.exception("scheduling pass: the plan of pool %s failed", pool_id)
            done = set(result.placed) | set(result.pending)
            single.one_by_one([j for j in job_ids if j not in done], now, result)
    pending = {j: code for j, code in result.pending.items() if j not in before.pending}
    _preempt_for_waiting(pool_id, pending, result, now)
    codes = list(pending.values())
    record_pass(
        pool_id=pool_id,
        started_at=started,
        duration_s=time.perf_counter() - clock,
        considered=considered,
        placed=len(result.placed) - len(before.placed),
        conflicts=codes.count(Reason.PLAN_CONFLICT.value),
        errors=codes.count(Reason.SCHEDULING_ERROR.value),
        **phases,
    )


@plan.PausedCollector()
def batch_pass(pool_id: int, job_ids: list[int], now, result: PassResult) -> dict[str, float]:
    """Read → plan → apply; returns the seconds of each phase (snapshot_s, plan_s, apply_s)."""
    lap = time.perf_counter()
    pool = ComputePool.objects.get(pk=pool_id)
    reading = plan.read(pool, job_ids, now, result)
    snapshot_s, lap = time.perf_counter() - lap, time.perf_counter()
    planned = plan.plan(reading, now, result)
    plan_s, lap = time.perf_counter() - lap, time.perf_counter()
    waiting = [p for p in planned if _code(p) == Reason.NO_CAPACITY.value and not p.job.gang]
    if waiting and not single.holds_reservations(pool_id):
        waiting = []
    apply.apply_plan(pool, planned, reading.view, now, result)
    for tenant_id in {p.job.tenant_id for p in planned if _code(p) in TENANT_WIDE}:
        note_tenants_at_quota(now, pool_id=pool_id, tenant_id=tenant_id)  # all its jobs, bulk
    apply_s = time.perf_counter() - lap
    if waiting:  # the single path tries reservations' holds, and explains the rest
        single.backfill(waiting, now, result)
    return {"snapshot_s": snapshot_s, "plan_s": plan_s, "apply_s": apply_s}


def _code(p: plan.Planned) -> str:
    return (p.explanation or {}).get("code", "")


def _preempt_for_waiting(pool_id: int, pending: dict, result: PassResult, now) -> None:
    """Priority work that waits for capacity may preempt (scheduling/preemption.py); gang
    members never do, one by one. The pool's pending preemption notices are settled first,
    whether or not a job waits. A failure is logged and the pass goes on."""
    waiting = [
        j
        for j, code in pending.items()
        if code == Reason.NO_CAPACITY.value and j not in result.gangs
    ]
    try:
        preempt_for(pool_id, waiting, now)
    except Exception:
        logger.exception("scheduling pass: preemption in pool %s failed", pool_id)
