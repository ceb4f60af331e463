"""Reads for the queue pages: a pool's queue in the scheduler's own order, a tenant's view of
it, the pool's health conditions and its queue depth over time.

* `pool_queue(pool)` — every queued job of the pool, first the ones the next pass considers
  (its window: `pass_steps.window.queued_jobs`, with the members of their gangs), in the order
  that pass would try them (`pass_steps.admission.queue_order` over the same snapshot capacity:
  the pass's own code, not a second ordering), then the others (a retry's backoff, a tenant at
  its quota, beyond the window), ordered the same way among themselves, each with why. The jobs
  the queue's gate holds capacity for are those whose last pass marked them `head_of_line`.
* `tenant_queue(pool, actor)` — the tenant's own jobs of that queue with their positions; other
  tenants' work only as a count per priority class.
* `pool_conditions(pool)` — the scheduler health conditions (scheduling/conditions.py) now,
  and since when idle capacity has sat beside a backlog (over capacity samples).
* `queue_depth(pool, hours)` — queued jobs at each capacity sample.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

from django.conf import settings
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from leases import snapshot as snap
from leases.services import tenants_at_quota
from placement.queue import MAX_WAIT_URGENT, queue_class
from pools.models import ComputePool

from . import conditions, selectors
from .fairshare import QUEUED_FIELDS, queued_job
from .models import CapacitySample
from .pass_steps.admission import queue_order, schedulable_capacity
from .pass_steps.plan import HEAD_OF_LINE
from .pass_steps.window import gang_mates, queued_jobs

EXTRA_FIELDS = ("name", "pending_reason", "not_before", "priority_class__name", "tenant__slug")
NO_CLASS = "no class"


def human_duration(seconds: float) -> str:
    """75 → "1 min 15 s", 4000 → "1 h 6 min", 90000 → "1 d 1 h"."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def next_window(pool_id: int, now) -> list[int]:
    """The job ids the next pass of the pool considers: its window (round-robin over tenants,
    tenants at their quota and retries in their backoff left out) and the members of its gangs
    that the window left out."""
    at_quota = set(tenants_at_quota(pool_id=pool_id))
    limit = settings.SCHEDULER_PASS_MAX_JOBS
    ids = [pk for pk, _, _ in queued_jobs(pool_id=pool_id, limit=limit, skip=at_quota, now=now)]
    rows = Job.objects.filter(pk__in=ids).values_list("pk", "tenant_id", "gang")
    jobs = [SimpleNamespace(pk=pk, tenant_id=t, gang=g) for pk, t, g in rows]
    return ids + gang_mates(pool_id, jobs)


def pool_queue(pool, now=None) -> dict:
    """The pool's queue in the scheduler's order (see the module). Each entry: position, job
    id and name, tenant (id, slug), priority class and value, aging bonus, urgent, age,
    queue class, reason (code, message), head_of_line, considered (by the next pass) or why
    not."""
    now = now or timezone.now()
    rows = Job.objects.filter(pool=pool, state=JobState.QUEUED).values_list(
        *QUEUED_FIELDS, *EXTRA_FIELDS
    )
    extra, queued = {}, {}
    for row in rows:
        queued[row[0]] = queued_job(row[: len(QUEUED_FIELDS)], now)
        extra[row[0]] = dict(zip(EXTRA_FIELDS, row[len(QUEUED_FIELDS) :], strict=True))
    window = [pk for pk in dict.fromkeys(next_window(pool.pk, now)) if pk in queued]
    capacity = schedulable_capacity(snap.pool_snapshot(pool.pk).nodes)
    first, _, policy = queue_order(pool.pk, [queued[pk] for pk in window], capacity, now)
    considered = set(window)
    rest, _, _ = queue_order(
        pool.pk, [q for pk, q in queued.items() if pk not in considered], capacity, now
    )
    at_quota = {t for t, _ in tenants_at_quota(pool_id=pool.pk)}
    entries = []
    for position, q in enumerate(first + rest, start=1):
        more = extra[q.id]
        reason = more["pending_reason"] or {}
        entry = {
            "position": position,
            "id": q.id,
            "name": more["name"],
            "tenant_id": q.tenant,
            "tenant": more["tenant__slug"],
            "priority_class": more["priority_class__name"] or NO_CLASS,
            "priority": q.priority,
            "aging": min(policy.aging_max_bonus, int(q.waited_s // policy.aging_step_s)),
            "urgent": q.why == MAX_WAIT_URGENT,
            "age_s": q.waited_s,
            "age": human_duration(q.waited_s),
            "queue_class": queue_class(q, policy),
            "code": reason.get("code") or conditions.NOT_YET_CONSIDERED,
            "message": reason.get("message", ""),
            "head_of_line": bool(reason.get(HEAD_OF_LINE)),
            "considered": q.id in considered,
            "not_considered": "",
        }
        if not entry["considered"]:
            not_before = more["not_before"]
            if not_before is not None and not_before > now:
                entry["not_considered"] = f"retry backoff until {not_before:%H:%M:%S}"
            elif q.tenant in at_quota:
                entry["not_considered"] = "its tenant is at its quota"
            else:
                entry["not_considered"] = "beyond the pass's window (SCHEDULER_PASS_MAX_JOBS)"
        entries.append(entry)
    return {
        "jobs": entries,
        "considered": len(first),
        "head": [e for e in entries if e["head_of_line"]],
        "capacity": capacity,
    }


def tenant_queue(pool, actor, now=None) -> dict:
    """The actor's tenants' queued jobs of the pool in the queue's order (their positions in the
    whole queue), and other tenants' queued work only as a count per priority class; whether
    the gate holds capacity for one of the actor's jobs or for another tenant's."""
    queue = pool_queue(pool, now)
    mine = set(actor.tenant_ids)
    own, others = [], {}
    for entry in queue["jobs"]:
        if entry["tenant_id"] in mine:
            own.append(entry)
        else:
            others[entry["priority_class"]] = others.get(entry["priority_class"], 0) + 1
    return {
        "jobs": own,
        "others": dict(sorted(others.items())),
        "others_total": sum(others.values()),
        "total": len(queue["jobs"]),
        "head_own": [e for e in own if e["head_of_line"]],
        "head_other": any(e["head_of_line"] and e["tenant_id"] not in mine for e in queue["jobs"]),
    }


def queue_depth(pool, hours: int = 1, now=None) -> list[dict]:
    """Queued jobs of the pool at each capacity sample of the last `hours` (oldest first):
    {"at", "queued", "backlog"} — backlog: those waiting for reasons capacity could cure."""
    now = now or timezone.now()
    samples = CapacitySample.objects.filter(
        pool=pool, at__gte=now - timedelta(hours=hours), at__lte=now
    ).order_by("at")
    return [
        {
            "at": at,
            "queued": sum(queued.values()),
            "backlog": conditions.IDLE_WITH_BACKLOG.backlog(conditions.Figures("", {}, queued)),
        }
        for at, queued in samples.values_list("at", "queued")
    ]


def pool_conditions(pool, actor, now=None) -> dict:
    """The pool's health conditions now (scheduling/conditions.py over the figures /metrics
    exposes) and, for idle capacity with backlog, since when it has held (capacity samples of
    the health window) and whether it has held long enough for its alert to fire."""
    now = now or timezone.now()
    breakdown = selectors.capacity_breakdown(actor, [pool])
    capacity = breakdown["pool"].get(pool.slug, {})
    figures = conditions.pool_figures(pool, capacity, now)
    idle = conditions.IDLE_WITH_BACKLOG.evaluate(figures)
    samples = list(
        CapacitySample.objects.filter(pool=pool, at__gte=now - timedelta(hours=2), at__lte=now)
        .order_by("at")
        .values("at", "totals", "queued", "error")
    )
    since = conditions.held_since(samples) if idle else None
    since = since or (now if idle else None)
    return {
        "figures": figures,
        "idle": idle,
        "idle_since": since,
        "idle_for": human_duration((now - since).total_seconds()) if since else "",
        "idle_firing": conditions.firing_for(since, now, conditions.IDLE_WITH_BACKLOG),
        "idle_condition": conditions.IDLE_WITH_BACKLOG,
        "late": conditions.OLDEST_PENDING.evaluate(figures),
        "oldest": [
            {
                "priority_class": c,
                "age": human_duration(a),
                "max_wait": human_duration(m) if (m := figures.max_wait.get(c)) else "none",
                "late": m is not None and a > m,
            }
            for c, a in sorted(figures.oldest.items())
        ],
        "max_wait": figures.max_wait,
    }


def record_queue_depth(now) -> int:
    """Each pool's queued jobs by pending reason written onto its capacity sample taken at
    `now` (the sample task calls it right after `health.sample_capacity(now=now)`)."""
    by_pool: dict[int, dict] = {pk: {} for pk in ComputePool.objects.values_list("pk", flat=True)}
    for (pool_id, reason), n in conditions.pending_counts().items():
        by_pool.setdefault(pool_id, {})[reason] = n
    updated = 0
    for pool_id, queued in by_pool.items():
        updated += CapacitySample.objects.filter(pool_id=pool_id, at=now).update(queued=queued)
    return updated
