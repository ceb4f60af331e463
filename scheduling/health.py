"""Scheduler health and utilisation over time, for the operators' console.

* `record_pass(...)` — the scheduling pass calls it once per pool and pass: how long it took
  (and each phase of the batch plan: snapshot, plan, apply), how many queued jobs it
  considered, placed, lost to a plan conflict, failed on.
* `sample_capacity(now)` — a periodic task (scheduling/tasks.py) stores each pool's
  capacity totals (`leases.selectors.pool_capacity`: allocatable, reserved = requested,
  used = measured by the agents), so utilisation has a history. Sampling was chosen over
  deriving from lease usage records: a lease keeps only its latest, peak and average usage,
  not a time series, and the pool's allocatable changes too (nodes come, drain, go).
* `pass_series`, `phase_means`, `expiry_series`, `utilisation` — what the pages draw, aggregated
  by the database in minute or hour buckets (portable: SQLite serves `make run`).

Both tables keep `SCHEDULER_HEALTH_WINDOW_HOURS`; older rows are pruned as new ones come.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, Max, Sum
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from leases.models import LeaseEvent
from leases.selectors import pool_capacity
from pools.models import ComputePool
from pools.reasons import Reason
from pools.statemachine import error_summary

from .models import CapacitySample, PassRecord

logger = logging.getLogger(__name__)

EXPIRY_REASONS = (Reason.EXPIRED_UNCOMMITTED, Reason.EXPIRED_NOT_RENEWED)
DIMENSIONS = ("cpu_millicores", "memory_mib", "gpu_milli")
PHASES = ("snapshot_s", "plan_s", "apply_s")  # of a batch plan, in a PassRecord
# The windows the pages offer: (hours, bucket) — 60 one-minute points, or 24 one-hour points.
WINDOWS = {1: TruncMinute, 24: TruncHour}


def window() -> timedelta:
    return timedelta(hours=settings.SCHEDULER_HEALTH_WINDOW_HOURS)


# --- writes ----------------------------------------------------------------------------------


def record_pass(
    *,
    pool_id: int,
    started_at,
    duration_s: float,
    considered: int = 0,
    placed: int = 0,
    conflicts: int = 0,
    errors: int = 0,
    snapshot_s: float | None = None,
    plan_s: float | None = None,
    apply_s: float | None = None,
) -> PassRecord | None:
    """One pass over one pool, with the seconds of the batch plan's phases (None: the single
    path). Never raises: health bookkeeping must not fail a pass (and, in its own savepoint,
    never breaks the caller's transaction either)."""
    try:
        with transaction.atomic():
            record = PassRecord.objects.create(
                pool_id=pool_id,
                started_at=started_at,
                duration_s=duration_s,
                considered=considered,
                placed=placed,
                conflicts=conflicts,
                errors=errors,
                snapshot_s=snapshot_s,
                plan_s=plan_s,
                apply_s=apply_s,
            )
            cutoff = started_at - window()
            PassRecord.objects.filter(pool_id=pool_id, started_at__lt=cutoff).delete()
        return record
    except Exception:
        logger.exception("pool %s: could not record the scheduling pass", pool_id)
        return None


def sample_capacity(*, now=None) -> int:
    """A capacity sample of every pool; returns how many succeeded. A pool whose totals cannot
    be computed gets a sample row with its `error`, and the others go on."""
    now = now or timezone.now()
    taken = 0
    for pool in ComputePool.objects.order_by("pk"):
        try:
            with transaction.atomic():
                totals = pool_capacity(pool)["totals"]
                CapacitySample.objects.create(pool=pool, at=now, totals=totals)
            taken += 1
        except Exception as error:
            logger.exception("pool %s: capacity sample failed", pool.slug)
            CapacitySample.objects.create(pool=pool, at=now, error=error_summary(error))
    CapacitySample.objects.filter(at__lt=now - window()).delete()
    return taken


# --- reads -----------------------------------------------------------------------------------


def _buckets(hours: int, now):
    """The bucket function and the first bucket of a window of `hours` ending at `now`."""
    trunc = WINDOWS[hours]
    step = timedelta(minutes=1) if trunc is TruncMinute else timedelta(hours=1)
    count = 60 if trunc is TruncMinute else 24
    last = timezone.localtime(now).replace(second=0, microsecond=0)  # as the database truncates
    if trunc is TruncHour:
        last = last.replace(minute=0)
    return trunc, [last - step * (count - 1 - i) for i in range(count)]


def _filled(rows: dict, slots: list, empty: dict) -> list[dict]:
    """One entry per bucket, empty buckets included (a quiet minute is a point too)."""
    return [{"at": slot, **rows.get(slot, empty)} for slot in slots]


def pass_series(pool, hours: int = 1, now=None) -> list[dict]:
    """Per bucket: passes, mean and max duration, placements per pass, conflicts, errors."""
    now = now or timezone.now()
    trunc, slots = _buckets(hours, now)
    rows = (
        PassRecord.objects.filter(pool=pool, started_at__gte=slots[0])
        .annotate(bucket=trunc("started_at"))
        .values("bucket")
        .annotate(
            passes=Count("id"),
            mean_s=Avg("duration_s"),
            max_s=Max("duration_s"),
            placed=Sum("placed"),
            considered=Sum("considered"),
            conflicts=Sum("conflicts"),
            errors=Sum("errors"),
        )
    )
    by_bucket = {}
    for row in rows:
        bucket = row.pop("bucket")
        row["per_pass"] = row["placed"] / row["passes"] if row["passes"] else 0.0
        by_bucket[bucket] = row
    empty = dict.fromkeys(
        ("passes", "mean_s", "max_s", "placed", "considered", "conflicts", "errors", "per_pass"), 0
    )
    return _filled(by_bucket, slots, empty)


def phase_means(pool, hours: int = 1, now=None) -> dict:
    """The mean seconds of the batch plan's phases (`snapshot_s`, `plan_s`, `apply_s`) over
    the window's passes; None where no pass of the window was a batch plan."""
    now = now or timezone.now()
    _, slots = _buckets(hours, now)
    passes = PassRecord.objects.filter(pool=pool, started_at__gte=slots[0])
    return passes.aggregate(**{phase: Avg(phase) for phase in PHASES})


def expiry_series(pool, hours: int = 1, now=None) -> list[dict]:
    """Per bucket: leases of the pool that expired (not committed, or not renewed in time)."""
    now = now or timezone.now()
    trunc, slots = _buckets(hours, now)
    rows = (
        LeaseEvent.objects.filter(
            lease__pool=pool, reason__in=EXPIRY_REASONS, at__gte=slots[0], at__lte=now
        )
        .annotate(bucket=trunc("at"))
        .values("bucket")
        .annotate(expired=Count("id"))
    )
    return _filled({r["bucket"]: {"expired": r["expired"]} for r in rows}, slots, {"expired": 0})


def utilisation(pool, hours: int = 1, now=None) -> dict:
    """Per dimension over the window: requested (reserved) and measured (used) as a percent
    of allocatable at each sample, with their peak and average; samples that failed are
    left out (their count is in `failed`)."""
    now = now or timezone.now()
    samples = list(
        CapacitySample.objects.filter(pool=pool, at__gte=now - timedelta(hours=hours), at__lte=now)
        .order_by("at")
        .values("at", "totals", "error")
    )
    good = [s for s in samples if not s["error"]]
    dims = {}
    for dim in DIMENSIONS:
        requested, measured = [], []
        for sample in good:
            allocatable = sample["totals"].get("allocatable", {}).get(dim, 0)
            if allocatable:
                requested.append(100 * sample["totals"]["reserved"].get(dim, 0) / allocatable)
                measured.append(100 * sample["totals"]["used"].get(dim, 0) / allocatable)
        if requested:
            dims[dim] = {
                "requested": requested,
                "measured": measured,
                "requested_peak": max(requested),
                "requested_average": sum(requested) / len(requested),
                "measured_peak": max(measured),
                "measured_average": sum(measured) / len(measured),
            }
    return {"samples": len(good), "failed": len(samples) - len(good), "dimensions": dims}
