"""The pass's window: which queued jobs a pass considers, and how it reads them.

`queued_jobs` picks the window (round-robin over tenants, retries past their backoff); the
batch pass then reads the picked jobs as plain rows (`JobRow`, `read_rows`), with the members
of their gangs that the window left out (`gang_mates`): a gang is counted over the whole queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import orjson
from django.db import connection
from django.db.models import F, Q, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from pools.models import PriorityClass

# highest priority first, then oldest
PASS_ORDER = (
    F("priority_class__value").desc(nulls_last=True),
    F("created_at").asc(),
    F("id").asc(),
)


def queued_jobs(*, pool_id=None, limit: int, skip=frozenset(), now=None):
    """The pass's window: (job id, tenant id, pool id) of up to `limit` queued jobs, in
    PASS_ORDER. It is filled round-robin over (tenant, pool) — every tenant's first job, then
    every tenant's second, … — so one tenant's backlog cannot keep another's job out of it.
    `skip`: (tenant id, pool id) pairs left out (at their quota). A retried job waits out its
    backoff (`not_before`)."""
    jobs = Job.objects.filter(state=JobState.QUEUED)
    jobs = jobs.filter(Q(not_before__isnull=True) | Q(not_before__lte=now or timezone.now()))
    if pool_id is not None:
        jobs = jobs.filter(pool_id=pool_id)
    for tenant_id, skipped_pool_id in skip:
        jobs = jobs.exclude(tenant_id=tenant_id, pool_id=skipped_pool_id)
    turn = Window(RowNumber(), partition_by=[F("tenant_id"), F("pool_id")], order_by=PASS_ORDER)
    window = jobs.annotate(turn=turn).order_by("turn", *PASS_ORDER).values("id")[:limit]
    return (
        Job.objects.filter(pk__in=Subquery(window))
        .order_by(*PASS_ORDER)
        .values_list("id", "tenant_id", "pool_id")
    )


@dataclass(slots=True)
class JobRow:
    """A queued job as the batch pass reads it: the columns it needs, no model instance
    (building 20,000 of those costs a second). `key`: its resources as canonical JSON, which
    equal requests share (one core request, one digest for them all)."""

    pk: int
    name: str
    tenant_id: int
    resources: dict
    image: str
    image_platforms: list
    attempts: int
    max_runtime_s: int | None
    checkpointable: bool
    state_changed_at: datetime
    priority: int | None
    max_wait_s: int | None
    key: str = ""
    gang: dict | None = None  # {"name", "size", "topology"}, or {}
    inputs: list | None = None  # [{"url", "name"}] (data locality keys them)
    inputs_key: str = "[]"  # its inputs as text, which equal inputs share


def read_rows(job_ids: list[int]) -> list[JobRow]:
    """The queued jobs among `job_ids`, in one query with a typed array parameter (as
    `apply.lock_queued`). Their JSON comes as text, each distinct text parsed once (a queue
    holds a few shapes many times over): equal requests share one dict, and the text, jsonb's
    canonical form, is their key."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT j.id, j.name, j.tenant_id, j.resources::text, j.image, "
            "j.image_platforms::text, j.attempts, j.max_runtime_s, j.checkpointable, "
            "j.state_changed_at, "
            f"p.value, p.max_wait_s, j.gang::text, j.inputs::text FROM {Job._meta.db_table} j "
            f"LEFT JOIN {PriorityClass._meta.db_table} p ON p.id = j.priority_class_id "
            "WHERE j.id = ANY(CAST(%s AS bigint[])) AND j.state = %s",
            [job_ids, JobState.QUEUED.value],
        )
        rows = cursor.fetchall()
    parsed: dict[str, object] = {}
    jobs = []
    for pk, name, tenant_id, resources, image, platforms, *rest, gang, inputs in rows:
        for text in (resources, platforms, gang, inputs):
            if text not in parsed:
                parsed[text] = orjson.loads(text)
        job = JobRow(pk, name, tenant_id, parsed[resources], image, parsed[platforms], *rest)
        job.key, job.gang = resources, parsed[gang]
        job.inputs, job.inputs_key = parsed[inputs], inputs
        jobs.append(job)
    return jobs


def gang_mates(pool_id: int, jobs: list) -> list[int]:
    """The ids of the queued members outside `jobs` of the gangs `jobs` hold: a gang is
    counted over the whole queue and placed whole."""
    gangs = {(job.tenant_id, job.gang["name"]) for job in jobs if job.gang}
    if not gangs:
        return []
    have = {job.pk for job in jobs}
    mates = Job.objects.filter(
        pool_id=pool_id,
        state=JobState.QUEUED,
        tenant_id__in={tenant_id for tenant_id, _ in gangs},
        gang__name__in={name for _, name in gangs},
    ).values_list("id", "tenant_id", "gang__name")
    return [pk for pk, tenant_id, name in mates if (tenant_id, name) in gangs and pk not in have]
