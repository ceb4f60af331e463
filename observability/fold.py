"""Counters and histograms folded from the event log (docs/observability.md, "Metrics").

Every state change already writes an event with a reason code; the metrics of allocation and
execution are those events counted. A periodic task (`observability.fold`, every few seconds)
reads the rows written since its last run — job events, lease events, pass records — and adds
what they mean to `MetricSeries` rows in the same transaction that moves its cursor, so:

* nothing on the hot paths (the pass's apply, the lease API, the agent's reports) pays for a
  metric, and no path that writes an event can forget one;
* each event counts exactly once, whichever worker folds it, and counts survive restarts;
* every server's /metrics reads the same figures (no per-process state to merge).

Event ids are handed out before their transaction commits, so a row may appear below the high
water after it was read: the ids skipped are kept as gaps and looked for again until GAP_TTL_S.
One source's failure is recorded on its cursor and the others go on.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from jobs.choices import TERMINAL, JobState
from jobs.models import JobEvent
from leases.choices import HOLDING
from leases.models import LeaseEvent
from pools.models import ComputePool, Tenant
from pools.reasons import Reason
from pools.statemachine import error_summary
from scheduling.health import EXPIRY_REASONS
from scheduling.models import PassRecord

from . import catalogue as m
from .models import FoldCursor, MetricSeries

logger = logging.getLogger(__name__)

BATCH = 10_000  # rows of one source per fold: a backlog drains over a few runs
GAP_TTL_S = 600.0  # longer than any transaction that writes events stays open
MAX_GAPS = 10_000

# Job events that start a step of an attempt (looked up before an event that ends one)
STEP_REASONS = (
    Reason.IMAGE_PULLING,
    Reason.IMAGE_PULLED,
    Reason.STARTUP_BEGAN,
    Reason.CONTAINER_STARTED,
)
ACTIVE = frozenset(JobState) - TERMINAL - {JobState.QUEUED}


class Tally:
    """The increments of one fold, keyed by series (metric name, canonical labels)."""

    def __init__(self, pools: dict[int, str], tenants: Callable[[int], str]):
        self.added: dict[tuple[str, str], float] = defaultdict(float)
        self.pool = lambda pool_id: pools.get(pool_id, str(pool_id))
        self.tenant = tenants

    def inc(self, metric: m.Folded, labels: dict, by: float = 1.0) -> None:
        self.added[(metric.name, _labels(labels))] += by

    def observe(self, metric: m.Folded, labels: dict, value: float) -> None:
        value = max(0.0, value)
        for bound in metric.buckets:
            if value <= bound:
                self.added[(metric.name + "_bucket", _labels({**labels, "le": _le(bound)}))] += 1
        self.added[(metric.name + "_bucket", _labels({**labels, "le": "+Inf"}))] += 1
        self.added[(metric.name + "_sum", _labels(labels))] += value
        self.added[(metric.name + "_count", _labels(labels))] += 1


def _labels(labels: dict) -> str:
    return orjson.dumps(labels, option=orjson.OPT_SORT_KEYS).decode()


def _le(bound: float) -> str:
    return repr(float(bound))  # as prometheus_client writes a bucket's bound: "0.5", "60.0"


def tenant_labels() -> Callable[[int], str]:
    """A tenant's label: its slug for the first METRICS_TENANT_LABELS tenants (the oldest:
    the set never churns), `other` for the rest, so many tenants never make many series."""
    named = dict(
        Tenant.objects.order_by("pk").values_list("pk", "slug")[: settings.METRICS_TENANT_LABELS]
    )
    return lambda tenant_id: named.get(tenant_id, "other")


# --- the sources -----------------------------------------------------------------------------


def fold_job_events(rows: list[dict], tally: Tally) -> None:
    """Queue waits, startup phases, runtimes, exits, retries and preemptions."""
    history = _job_history({row["job_id"] for row in rows}, max(row["at"] for row in rows))
    for event in rows:
        earlier = [e for e in history[event["job_id"]] if e["id"] < event["id"]]
        pool = tally.pool(event["pool_id"])
        to_state, from_state = event["to_state"], event["from_state"]
        if to_state == JobState.LEASED and from_state == JobState.QUEUED:
            queued = _latest(earlier, "to_state", JobState.QUEUED)
            if queued is not None:
                labels = {"pool": pool, "tenant": tally.tenant(event["tenant_id"])}
                tally.observe(m.QUEUE_WAIT, labels, _seconds(queued, event))
        else:
            _startup_step(event, _this_attempt(earlier), pool, tally)
        if from_state in ACTIVE and (to_state in TERMINAL or to_state == JobState.QUEUED):
            _attempt_ended(event, earlier, pool, tally)


def _startup_step(event: dict, attempt: list[dict], pool: str, tally: Tally) -> None:
    """The image check: the agent's measured `pull_seconds` (`image_pulled`), else from
    `image_pulling` to `startup_began`; the container's start: `startup_began` to
    `container_started`."""
    reason, seconds = event["reason"], None
    if reason == Reason.IMAGE_PULLED:
        phase, seconds = "image_pull", _data(event).get("pull_seconds")
    elif reason == Reason.STARTUP_BEGAN and not _latest(attempt, "reason", Reason.IMAGE_PULLED):
        phase, began = "image_pull", _latest(attempt, "reason", Reason.IMAGE_PULLING)
        seconds = _seconds(began, event) if began else None
    elif reason == Reason.CONTAINER_STARTED:
        phase, began = "container_start", _latest(attempt, "reason", Reason.STARTUP_BEGAN)
        seconds = _seconds(began, event) if began else None
    if isinstance(seconds, int | float):
        tally.observe(m.STARTUP, {"pool": pool, "phase": phase}, float(seconds))


def _attempt_ended(event: dict, earlier: list[dict], pool: str, tally: Tally) -> None:
    reason, to_state = event["reason"], event["to_state"]
    failure = _data(event).get("failure") if to_state == JobState.QUEUED else None
    failure = failure if isinstance(failure, str) else None
    tally.inc(m.EXITS, {"pool": pool, "reason": failure or reason})
    # queued again by its retry policy after a started attempt failed (`retry_scheduled`, or a
    # `capacity_vanished` under a started job); a lease lost before start is no retry
    if failure and event["from_state"] != JobState.LEASED:
        tally.inc(m.RETRIES, {"pool": pool})
    if reason == Reason.PREEMPTED:
        tally.inc(m.PREEMPTIONS, {"pool": pool})
    started = _latest(_this_attempt(earlier), "reason", Reason.CONTAINER_STARTED)
    if started is not None:
        outcome = "requeued" if to_state == JobState.QUEUED else to_state
        tally.observe(m.RUNTIME, {"pool": pool, "outcome": outcome}, _seconds(started, event))


def _job_history(job_ids: set[int], until) -> dict[int, list[dict]]:
    """The events of these jobs that begin a wait or a step, oldest first, per job."""
    history = defaultdict(list)
    rows = (
        JobEvent.objects.filter(job_id__in=job_ids, at__lte=until)
        .filter(Q(reason__in=STEP_REASONS) | Q(to_state__in=(JobState.QUEUED, JobState.LEASED)))
        .order_by("id")
        .values("id", "job_id", "reason", "from_state", "to_state", "at")
    )
    for row in rows.iterator(chunk_size=5000):
        history[row["job_id"]].append(row)
    return history


def _data(event: dict) -> dict:
    """An event's data as a dict: a row whose data is anything else must not stop the fold
    (its cursor would never move past it)."""
    return event["data"] if isinstance(event["data"], dict) else {}


def _this_attempt(earlier: list[dict]) -> list[dict]:
    """The events since the job's latest lease (its current attempt)."""
    for i in range(len(earlier) - 1, -1, -1):
        if earlier[i]["to_state"] == JobState.LEASED and earlier[i]["from_state"] != "leased":
            return earlier[i:]
    return earlier


def _latest(events: list[dict], field: str, value: str) -> dict | None:
    """The newest of the events whose `field` is `value`."""
    return next((e for e in reversed(events) if e[field] == value), None)


def _seconds(first: dict, then: dict) -> float:
    return (then["at"] - first["at"]).total_seconds()


def fold_lease_events(rows: list[dict], tally: Tally) -> None:
    """Expiries, and the pressure of each lease that ended after running."""
    for event in rows:
        pool = tally.pool(event["lease__pool_id"])
        if event["reason"] in EXPIRY_REASONS:
            tally.inc(m.LEASE_EXPIRATIONS, {"pool": pool, "from_state": event["from_state"]})
        ended = event["from_state"] in HOLDING and event["to_state"] not in HOLDING
        if ended and event["lease__usage_samples"]:
            average, peak = event["lease__usage_average"] or {}, event["lease__usage_peak"] or {}
            for resource, used, limit in (
                ("cpu", average.get("cpu_millicores"), event["lease__cpu_millicores"]),
                ("memory", peak.get("memory_mib"), event["lease__memory_mib"]),
            ):
                if used is not None and limit:
                    tally.observe(m.PRESSURE, {"pool": pool, "resource": resource}, used / limit)


def fold_passes(rows: list[dict], tally: Tally) -> None:
    """Each pass's duration and placements; what became of the jobs it considered."""
    for record in rows:
        pool = tally.pool(record["pool_id"])
        placed, conflicts, errors = record["placed"], record["conflicts"], record["errors"]
        tally.observe(m.PASS_DURATION, {"pool": pool}, record["duration_s"])
        tally.observe(m.PLACEMENTS_PER_PASS, {"pool": pool}, placed)
        if conflicts:
            tally.inc(m.PLAN_CONFLICTS, {"pool": pool}, conflicts)
        left = max(0, record["considered"] - placed - conflicts - errors)
        for result, count in (("placed", placed), ("unschedulable", left), ("error", errors)):
            if count:
                tally.inc(m.SCHEDULING_ATTEMPTS, {"pool": pool, "result": result}, count)


EVENT_FIELDS = ("id", "from_state", "to_state", "reason", "at")
SOURCES = {
    "job_events": (
        JobEvent,
        (*EVENT_FIELDS, "data", "job_id", "job__pool_id", "job__tenant_id"),
        fold_job_events,
    ),
    "lease_events": (
        LeaseEvent,
        (
            *EVENT_FIELDS,
            "lease__pool_id",
            "lease__cpu_millicores",
            "lease__memory_mib",
            "lease__usage_samples",
            "lease__usage_average",
            "lease__usage_peak",
        ),
        fold_lease_events,
    ),
    "passes": (
        PassRecord,
        ("id", "pool_id", "duration_s", "considered", "placed", "conflicts", "errors"),
        fold_passes,
    ),
}


# --- the fold --------------------------------------------------------------------------------


def fold(now=None) -> dict[str, int]:
    """Fold every source's new rows; returns how many rows of each were folded (-1: failed,
    recorded on its cursor; a source another worker is folding right now is skipped)."""
    now = now or timezone.now()
    pools = dict(ComputePool.objects.values_list("pk", "slug"))
    tenants = tenant_labels()
    folded = {}
    for source, (model, fields, folder) in SOURCES.items():
        FoldCursor.objects.get_or_create(source=source)
        try:
            with transaction.atomic():
                folded[source] = _fold_source(source, model, fields, folder, Tally(pools, tenants))
        except Exception as error:
            logger.exception("metrics: folding %s failed", source)
            FoldCursor.objects.filter(source=source).update(error=error_summary(error))
            folded[source] = -1
    return folded


def _fold_source(source, model, fields, folder, tally: Tally) -> int:
    cursor = FoldCursor.objects.select_for_update(skip_locked=True).filter(source=source).first()
    if cursor is None:
        return 0  # another worker folds it now
    now = time.time()
    gaps = {int(row_id): since for row_id, since in (cursor.gaps or {}).items()}
    rows = [
        _normalised(row)
        for row in model.objects.filter(Q(pk__gt=cursor.high_water) | Q(pk__in=list(gaps)))
        .order_by("pk")
        .values(*fields)[:BATCH]
    ]
    if rows:
        folder(rows, tally)
        _add(tally.added.items())
    seen = {row["id"] for row in rows}
    high_water = max([cursor.high_water, *seen])
    gaps = {i: since for i, since in gaps.items() if i not in seen and now - since < GAP_TTL_S}
    gaps.update({i: now for i in range(cursor.high_water + 1, high_water) if i not in seen})
    if len(gaps) > MAX_GAPS:  # a burst of rollbacks: keep the newest
        gaps = dict(sorted(gaps.items())[-MAX_GAPS:])
    cursor.high_water, cursor.gaps = high_water, {str(i): s for i, s in gaps.items()}
    cursor.folded_at, cursor.error = timezone.now(), ""
    cursor.save()
    return len(rows)


def _normalised(row: dict) -> dict:
    """The same keys whatever the source's path to its pool."""
    if "job__pool_id" in row:
        row["pool_id"], row["tenant_id"] = row.pop("job__pool_id"), row.pop("job__tenant_id")
    return row


def _add(increments: Iterable[tuple[tuple[str, str], float]]) -> None:
    """Add to each series in one statement (PostgreSQL and SQLite alike)."""
    table = MetricSeries._meta.db_table
    rows = [(name, labels, value) for (name, labels), value in increments]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            cursor.execute(
                f"INSERT INTO {table} (name, labels, value) VALUES "
                + ", ".join(["(%s, %s, %s)"] * len(chunk))
                + f" ON CONFLICT (name, labels) DO UPDATE SET value = {table}.value"
                " + excluded.value",
                [value for row in chunk for value in row],
            )
