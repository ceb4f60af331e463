"""Sweeps: leases past their expiry, uncertain past the deadline, reservations not claimed in
their tolerance end with a reason and return their capacity. Safe on several workers at once."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q

from leases.choices import LeaseState
from leases.models import Lease, LeaseEvent
from leases.window import as_timedelta
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.reasons import Reason
from pools.sweeps import sweep

from .lifecycle import end_lease

S = LeaseState


def _end_each(due, *, to: str, reason_for, actor: Actor, now) -> int:
    """Ends each lease of `due` (pools.sweeps.sweep: one transaction each, SKIP LOCKED, a
    failure recorded on its lease); returns how many it ended."""
    return len(
        sweep(
            due,
            lambda lease: end_lease(
                lease,
                to=to,
                actor=actor,
                reason=reason_for(lease),
                message=f"swept at {now:%Y-%m-%d %H:%M:%S}",
                now=now,
            ),
            event_model=LeaseEvent,
            actor=actor,
            now=now,
        )
    )


def expire_leases(*, now) -> int:
    """Reserved or committed leases past their expiry → expired, capacity returned; so is a
    lease of the lease API left uncommitted past its pool's `lease_commit_window_s` (reserved
    for a week and never used, it would hold the capacity all that while)."""
    past_expiry = Q(state__in=(S.RESERVED, S.COMMITTED), expires_at__lte=now) & ~Q(
        state=S.RESERVED, window_start__isnull=False
    )
    due = Lease.objects.filter(past_expiry | _uncommitted_past_window(now))
    return _end_each(
        due,
        to=S.EXPIRED,
        reason_for=lambda lease: (
            Reason.EXPIRED_UNCOMMITTED if lease.state == S.RESERVED else Reason.EXPIRED_NOT_RENEWED
        ),
        actor=Actor.system("lease-expiry"),
        now=now,
    )


def _uncommitted_past_window(now) -> Q:
    """Leases of the lease API (no job, no window) still reserved past their pool's commit
    window; a job's lease is committed by its agent (bounded by `startup_timeout_s`)."""
    uncommitted = Q(state=S.RESERVED, job__isnull=True, window_start__isnull=True)
    late = Q(pk__in=[])
    for pool_id in set(Lease.objects.filter(uncommitted).values_list("pool_id", flat=True)):
        window = timedelta(seconds=knobs_for(pool_id).lease_commit_window_s)
        late |= Q(pool_id=pool_id, created_at__lte=now - window)
    return late & uncommitted


def expire_uncertain(*, now, deadline) -> int:
    """Uncertain longer than `deadline` (a timedelta or seconds) → expired, capacity returned;
    so is a stopping lease whose node has been silent as long (nobody can confirm its stop)."""
    cutoff = now - as_timedelta(deadline)
    due = Lease.objects.filter(state__in=(S.UNCERTAIN, S.STOPPING), uncertain_since__lte=cutoff)
    return _end_each(
        due,
        to=S.EXPIRED,
        reason_for=lambda lease: Reason.UNCERTAIN_DEADLINE,
        actor=Actor.system("lease-uncertain"),
        now=now,
    )


def release_unclaimed_reservations(*, now) -> int:
    """Reservations not claimed within their tolerance → released with a reason."""
    due = Lease.objects.filter(state=S.RESERVED, window_start__isnull=False, expires_at__lte=now)
    return _end_each(
        due,
        to=S.RELEASED,
        reason_for=lambda lease: Reason.RESERVATION_UNCLAIMED,
        actor=Actor.system("reservations"),
        now=now,
    )
