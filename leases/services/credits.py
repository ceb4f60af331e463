"""Credits: each lease of a tenant with a credit account in its pool is charged for the time
since its last charge — what it held at the held rates plus what it consumed (the agent's
running average) at the consumed rates — from the pool's `credit_rates` policy knob:

    {"default": {"cpu_core_hour": 1, "memory_gib_hour": 0.1, "gpu_hour": 20,
                 "consumed_factor": 0.5},
     "<priority class>": {... overrides the default's keys for jobs of that class}}

One charge = one CreditCharge row (interval, held and consumed figures, rates) and the balance
lowered by its amount, in one transaction under the account's row lock: two workers charging at
once serialise there, and the second starts where the first ended, so no interval is charged
twice (a unique (lease, interval start) constraint stands behind that). Each lease is charged in
its own transaction; one that fails is recorded (`sweep_failed`) and the others go on.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db import transaction
from django.db.models import F, Max, OuterRef, Q, Subquery
from django.utils import timezone

from leases.choices import HOLDING
from leases.models import Lease, LeaseEvent, gpu_share
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.models import CreditAccount, CreditCharge
from pools.statemachine import record_sweep_failure

CHARGER = Actor.system("credit-charger")
CENT = Decimal("0.0001")
# An ended lease is charged its last interval within this long; older misses are not charged.
LOOKBACK = timedelta(days=7)
# measure of a lease → the rate that prices one unit of it for an hour
RATE_OF = {"cpu_cores": "cpu_core_hour", "memory_gib": "memory_gib_hour", "gpus": "gpu_hour"}


def rates_for(knob: dict, priority_class: str) -> dict[str, Decimal]:
    """The rates of a priority class: the default's, with the class's own over them."""
    merged = {**(knob.get("default") or {}), **(knob.get(priority_class) or {})}
    names = (*RATE_OF.values(), "consumed_factor")
    return {name: Decimal(str(merged.get(name) or 0)) for name in names}


def held_of(lease: dict) -> dict[str, float]:
    """What a lease holds, in rate units, charged to its own tenant: a backfill too (it runs
    inside another tenant's reservation, whose owner is never charged for it)."""
    return {
        "cpu_cores": lease["cpu_millicores"] / 1000,
        "memory_gib": lease["memory_mib"] / 1024,
        "gpus": gpu_share(lease["gpu_allocations"]),
    }


def consumed_of(lease: dict) -> dict[str, float]:
    """What it consumed: the running averages the agent's samples built (none: nothing)."""
    average = lease["usage_average"] or {}
    return {
        "cpu_cores": float(average.get("cpu_millicores") or 0) / 1000,
        "memory_gib": float(average.get("memory_mib") or 0) / 1024,
        "gpus": float(average.get("gpu_milli") or 0) / 1000,
    }


def charge_amount(*, held: dict, consumed: dict, hours: Decimal, rates: dict) -> Decimal:
    """hours × (Σ held × rate + consumed_factor × Σ consumed × rate), to 4 decimals."""
    per_hour = sum(Decimal(str(held[m])) * rates[r] for m, r in RATE_OF.items())
    consumed_per_hour = sum(Decimal(str(consumed[m])) * rates[r] for m, r in RATE_OF.items())
    total = hours * (per_hour + rates["consumed_factor"] * consumed_per_hour)
    return total.quantize(CENT, rounding=ROUND_HALF_UP)


def _charged_until():
    return Subquery(
        CreditCharge.objects.filter(lease_id=OuterRef("pk"), kind=CreditCharge.Kind.CHARGE)
        .order_by()
        .values("lease_id")
        .annotate(end=Max("period_end"))
        .values("end")
    )


def charge_credits(*, now=None) -> int:
    """Charges every lease due (holding, or ended since its last charge) of every tenant with a
    credit account, in pools whose policy has `credit_rates`; returns how many were charged."""
    now = now or timezone.now()
    charged = 0
    accounts = CreditAccount.objects.order_by("pool_id", "pk")
    knobs: dict[int, dict] = {}
    for account in accounts:
        if account.pool_id not in knobs:
            knobs[account.pool_id] = knobs_for(account.pool_id).credit_rates
        if not knobs[account.pool_id]:
            continue  # the pool prices nothing
        due = (
            Lease.objects.filter(tenant_id=account.tenant_id, pool_id=account.pool_id)
            .annotate(charged_until=_charged_until())
            .filter(
                Q(state__in=HOLDING)
                | Q(ended_at__gt=max(account.created_at, now - LOOKBACK))
                & (Q(charged_until__isnull=True) | Q(ended_at__gt=F("charged_until")))
            )
        )
        for pk in due.order_by("pk").values_list("pk", flat=True):
            try:
                charged += _charge_lease(pk, account.pk, knobs[account.pool_id], now)
            except Exception as error:  # one bad lease never stops the others
                record_sweep_failure(
                    Lease, pk, event_model=LeaseEvent, actor=CHARGER, error=error, now=now
                )
    return charged


def _charge_lease(lease_pk: int, account_pk: int, knob: dict, now) -> bool:
    with transaction.atomic():
        # the account's lock serialises every charge of the tenant in the pool (see above)
        account = CreditAccount.objects.select_for_update().get(pk=account_pk)
        lease = (
            Lease.objects.filter(pk=lease_pk)
            .values(
                "state",
                "state_changed_at",
                "created_at",
                "ended_at",
                "cpu_millicores",
                "memory_mib",
                "gpu_allocations",
                "usage_average",
                priority_class=F("job__priority_class__name"),
            )
            .get()
        )
        last = CreditCharge.objects.filter(
            lease_id=lease_pk, kind=CreditCharge.Kind.CHARGE
        ).aggregate(end=Max("period_end"))["end"]
        start = max(last or lease["created_at"], account.created_at)
        end = lease["ended_at"] or (
            lease["state_changed_at"] if lease["state"] not in HOLDING else now
        )
        end = min(end, now)
        if end <= start:
            return False
        priority_class = lease["priority_class"] or ""
        rates = rates_for(knob, priority_class)
        held, consumed = held_of(lease), consumed_of(lease)
        hours = Decimal(str((end - start).total_seconds())) / 3600
        amount = charge_amount(held=held, consumed=consumed, hours=hours, rates=rates)
        account.balance -= amount
        account.updated_at = now
        account.save(update_fields=["balance", "updated_at"])
        CreditCharge.objects.create(
            account=account,
            kind=CreditCharge.Kind.CHARGE,
            amount=amount,
            balance_after=account.balance,
            lease_id=lease_pk,
            period_start=start,
            period_end=end,
            priority_class=priority_class,
            held={k: round(v, 6) for k, v in held.items()},
            consumed={k: round(v, 6) for k, v in consumed.items()},
            rates={k: str(v) for k, v in rates.items()},
            created_at=now,
        )
    return True
