"""How long an ended job's outputs and log are kept (docs/storage.md, "Encryption at rest and
retention"): the tenant's row for the job's pool, else the tenant's row for every pool (pool
empty), else the pool's `output_retention_days` knob. Tenant admins set and clear their
tenant's rows (`/api/v1/output-retention/`); the sweep that deletes is
jobs/artifacts.py `expire_artifacts`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from pools.actors import Actor
from pools.knobs import RETENTION_MAX_DAYS, knobs_for

from .choices import TERMINAL
from .models import TenantRetention

RETENTION_MIN_DAYS = 1


@dataclass(frozen=True)
class Retention:
    days: int
    # where the days come from: "tenant pool" (the tenant's row for this pool), "tenant" (its
    # row for every pool) or "pool" (the pool's knob)
    source: str


def effective(tenant_id: int, pool) -> Retention:
    """The days a tenant's ended jobs in `pool` keep their outputs and log."""
    rows = dict(
        TenantRetention.objects.filter(tenant_id=tenant_id)
        .filter(Q(pool=pool) | Q(pool__isnull=True))
        .values_list("pool_id", "output_retention_days")
    )
    if pool.pk in rows:
        return Retention(rows[pool.pk], "tenant pool")
    if None in rows:
        return Retention(rows[None], "tenant")
    return Retention(knobs_for(pool).output_retention_days, "pool")


def tenants_days(pool) -> dict[int, int]:
    """{tenant id: days} of every tenant with a row that applies in `pool` (its own row for the
    pool over its row for every pool); the other tenants keep the pool's knob."""
    rows = TenantRetention.objects.values_list("tenant_id", "output_retention_days")
    days = dict(rows.filter(pool__isnull=True))
    days.update(rows.filter(pool=pool))
    return days


def expires_at(job, retention: Retention | None = None):
    """When an ended job's outputs and log go (None while the job has not ended)."""
    if job.state not in TERMINAL:
        return None
    retention = retention or effective(job.tenant_id, job.pool)
    return job.state_changed_at + timedelta(days=retention.days)


def _days(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError({"output_retention_days": "A whole number of days."})
    if not RETENTION_MIN_DAYS <= value <= RETENTION_MAX_DAYS:
        raise ValidationError(
            {
                "output_retention_days": (
                    f"Between {RETENTION_MIN_DAYS} and {RETENTION_MAX_DAYS} days."
                )
            }
        )
    return value


def retention_set(*, tenant, pool, days: int, actor: Actor) -> TenantRetention:
    """Sets the tenant's days for `pool` (None: every pool without a row of its own), replacing
    its row there; who and when are kept on the row. Jobs that ended already follow the new
    days at the next sweep (a shorter one may delete at once what the older one kept)."""
    days = _days(days)
    with transaction.atomic():
        row, _ = TenantRetention.objects.select_for_update().get_or_create(
            tenant=tenant,
            pool=pool,
            defaults={"output_retention_days": days, "updated_by": actor.label[:200]},
        )
        row.output_retention_days = days
        row.updated_at = timezone.now()
        row.updated_by = actor.label[:200]
        row.save(update_fields=["output_retention_days", "updated_at", "updated_by"])
    return row


def retention_clear(*, row: TenantRetention) -> None:
    """Removes the tenant's row: its jobs there follow the next rule (every pool, the knob)."""
    row.delete()
