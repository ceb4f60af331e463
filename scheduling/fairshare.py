"""Fair-share standings: what each tenant holds in a pool now, with its weight, for the core's
queue order (`scheduling.core.queue`)."""

from __future__ import annotations

from leases.choices import HOLDING
from leases.models import Lease
from pools.models import Tenant
from scheduling.core.queue import TenantStanding


def standings(pool_id: int, tenant_ids, now=None) -> dict[int, TenantStanding]:
    """tenant id → its standing in the pool: held CPU, memory and GPUs (a GPU share counts by
    its milli, so a quarter time-slice is 0.25) and its fair-share weight."""
    tenant_ids = set(tenant_ids)
    held = {tenant_id: [0.0, 0.0, 0.0] for tenant_id in tenant_ids}
    rows = Lease.objects.filter(
        pool_id=pool_id, tenant_id__in=tenant_ids, state__in=HOLDING, backfill_of__isnull=True
    ).values_list("tenant_id", "cpu_millicores", "memory_mib", "gpu_allocations")
    for tenant_id, cpu, memory, allocations in rows:
        total = held[tenant_id]
        total[0] += cpu
        total[1] += memory
        total[2] += sum(a.get("milli", 1000) for a in allocations) / 1000
    weights = dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "fair_share_weight"))
    return {
        tenant_id: TenantStanding(tenant_id, weights.get(tenant_id, 1.0), tuple(total))
        for tenant_id, total in held.items()
    }
