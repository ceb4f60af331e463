"""Scheduler health and utilisation over time, for the operators' console.

* `record_pass(...)` — the scheduling pass calls it once per pool and pass: how long it took
  (and each phase of the batch plan: snapshot, plan, apply), how many queued jobs it
  considered, placed, lost to a plan conflict, failed on.
* `sample_capacity(now)` — a periodic task (scheduling/tasks.py) stores each pool's
  capacity totals (`leases.selectors.pool_capacity`: allocatable, reserved = requested,
  used = measured by the agents), so utilisation has a history. Sampling was chosen over
  deriving from lease usage records: a lease keeps only its latest, peak and average usage,
  not a time series, and the pool's allocatable changes too (nodes come, drain, go).
* `roll_up(now)` — a periodic task folds each pool's hours of samples and passes into one
  `HealthRollup` row per hour (the current hour too, re-done until it is over), kept
  `ROLLUP_DAYS`; one pool-hour that fails is recorded on its row and the others go on.
* `pass_series`, `phase_means`, `expiry_series`, `utilisation`, `node_usage` — what the pages
  draw over a range (`RANGES`: 15 min, 1 h, 6 h, 24 h from the raw rows, aggregated by the
  database per minute and merged into the range's step; 7 d from the hourly rollups).
  Portable: SQLite serves `make run`.

Utilisation has one denominator, as everywhere in the console: schedulable capacity (ready,
reachable, neither draining nor quarantined). Requested is what leases hold on those nodes
(schedulable − free); measured is what the agents report.

The raw tables keep `SCHEDULER_HEALTH_WINDOW_HOURS`; older rows are pruned as new ones come.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, Max, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from leases.models import LeaseEvent
from leases.selectors import pool_capacity
from pools.models import ComputePool
from pools.reasons import Reason
from pools.statemachine import error_summary

from .models import CapacitySample, HealthRollup, PassRecord

logger = logging.getLogger(__name__)

EXPIRY_REASONS = (Reason.EXPIRED_UNCOMMITTED, Reason.EXPIRED_NOT_RENEWED)
DIMENSIONS = ("cpu_millicores", "memory_mib", "gpu_milli")
PHASES = ("snapshot_s", "plan_s", "apply_s")  # of a batch plan, in a PassRecord
ROLLUP_DAYS = 30
PASS_FIELDS = ("passes", "sum_s", "max_s", "placed", "considered", "conflicts", "errors")
NODE_DIMENSIONS = ("cpu_millicores", "memory_mib", "gpu_milli")  # a node's sample, in order


@dataclass(frozen=True)
class Range:
    """A range the charts offer: its span, the step of its points, and whether it reads the
    hourly rollups (7 d) or the raw rows."""

    key: str
    label: str
    span: timedelta
    step: timedelta
    rollup: bool = False

    @property
    def points(self) -> int:
        return int(self.span / self.step)


RANGES = {
    r.key: r
    for r in (
        Range("15m", "15 min", timedelta(minutes=15), timedelta(minutes=1)),
        Range("1h", "1 h", timedelta(hours=1), timedelta(minutes=1)),
        Range("6h", "6 h", timedelta(hours=6), timedelta(minutes=5)),
        Range("24h", "24 h", timedelta(hours=24), timedelta(minutes=15)),
        Range("7d", "7 d", timedelta(days=7), timedelta(hours=1), rollup=True),
    )
}
DEFAULT_RANGE = "1h"
LEGACY_HOURS = {"1": "1h", "24": "24h"}  # ?hours= of the first pages


def as_range(value) -> Range:
    """A Range from its key ("6h"), a Range, or the hours of the first pages (1, 24)."""
    if isinstance(value, Range):
        return value
    return RANGES[LEGACY_HOURS.get(str(value), str(value))]


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
                capacity = pool_capacity(pool)
                nodes = {
                    row["node"]: {
                        measure: [row[measure].get(d, 0) for d in NODE_DIMENSIONS]
                        for measure in ("allocatable", "reserved", "used")
                    }
                    for row in capacity["nodes"]
                }
                CapacitySample.objects.create(
                    pool=pool, at=now, totals=capacity["totals"], nodes=nodes
                )
            taken += 1
        except Exception as error:
            logger.exception("pool %s: capacity sample failed", pool.slug)
            CapacitySample.objects.create(pool=pool, at=now, error=error_summary(error))
    CapacitySample.objects.filter(at__lt=now - window()).delete()
    return taken


# --- hourly rollups --------------------------------------------------------------------------


def _hour(at) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def sample_percents(totals: dict, dim: str) -> tuple[float, float, float] | None:
    """(requested %, measured %, schedulable) of one sample's totals, over schedulable capacity;
    None where nothing was schedulable. A sample from before `schedulable` was kept reads
    allocatable and reserved."""
    if "schedulable" in totals:
        schedulable = totals["schedulable"].get(dim, 0)
        requested = schedulable - totals.get("free", {}).get(dim, 0)
    else:
        schedulable = totals.get("allocatable", {}).get(dim, 0)
        requested = totals.get("reserved", {}).get(dim, 0)
    if not schedulable:
        return None
    used = totals.get("used", {}).get(dim, 0)
    return 100 * requested / schedulable, 100 * used / schedulable, schedulable


def _capacity_of(totals_list: list[dict]) -> dict:
    """Per dimension: mean and peak of requested and measured %, mean schedulable, samples."""
    result = {}
    for dim in DIMENSIONS:
        rows = [p for p in (sample_percents(t, dim) for t in totals_list) if p is not None]
        if not rows:
            continue
        result[dim] = {
            "requested": sum(r[0] for r in rows) / len(rows),
            "requested_peak": max(r[0] for r in rows),
            "measured": sum(r[1] for r in rows) / len(rows),
            "measured_peak": max(r[1] for r in rows),
            "schedulable": sum(r[2] for r in rows) / len(rows),
            "samples": len(rows),
        }
    return result


def _roll_up_hour(pool, hour, now) -> None:
    end = hour + timedelta(hours=1)
    totals = list(
        CapacitySample.objects.filter(pool=pool, at__gte=hour, at__lt=end, error="").values_list(
            "totals", flat=True
        )
    )
    passes = PassRecord.objects.filter(pool=pool, started_at__gte=hour, started_at__lt=end)
    agg = passes.aggregate(
        passes=Count("id"),
        sum_s=Sum("duration_s"),
        max_s=Max("duration_s"),
        placed=Sum("placed"),
        considered=Sum("considered"),
        conflicts=Sum("conflicts"),
        errors=Sum("errors"),
    )
    HealthRollup.objects.update_or_create(
        pool=pool,
        hour=hour,
        defaults={
            "capacity": _capacity_of(totals),
            "passes": {k: v or 0 for k, v in agg.items()},
            "samples": len(totals),
            "error": "",
            "updated_at": now,
        },
    )


def roll_up(*, now=None) -> int:
    """Fold each pool's hours into `HealthRollup` rows: every hour from its newest rollup (re-done:
    it may have been rolled up before it was over) through the current one, at most the raw
    window back. Each pool-hour in its own transaction: one that fails gets its `error` and the
    others go on. Rollups older than ROLLUP_DAYS are pruned. Returns the hours rolled up."""
    now = now or timezone.now()
    current = _hour(now)
    earliest = _hour(now - window())
    done = 0
    for pool in ComputePool.objects.order_by("pk"):
        newest = HealthRollup.objects.filter(pool=pool, error="").order_by("-hour").first()
        hour = max(earliest, newest.hour) if newest else earliest
        while hour <= current:
            try:
                with transaction.atomic():
                    _roll_up_hour(pool, hour, now)
                done += 1
            except Exception as error:
                logger.exception("pool %s: the hour %s could not be rolled up", pool.slug, hour)
                try:
                    HealthRollup.objects.update_or_create(
                        pool=pool,
                        hour=hour,
                        defaults={"error": error_summary(error), "updated_at": now},
                    )
                except Exception:
                    logger.exception("pool %s: its rollup's error was not recorded", pool.slug)
            hour += timedelta(hours=1)
    HealthRollup.objects.filter(hour__lt=now - timedelta(days=ROLLUP_DAYS)).delete()
    return done


# --- reads -----------------------------------------------------------------------------------


def slots(rng, now) -> list[datetime]:
    """The start of each point of a range ending at `now` (the last holds `now`), in UTC."""
    rng = as_range(rng)
    step = int(rng.step.total_seconds())
    epoch = int(now.timestamp())
    last = datetime.fromtimestamp(epoch - epoch % step, tz=UTC)
    return [last - rng.step * (rng.points - 1 - i) for i in range(rng.points)]


def _slot_of(at, first, step) -> int:
    return int((at - first).total_seconds() // step.total_seconds())


def pass_series(pool, rng=DEFAULT_RANGE, now=None) -> list[dict]:
    """Per point: passes, mean and max duration, placements per pass, conflicts, errors (an
    empty point is a point too: a quiet minute)."""
    rng = as_range(rng)
    now = now or timezone.now()
    points = slots(rng, now)
    merged = [dict.fromkeys(PASS_FIELDS, 0) for _ in points]
    if rng.rollup:
        rows = HealthRollup.objects.filter(pool=pool, hour__gte=points[0], hour__lte=now)
        source = ((r.hour, r.passes) for r in rows)
    else:
        rows = (
            PassRecord.objects.filter(pool=pool, started_at__gte=points[0], started_at__lte=now)
            .annotate(bucket=TruncMinute("started_at"))
            .values("bucket")
            .annotate(
                passes=Count("id"),
                sum_s=Sum("duration_s"),
                max_s=Max("duration_s"),
                placed=Sum("placed"),
                considered=Sum("considered"),
                conflicts=Sum("conflicts"),
                errors=Sum("errors"),
            )
        )
        source = ((r.pop("bucket"), r) for r in rows)
    for at, row in source:
        i = _slot_of(at, points[0], rng.step)
        if not 0 <= i < len(points):
            continue
        into = merged[i]
        for field in PASS_FIELDS:
            value = row.get(field) or 0
            into[field] = max(into[field], value) if field == "max_s" else into[field] + value
    series = []
    for at, row in zip(points, merged, strict=True):
        n = row["passes"]
        series.append(
            {
                "at": at,
                **{k: v for k, v in row.items() if k != "sum_s"},
                "mean_s": row["sum_s"] / n if n else 0,
                "per_pass": row["placed"] / n if n else 0.0,
            }
        )
    return series


def phase_means(pool, rng=DEFAULT_RANGE, now=None) -> dict:
    """The mean seconds of the batch plan's phases (`snapshot_s`, `plan_s`, `apply_s`) over
    the range's passes still kept raw; None where none of them was a batch plan."""
    now = now or timezone.now()
    first = slots(rng, now)[0]
    passes = PassRecord.objects.filter(pool=pool, started_at__gte=first)
    return passes.aggregate(**{phase: Avg(phase) for phase in PHASES})


def expiry_series(pool, rng=DEFAULT_RANGE, now=None) -> list[dict]:
    """Per point: leases of the pool that expired (not committed, or not renewed in time)."""
    rng = as_range(rng)
    now = now or timezone.now()
    points = slots(rng, now)
    counts = [0] * len(points)
    ats = LeaseEvent.objects.filter(
        lease__pool=pool, reason__in=EXPIRY_REASONS, at__gte=points[0], at__lte=now
    ).values_list("at", flat=True)
    for at in ats:
        i = _slot_of(at, points[0], rng.step)
        if 0 <= i < len(points):
            counts[i] += 1
    return [{"at": at, "expired": n} for at, n in zip(points, counts, strict=True)]


def utilisation(pool, rng=DEFAULT_RANGE, now=None) -> dict:
    """Per dimension over the range: requested and measured as a percent of schedulable
    capacity at each point (None: no sample, or nothing schedulable), the mean schedulable
    behind each, and the peak and average over the range. Samples that failed are left out
    (their count is in `failed`)."""
    rng = as_range(rng)
    now = now or timezone.now()
    points = slots(rng, now)
    if rng.rollup:
        rows = list(HealthRollup.objects.filter(pool=pool, hour__gte=points[0], hour__lte=now))
        buckets = [{} for _ in points]
        for row in rows:
            i = _slot_of(row.hour, points[0], rng.step)
            if 0 <= i < len(points):
                buckets[i] = row.capacity
        good = sum(r.samples for r in rows)
        failed = sum(1 for r in rows if r.error)
    else:
        samples = list(
            CapacitySample.objects.filter(pool=pool, at__gte=points[0], at__lte=now)
            .order_by("at")
            .values("at", "totals", "error")
        )
        grouped = [[] for _ in points]
        for sample in samples:
            i = _slot_of(sample["at"], points[0], rng.step)
            if not sample["error"] and 0 <= i < len(points):
                grouped[i].append(sample["totals"])
        buckets = [_capacity_of(g) for g in grouped]
        good = sum(1 for s in samples if not s["error"])
        failed = len(samples) - good
    dims = {}
    for dim in DIMENSIONS:
        have = [b.get(dim) for b in buckets]
        if not any(have):
            continue
        present = [b for b in have if b]
        peak_r = max(b.get("requested_peak", b["requested"]) for b in present)
        peak_m = max(b.get("measured_peak", b["measured"]) for b in present)
        dims[dim] = {
            "points": [
                {
                    "at": at,
                    "requested": b["requested"] if b else None,
                    "measured": b["measured"] if b else None,
                    "schedulable": b["schedulable"] if b else None,
                }
                for at, b in zip(points, have, strict=True)
            ],
            "requested": [b["requested"] for b in present],
            "measured": [b["measured"] for b in present],
            "requested_peak": peak_r,
            "requested_average": sum(b["requested"] for b in present) / len(present),
            "measured_peak": peak_m,
            "measured_average": sum(b["measured"] for b in present) / len(present),
        }
    return {"samples": good, "failed": failed, "dimensions": dims, "range": rng}


def node_usage(node, rng=DEFAULT_RANGE, now=None) -> dict:
    """A node's reserved (by leases) and used (measured by the agent, summed over its committed
    leases) per dimension at each point of a raw range, from its pool's capacity samples (the
    mean of the point's samples; None where the node was not in any), and its allocatable."""
    rng = as_range(rng)
    if rng.rollup:
        raise ValueError("a node's usage is kept raw only")
    now = now or timezone.now()
    points = slots(rng, now)
    grouped = [[] for _ in points]
    rows = CapacitySample.objects.filter(
        pool_id=node.pool_id, at__gte=points[0], at__lte=now, error=""
    ).values_list("at", "nodes")
    for at, nodes in rows:
        mine = (nodes or {}).get(node.name)
        i = _slot_of(at, points[0], rng.step)
        if mine and 0 <= i < len(points):
            grouped[i].append(mine)
    result = {}
    for d, dim in enumerate(NODE_DIMENSIONS):
        series = []
        top = 0
        for at, group in zip(points, grouped, strict=True):
            if not group:
                series.append({"at": at, "reserved": None, "used": None})
                continue
            top = max(top, *(g["allocatable"][d] for g in group))
            series.append(
                {
                    "at": at,
                    "reserved": sum(g["reserved"][d] for g in group) / len(group),
                    "used": sum(g["used"][d] for g in group) / len(group),
                }
            )
        if top:
            result[dim] = {"points": series, "allocatable": top}
    return result
