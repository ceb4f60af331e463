"""Backfill: short work runs on the capacity a reservation holds until its window opens. Such a
lease holds nothing on the node ledger itself; it borrows from `backfill_of`. Heartbeats renew a
backfilled job's lease up to the window start; `reclaim_lead` before it the scheduling loop
reclaims the job (checkpoint and re-queue, or stop: scheduling/backfill.py), so the reservation
finds its capacity free when its window opens. Only work that can end in time is let in: a job
that cannot checkpoint must declare a maximum runtime that ends before the reclaim."""

from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction

from leases import snapshot as snap
from leases.choices import LeaseState
from leases.models import Lease
from leases.window import request_digest
from placement import place
from placement import types as core
from placement.explain import coarse_floor
from pools.knobs import knobs_for

from . import ledger

# What the reclaim needs beyond the pool's stop grace before a window opens: the agent's next
# look at its assignments, the checkpoint's upload and the report.
RECLAIM_MARGIN = timedelta(seconds=20)


def reclaim_lead(pool) -> timedelta:
    """How long before a reservation's window its backfilled jobs are reclaimed."""
    return timedelta(seconds=knobs_for(pool).stop_grace_s) + RECLAIM_MARGIN


def backfill_deadline(pool, job, now, expires_at):
    """The earliest window start a backfill may run before: a lease of the lease API ends by
    its own expiry; a job is reclaimed `reclaim_lead` before the window, and one that cannot
    checkpoint must end by then on its own (its `max_runtime_s`), never be cut short."""
    if job is None:
        return expires_at
    if job.checkpointable:
        return expires_at + reclaim_lead(pool)
    return max(expires_at, now + timedelta(seconds=job.max_runtime_s) + reclaim_lead(pool))


def try_backfill(pool, tenant, req, request, actor, now, expires_at, job, idempotency_key):
    """A backfill lease inside the first reservation of the pool it fits in, or None."""
    deadline = backfill_deadline(pool, job, now, expires_at)
    candidates = list(
        Lease.objects.filter(
            pool=pool,
            state=LeaseState.RESERVED,
            window_start__gte=deadline,
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
                if locked.state != LeaseState.RESERVED or locked.window_start < deadline:
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


def backfill_advice(pool, tenant_id: int, req, job, now, expires_at) -> str | None:
    """For a job that did not backfill only because it would not end in time: how it would —
    a shorter declared runtime, or a checkpoint — or None when neither would help. Another
    tenant's window start is told only as its coarse window's floor (docs/security.md)."""
    if job is None:
        return None
    lead = reclaim_lead(pool)
    policy = snap.pool_policy(pool)
    reservations = Lease.objects.filter(
        pool=pool, state=LeaseState.RESERVED, backfill_of__isnull=True, window_start__gt=now
    ).order_by("window_start", "id")[:20]
    for parent in reservations:
        view = snap.reservation_view(parent)
        if view is None or isinstance(place(req, [view], policy), core.Explanation):
            continue
        room_s = (parent.window_start - now - lead).total_seconds()
        if parent.tenant_id != tenant_id:
            room_s = coarse_floor(room_s)
        ways = []
        if room_s >= 60 and not job.checkpointable:
            ways.append(f"declare a maximum runtime under {int(room_s)} s")
        if not job.checkpointable and parent.window_start >= expires_at + lead:
            ways.append("make it checkpointable")
        if ways:
            return (
                f"a reservation's capacity is free until its window opens: {' or '.join(ways)} "
                "to run in it now"
            )
    return None
