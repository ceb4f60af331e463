"""Lease lifecycle. Every state change writes a LeaseEvent with a reason code."""

from __future__ import annotations

from django.utils import timezone

from pools.actors import Actor
from pools.statemachine import transition

from .choices import LEASE_TRANSITIONS
from .models import Lease, LeaseEvent


def lease_transition(
    *,
    lease: Lease,
    to: str,
    actor: Actor,
    reason: str,
    message: str = "",
    now=None,
    changes: dict | None = None,
    check=None,
    data: dict | None = None,
) -> Lease:
    return transition(
        Lease,
        lease.pk,
        to=to,
        allowed=LEASE_TRANSITIONS,
        event_model=LeaseEvent,
        actor=actor,
        reason=reason,
        message=message,
        now=now or timezone.now(),
        changes=changes,
        check=check,
        data=data,
    )
