"""Quotas: a tenant's cap on what it holds in a pool, checked under the quota row's lock in the
reserve's transaction.

Whether a (tenant, pool) HAS a quota row is configuration: cached per process for a few
seconds (a quota created or deleted takes effect within QUOTA_CACHE_SECONDS in other
processes, at once in this one). Usage against an existing quota is always checked under the
quota row's lock (`check_quota`), never cached.
"""

from __future__ import annotations

import time

from django.db import connection
from django.db.models import Count, Sum
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from leases.choices import HOLDING
from leases.models import Lease
from pools.models import Quota
from pools.statemachine import TransitionRefused

QUOTA_CACHE_SECONDS = 5.0
_has_quota: dict[tuple[int, int], tuple[float, bool]] = {}


@receiver([post_save, post_delete], sender=Quota)
def _forget_quotas(sender, instance, **kwargs):
    _has_quota.clear()


def lock_quotas(pairs: set[tuple[int, int]]) -> None:
    tenants, pools = zip(*pairs, strict=True)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Quota._meta.db_table} "
            "WHERE tenant_id = ANY(%s) AND pool_id = ANY(%s) ORDER BY id FOR UPDATE",
            [list(set(tenants)), list(set(pools))],
        )


def pairs_with_quota(pairs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """The (tenant id, pool id) pairs that have a quota row (cached as described above)."""
    now = time.monotonic()
    known = {pair: _has_quota.get(pair) for pair in pairs}
    if all(hit is not None and now - hit[0] < QUOTA_CACHE_SECONDS for hit in known.values()):
        return {pair for pair, hit in known.items() if hit[1]}
    tenants, pools = zip(*pairs, strict=True)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tenant_id, pool_id FROM {Quota._meta.db_table} "
            "WHERE tenant_id = ANY(%s) AND pool_id = ANY(%s)",
            [list(set(tenants)), list(set(pools))],
        )
        found = {tuple(row) for row in cursor.fetchall()} & pairs
    if len(_has_quota) > 10_000:
        _has_quota.clear()
    for pair in pairs:
        _has_quota[pair] = (now, pair in found)
    return found


def check_quota(pool, tenant, cpu: int, memory: int, gpus: int) -> None:
    """Inside the apply transaction; the quota row lock serialises a tenant's reserves."""
    # Plain SQL (the ORM's query compilation was a measurable share of a reserve's CPU).
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT max_leases, cpu_millicores, memory_mib, gpus FROM {Quota._meta.db_table} "
            "WHERE tenant_id = %s AND pool_id = %s" + lock,
            [tenant.pk, pool.pk],
        )
        row = cursor.fetchone()
    if row is None:
        return
    quota = Quota(max_leases=row[0], cpu_millicores=row[1], memory_mib=row[2], gpus=row[3])
    held = list(
        Lease.objects.filter(
            tenant=tenant, pool=pool, state__in=HOLDING, backfill_of__isnull=True
        ).values_list("cpu_millicores", "memory_mib", "gpu_allocations")
    )
    over = _over_quota(
        quota,
        leases=len(held) + 1,
        cpu=sum(r[0] for r in held) + cpu,
        memory=sum(r[1] for r in held) + memory,
        gpus=sum(len(r[2]) for r in held) + gpus,
    )
    if over:
        raise TransitionRefused("quota_exceeded", over)


def _over_quota(quota: Quota, *, leases: int, cpu: int, memory: int, gpus: int) -> str:
    """What the tenant would hold with one more lease, where it exceeds the quota ("" if not)."""
    limits = (
        ("leases", leases, quota.max_leases),
        ("cpu_millicores", cpu, quota.cpu_millicores),
        ("memory_mib", memory, quota.memory_mib),
        ("gpus", gpus, quota.gpus),
    )
    over = [f"{name} {used} > {limit}" for name, used, limit in limits if used > limit]
    return "Quota exceeded: " + ", ".join(over) if over else ""


def tenants_at_quota(*, pool_id=None, tenant_id=None) -> dict[tuple[int, int], dict]:
    """(tenant id, pool id) → the `quota_exceeded` explanation, for every quota without room for
    even the smallest lease (one more, of 1 millicore and 1 MiB and no GPU: every request asks
    at least that). The scheduling pass skips their queued jobs without a placement attempt."""
    quotas = Quota.objects.all()
    if pool_id is not None:
        quotas = quotas.filter(pool_id=pool_id)
    if tenant_id is not None:
        quotas = quotas.filter(tenant_id=tenant_id)
    quotas = list(quotas)
    if not quotas:
        return {}
    held = {
        (row["tenant_id"], row["pool_id"]): row
        for row in Lease.objects.filter(
            state__in=HOLDING,
            backfill_of__isnull=True,
            tenant_id__in={q.tenant_id for q in quotas},
            pool_id__in={q.pool_id for q in quotas},
        )
        .order_by()
        .values("tenant_id", "pool_id")
        .annotate(leases=Count("id"), cpu=Sum("cpu_millicores"), memory=Sum("memory_mib"))
    }
    blocked = {}
    for quota in quotas:
        used = held.get((quota.tenant_id, quota.pool_id), {})
        over = _over_quota(
            quota,
            leases=used.get("leases", 0) + 1,
            cpu=(used.get("cpu") or 0) + 1,
            memory=(used.get("memory") or 0) + 1,
            gpus=0,
        )
        if over:
            blocked[(quota.tenant_id, quota.pool_id)] = {"code": "quota_exceeded", "message": over}
    return blocked


class Headroom:
    """What one tenant may still take in one pool, for a pass that plans many jobs before it
    writes any: `take` deducts a planned placement, or names the dimension it would exceed.
    Read once per pass (`quota_headroom`); the apply transaction re-checks under the quota
    row's lock, so a stale headroom can only make the pass too cautious, never over quota."""

    def __init__(self, quota: Quota, used: dict):
        self.limits = {
            "leases": quota.max_leases,
            "cpu_millicores": quota.cpu_millicores,
            "memory_mib": quota.memory_mib,
            "gpus": quota.gpus,
        }
        self.used = {name: float(used.get(name) or 0) for name in self.limits}

    def take(self, *, cpu_millicores: int, memory_mib: int, gpus: float) -> str:
        """ "" and deducted when it fits; otherwise the `quota_exceeded` message naming every
        dimension it would exceed (nothing deducted)."""
        wanted = {"leases": 1, "cpu_millicores": cpu_millicores, "memory_mib": memory_mib}
        wanted["gpus"] = gpus
        over = [
            f"{name} {self.used[name] + amount:g} > {self.limits[name]:g}"
            for name, amount in wanted.items()
            if self.used[name] + amount > self.limits[name]
        ]
        if over:
            return "Quota exceeded: " + ", ".join(over)
        for name, amount in wanted.items():
            self.used[name] += amount
        return ""


def quota_headroom(pool_id: int, tenant_ids) -> dict[int, Headroom]:
    """tenant id → its Headroom in the pool, for the tenants that have a quota there."""
    quotas = list(Quota.objects.filter(pool_id=pool_id, tenant_id__in=set(tenant_ids)))
    if not quotas:
        return {}
    held = {
        tenant_id: {"leases": 0, "cpu_millicores": 0, "memory_mib": 0, "gpus": 0}
        for tenant_id in (q.tenant_id for q in quotas)
    }
    rows = Lease.objects.filter(
        pool_id=pool_id, tenant_id__in=held, state__in=HOLDING, backfill_of__isnull=True
    ).values_list("tenant_id", "cpu_millicores", "memory_mib", "gpu_allocations")
    for tenant_id, cpu, memory, allocations in rows:
        used = held[tenant_id]
        used["leases"] += 1
        used["cpu_millicores"] += cpu
        used["memory_mib"] += memory
        used["gpus"] += len(allocations)
    return {q.tenant_id: Headroom(q, held[q.tenant_id]) for q in quotas}
