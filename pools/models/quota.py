"""What a tenant may hold in a pool: its quota, and its credit account with the charges."""

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..choices import PlatformRole
from ..visibility import Visibility, VisibleQuerySet
from .tenancy import ComputePool, Tenant


class Quota(models.Model):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant", seen_by=(PlatformRole.POLICY_ADMIN,))

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="quotas")
    cpu_millicores = models.PositiveBigIntegerField()
    memory_mib = models.PositiveBigIntegerField()
    gpus = models.PositiveIntegerField(default=0)
    max_leases = models.PositiveIntegerField(default=100)
    # POST /jobs answers 429 queue_full at this many queued jobs of the tenant in the pool
    max_queued_jobs = models.PositiveIntegerField(default=1000)
    # Over time (null: unlimited), per period of `period_days` counted from 1970-01-01 UTC
    # (leases.services.quota.quota_period): GPU-hours held, network egress of its jobs.
    gpu_hours_per_period = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0)], help_text="null: unlimited"
    )
    egress_mib = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Network egress per period; null: unlimited"
    )
    period_days = models.PositiveSmallIntegerField(default=30, validators=[MinValueValidator(1)])
    # What its jobs' outputs may occupy in the pool's storage (null: unlimited)
    storage_mib = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "pool"], name="one_quota_per_tenant_pool")
        ]

    def __str__(self):
        return f"{self.tenant} @ {self.pool}"


class CreditAccount(models.Model):
    """A tenant's credit in one pool, charged from its leases (leases.services.credits); at or
    below zero the tenant starts no new work there. No account: not credit-limited. The
    balance changes only with a CreditCharge row beside it (a charge, or a top-up)."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant", seen_by=(PlatformRole.POLICY_ADMIN,))

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="credit_accounts")
    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="credit_accounts")
    balance = models.DecimalField(max_digits=18, decimal_places=4, default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "pool"], name="one_credit_account_per_pool")
        ]

    def __str__(self):
        return f"credit of {self.tenant} @ {self.pool}"


class CreditCharge(models.Model):
    """The append-only ledger of a credit account: each charge of a lease for one interval
    (what was held and consumed, at which rates), and each top-up. Never edited."""

    class Kind(models.TextChoices):
        CHARGE = "charge", "Charge"
        TOP_UP = "top_up", "Top-up"

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="account__tenant", seen_by=(PlatformRole.POLICY_ADMIN,))

    account = models.ForeignKey(CreditAccount, on_delete=models.PROTECT, related_name="charges")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.CHARGE)
    # what the balance lost (a charge) or gained (a top-up); never negative
    amount = models.DecimalField(max_digits=18, decimal_places=4)
    balance_after = models.DecimalField(max_digits=18, decimal_places=4)
    # A charge: the lease (an id, not a key: the ledger sits below leases) and the interval
    lease_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    period_start = models.DateTimeField(null=True, blank=True)
    period_end = models.DateTimeField(null=True, blank=True)
    priority_class = models.CharField(max_length=40, blank=True)
    held = models.JSONField(default=dict, blank=True, help_text="cpu cores, memory GiB, GPUs")
    consumed = models.JSONField(default=dict, blank=True, help_text="measured averages, same units")
    rates = models.JSONField(default=dict, blank=True)
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # never the same interval of a lease twice, even from two workers at once
            models.UniqueConstraint(
                fields=["lease_id", "period_start"],
                condition=Q(kind="charge"),
                name="credit_charge_once_per_interval",
            ),
            models.CheckConstraint(condition=Q(amount__gte=0), name="credit_amount_not_negative"),
        ]

    def __str__(self):
        return f"{self.kind} {self.amount} on {self.account}"
