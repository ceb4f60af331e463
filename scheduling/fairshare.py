"""Fair share on the database: the rows the core's queue policy (`placement.queue`) needs.

* `standings(pool_id, tenant_ids, now)` — each tenant's standing in a pool: what its leases
  hold now (and the part held by long jobs), its decayed past use, its weight.
* `charge(pool_id, now)` — adds to each tenant's `TenantUsage` what its leases held since its
  last charge, decaying what was there by the pool's half-life.
* `pool_queue_policy`, `pool_capacity`, `queued_jobs` — the pool's knobs, size and queue as
  the core's types.

Units (docs/scheduler.md "Queue policy"): `TenantUsage` keeps decayed resource-seconds;
`standings` divides them by the mean life (half-life / ln 2), which turns them into "what the
tenant held, on average, lately" in the units of `held` (millicores, MiB, GPUs), so its share
of the pool's capacity compares with the share of what it holds now.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from leases.choices import HOLDING
from leases.models import Lease, gpu_share
from nodes.choices import SCHEDULABLE, Reachability
from nodes.models import GpuDevice, Node
from placement.queue import (
    QueuedJob,
    QueuePolicy,
    TenantStanding,
    accrued,
    decay,
    usage_as_held,
)
from pools.knobs import knobs_for
from pools.models import Tenant
from pools.statemachine import error_summary
from scheduling.models import TenantUsage

logger = logging.getLogger(__name__)


def pool_queue_policy(pool_id: int) -> QueuePolicy:
    """The queue knobs of the pool's current policy version (a stored value its check refuses,
    from an older version, gives that knob's default: pools/knobs.py)."""
    return knobs_for(pool_id).queue_policy()


def pool_capacity(pool_id: int) -> tuple[float, float, float]:
    """What the pool's schedulable, reachable nodes offer: millicores, MiB, healthy GPUs."""
    nodes = Node.objects.filter(
        pool_id=pool_id, state__in=SCHEDULABLE, reachability=Reachability.REACHABLE
    )
    totals = nodes.aggregate(
        cpu=Sum("cpu_millicores_allocatable"), memory=Sum("memory_mib_allocatable")
    )
    gpus = GpuDevice.objects.filter(node__in=nodes, healthy=True).count()
    return (float(totals["cpu"] or 0), float(totals["memory"] or 0), float(gpus))


def request_gpus(request: dict) -> float:
    """The GPUs a request asks for, counted as `leases.models.gpu_share` counts what a lease
    holds: a device 1, a time-slice or MPS share its milli / 1000, a MIG slice g/7."""
    sharing = request.get("gpu_sharing_class") or "none"
    count = int(request.get("gpu_count") or 0)
    if sharing == "none" or count <= 0:
        return 0.0
    if sharing == "mig":  # as the slice's allocation will count (an unknown profile: 1/7)
        allocation = {"mig_profile": request.get("mig_profile") or "", "mig_slots": 1}
        return count * gpu_share([allocation])
    if sharing in ("timeslice", "mps") and request.get("gpu_milli"):
        return count * int(request["gpu_milli"]) / 1000
    return float(count)


def request_demand(request: dict) -> tuple[float, float, float]:
    return (
        float(request.get("cpu_millicores_min") or 0),
        float(request.get("memory_mib_min") or 0),
        request_gpus(request),
    )


QUEUED_FIELDS = (
    "id",
    "tenant_id",
    "priority_class__value",
    "priority_class__max_wait_s",
    "state_changed_at",
    "resources",
    "max_runtime_s",
)


def queued_job(row: tuple, now) -> QueuedJob:
    """A queued job's row (QUEUED_FIELDS) as the core's QueuedJob (waited since last queued)."""
    job_id, tenant_id, value, max_wait_s, queued_at, resources, max_runtime_s = row
    return QueuedJob(
        id=job_id,
        tenant=tenant_id,
        priority=value or 0,
        waited_s=max((now - queued_at).total_seconds(), 0.0),
        demand=request_demand(resources if isinstance(resources, dict) else {}),
        max_runtime_s=max_runtime_s,
        max_wait_s=max_wait_s,
    )


def queued_jobs(pool_id: int, now=None) -> list[QueuedJob]:
    """The pool's queued jobs as the core's QueuedJob."""
    now = now or timezone.now()
    rows = Job.objects.filter(pool_id=pool_id, state=JobState.QUEUED).values_list(*QUEUED_FIELDS)
    return [queued_job(row, now) for row in rows]


def holding_leases(pool_id: int):
    """The pool's leases that hold node capacity (backfills hold none of their own)."""
    return Lease.objects.filter(pool_id=pool_id, state__in=HOLDING, backfill_of__isnull=True)


def tenants_leases(pool_id: int):
    """The pool's holding leases as its tenants' shares count them: backfills too (one borrows
    a reservation's node capacity, but it is its own tenant's work)."""
    return Lease.objects.filter(pool_id=pool_id, state__in=HOLDING)


def standings(
    pool_id: int, tenant_ids, now=None, *, policy: QueuePolicy | None = None
) -> dict[int, TenantStanding]:
    """tenant id → its standing in the pool: held CPU, memory and GPUs (`gpu_share`: a quarter
    time-slice is 0.25), the part of it held by long jobs (leases without a job count as long),
    its decayed past use as held (see the module's units) and its fair-share weight."""
    now = now or timezone.now()
    policy = policy or pool_queue_policy(pool_id)
    tenant_ids = set(tenant_ids)
    held = {tenant_id: [0.0, 0.0, 0.0] for tenant_id in tenant_ids}
    held_long = {tenant_id: [0.0, 0.0, 0.0] for tenant_id in tenant_ids}
    rows = (
        tenants_leases(pool_id)
        .filter(tenant_id__in=tenant_ids)
        .values_list(
            "tenant_id", "cpu_millicores", "memory_mib", "gpu_allocations", "job__max_runtime_s"
        )
    )
    for tenant_id, cpu, memory, allocations, max_runtime_s in rows:
        long = not policy.is_short(max_runtime_s)
        for r, amount in enumerate((cpu, memory, gpu_share(allocations))):
            held[tenant_id][r] += amount
            if long:
                held_long[tenant_id][r] += amount
    half_life = policy.fair_share_half_life_s
    usage = {
        row.tenant_id: usage_as_held(
            [decay(u, (now - row.updated_at).total_seconds(), half_life) for u in row.usage_s],
            half_life,
        )
        for row in TenantUsage.objects.filter(pool_id=pool_id, tenant_id__in=tenant_ids)
    }
    weights = dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "fair_share_weight"))
    return {
        tenant_id: TenantStanding(
            tenant_id,
            weights.get(tenant_id, 1.0),
            tuple(held[tenant_id]),
            usage.get(tenant_id, (0.0, 0.0, 0.0)),
            tuple(held_long[tenant_id]),
        )
        for tenant_id in tenant_ids
    }


def charge(pool_id: int, now=None) -> int:
    """Bring every tenant's usage of the pool up to `now`; returns how many rows it charged.

    Each row is charged in its own transaction under its row lock: decayed by the time since
    its `updated_at`, plus what the tenant's leases held in (updated_at, now] (from their
    `created_at` to their `ended_at`, or now while holding), each second decayed by its age.
    A row already charged up to `now` or later is left alone, so two workers charging at once
    never count the same second twice. A tenant's memory starts at its first charge with a
    holding lease. A row that fails is rolled back and its `charge_error` says why; the others
    go on.
    """
    now = now or timezone.now()
    half_life = pool_queue_policy(pool_id).fair_share_half_life_s
    holders = set(tenants_leases(pool_id).values_list("tenant_id", flat=True).distinct())
    TenantUsage.objects.bulk_create(
        [TenantUsage(tenant_id=t, pool_id=pool_id, updated_at=now) for t in holders],
        ignore_conflicts=True,
    )
    rows = dict(TenantUsage.objects.filter(pool_id=pool_id).values_list("tenant_id", "updated_at"))
    # every lease that held something after the oldest row's last charge, in one query; each
    # row then counts only the part after its own (locked, never earlier) `updated_at`
    since = min(rows.values(), default=now)
    leases = defaultdict(list)
    lease_rows = (
        Lease.objects.filter(pool_id=pool_id, created_at__lt=now)  # backfills count too
        .filter(Q(state__in=HOLDING) | Q(ended_at__gt=since))
        .values_list(
            "tenant_id", "cpu_millicores", "memory_mib", "gpu_allocations", "created_at", "ended_at"
        )
    )
    for tenant_id, *lease in lease_rows:
        leases[tenant_id].append(lease)
    charged = 0
    for tenant_id in sorted(rows):
        try:
            with transaction.atomic():
                charged += _charge_row(pool_id, tenant_id, leases[tenant_id], now, half_life)
        except Exception as error:
            logger.exception("pool %s tenant %s: charging usage failed", pool_id, tenant_id)
            TenantUsage.objects.filter(pool_id=pool_id, tenant_id=tenant_id).update(
                charge_error=error_summary(error)
            )
    return charged


def _charge_row(pool_id: int, tenant_id: int, leases: list, now, half_life: float) -> bool:
    row = TenantUsage.objects.select_for_update().get(pool_id=pool_id, tenant_id=tenant_id)
    if row.updated_at >= now:
        return False  # charged up to here (or later) by another worker
    elapsed = (now - row.updated_at).total_seconds()
    usage = [decay(u, elapsed, half_life) for u in row.usage_s]
    for cpu, memory, allocations, created_at, ended_at in leases:
        start, end = max(created_at, row.updated_at), min(ended_at or now, now)
        if end <= start:
            continue
        since_s, until_s = (now - start).total_seconds(), (now - end).total_seconds()
        for r, amount in enumerate((cpu, memory, gpu_share(allocations))):
            usage[r] += accrued(amount, since_s, until_s, half_life)
    row.cpu_millicore_s, row.memory_mib_s, row.gpu_s = usage
    row.updated_at, row.charge_error = now, ""
    row.save(
        update_fields=["cpu_millicore_s", "memory_mib_s", "gpu_s", "updated_at", "charge_error"]
    )
    return True
