"""Thin Celery tasks for the lease sweeps: each takes `now` (default: the time it runs) and is
safe to run on several workers at once (per-lease transactions with SKIP LOCKED; a second run
finds nothing). One bad row never fails a task: the sweep records it on that row and goes on."""

from datetime import timedelta

from celery import shared_task

from leases import services
from leases.services import credits
from pools.tasktime import parse_now

UNCERTAIN_DEADLINE = timedelta(minutes=10)


@shared_task(name="leases.expire_leases")
def expire_leases(now=None) -> int:
    return services.expire_leases(now=parse_now(now))


@shared_task(name="leases.expire_uncertain")
def expire_uncertain(now=None, deadline_s=None) -> int:
    deadline = timedelta(seconds=deadline_s) if deadline_s is not None else UNCERTAIN_DEADLINE
    return services.expire_uncertain(now=parse_now(now), deadline=deadline)


@shared_task(name="leases.release_unclaimed_reservations")
def release_unclaimed_reservations(now=None) -> int:
    return services.release_unclaimed_reservations(now=parse_now(now))


@shared_task(name="leases.charge_credits")
def charge_credits(now=None) -> int:
    """Charges tenants' credit accounts for their leases since the last charge
    (leases/services/credits.py): idempotent, safe on several workers."""
    return credits.charge_credits(now=parse_now(now))
