"""Backfill: short work declared to end before a reservation's window opens runs on the
capacity the reservation holds. Such a lease holds nothing on the node ledger itself; it
borrows from `backfill_of`, and ends when the reservation is claimed or ends."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from leases import snapshot as snap
from leases.choices import LeaseState
from leases.models import Lease
from leases.window import request_digest
from placement import place
from placement import types as core

from . import ledger


def try_backfill(pool, tenant, req, request, actor, now, expires_at, job, idempotency_key):
    """A backfill lease inside the first reservation of the pool it fits in, or None."""
    candidates = list(
        Lease.objects.filter(
            pool=pool,
            state=LeaseState.RESERVED,
            window_start__gte=expires_at,
            backfill_of__isnull=True,
        ).order_by("window_start", "id")[:20]
    )
    if not candidates:
        return None
    policy = snap.pool_policy(pool)
    for parent in candidates:
        view = snap.reservation_view(parent)
        if view is None:
            continue
        result = place(req, [view], policy)
        if isinstance(result, core.Explanation):
            continue
        try:
            with transaction.atomic():
                locked = Lease.objects.select_for_update().get(pk=parent.pk)
                if locked.state != LeaseState.RESERVED or locked.window_start < expires_at:
                    continue
                fresh = snap.reservation_view(locked)
                if fresh is None or isinstance(place(req, [fresh], policy), core.Explanation):
                    continue
                by_index = {a["index"]: a for a in locked.gpu_allocations}
                allocations = sorted(
                    (
                        {
                            "gpu": by_index[d.index]["gpu"],
                            "index": d.index,
                            "milli": d.milli,
                            "mig_slots": 0,
                        }
                        for d in result.devices
                    ),
                    key=lambda a: a["gpu"],
                )
                shared = ledger.Shared(pool=pool, actor=actor, now=now, expires_at=expires_at)
                digest = request_digest(pool, request, expires_at - now) if idempotency_key else ""
                row = ledger.lease_row(
                    shared,
                    tenant_id=tenant.pk,
                    request=request,
                    placement=result,
                    node_id=locked.node_id,
                    allocations=allocations,
                    job_id=job.pk if job is not None else None,
                    idempotency_key=idempotency_key,
                    digest=digest,
                    backfill_of=locked,
                )
                applied = ledger.apply([row])  # no guarded UPDATE; its tenant's quota and credit
                if applied.refused:
                    raise applied.refused[0][1]
                return row.instance(tenant=tenant, job=job, backfill_of=locked)
        except IntegrityError:
            if idempotency_key:
                return Lease.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
            raise
    return None
