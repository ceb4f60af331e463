"""Tenants, roles, pools and the policy objects a policy admin edits in the Django admin."""

import hashlib
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from . import encryption
from .choices import (
    Architecture,
    ContainerRuntime,
    GpuSharingClass,
    PlatformRole,
    SupportGrantState,
    TenantRole,
    TrustLevel,
)
from .roles import tenant_roles
from .statemachine import EventBase
from .validation import shape_errors
from .visibility import Visibility, VisibleQuerySet


class Tenant(models.Model):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="pk", seen_by=(PlatformRole.POLICY_ADMIN,))

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=60, unique=True)
    # Fair share: a tenant's entitlement relative to the others (dominant-resource fairness)
    fair_share_weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01)])
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.slug


class Membership(models.Model):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant")

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=TenantRole.choices, default=TenantRole.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")
        ]

    def __str__(self):
        return f"{self.user} in {self.tenant} ({self.role})"


class ComputePool(models.Model):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(public=True)  # shared infrastructure: every person sees the pools

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=60, unique=True)
    trust_level = models.CharField(
        max_length=12, choices=TrustLevel.choices, default=TrustLevel.PRIVATE
    )
    description = models.TextField(blank=True)
    heartbeat_interval_s = models.PositiveIntegerField(default=15)
    # Allocatable = raw − system reserve − safety margin; the scheduler only sees allocatable.
    system_reserve_cpu_millicores = models.PositiveIntegerField(default=500)
    system_reserve_memory_mib = models.PositiveIntegerField(default=1024)
    safety_margin_percent = models.PositiveSmallIntegerField(default=5)
    allow_tenant_mixing_on_shared_gpus = models.BooleanField(
        default=False,
        help_text="Let time-sliced/MPS shares of one GPU belong to different tenants.",
    )
    sensitive = models.BooleanField(
        default=False,
        help_text="Accept only images signed by one of the pool's trusted keys.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.slug


# The fields of a shape that make up a resource request (inline requests use the same ones).
REQUEST_FIELDS = (
    "cpu_millicores_min",
    "cpu_millicores_preferred",
    "memory_mib_min",
    "memory_mib_preferred",
    "gpu_count",
    "gpu_models",
    "gpu_memory_mib_min",
    "gpu_sharing_class",
    "gpu_milli",
    "mig_profile",
    "scratch_mib",
    "network_class",
    "architecture",
    "os",
    "container_runtime",
    "regions",
    "zones",
    "node_pin",
)


class ResourceShape(models.Model):
    """A catalogue entry: what a workload needs, never which machine it runs on."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(public=True)

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="shapes")
    name = models.SlugField(max_length=60)
    description = models.CharField(max_length=200, blank=True)
    cpu_millicores_min = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    cpu_millicores_preferred = models.PositiveIntegerField(null=True, blank=True)
    memory_mib_min = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_mib_preferred = models.PositiveIntegerField(null=True, blank=True)
    gpu_count = models.PositiveSmallIntegerField(default=0)
    gpu_models = models.JSONField(default=list, blank=True, help_text="Accepted GPU models/classes")
    gpu_memory_mib_min = models.PositiveIntegerField(default=0)
    gpu_sharing_class = models.CharField(
        max_length=10, choices=GpuSharingClass.choices, default=GpuSharingClass.NONE
    )
    gpu_milli = models.PositiveSmallIntegerField(
        default=0, help_text="Share of one GPU in thousandths (time-slicing and MPS only)"
    )
    mig_profile = models.CharField(max_length=20, blank=True, help_text='e.g. "1g.10gb"')
    scratch_mib = models.PositiveIntegerField(default=0)
    network_class = models.CharField(max_length=40, blank=True)
    architecture = models.CharField(
        max_length=10, choices=Architecture.choices, default=Architecture.AMD64
    )
    os = models.CharField(max_length=20, default="linux")
    container_runtime = models.CharField(
        max_length=30, choices=ContainerRuntime.choices, default=ContainerRuntime.DOCKER
    )
    regions = models.JSONField(default=list, blank=True)
    zones = models.JSONField(default=list, blank=True)
    node_pin = models.CharField(max_length=100, blank=True, help_text="Hard pin to a node name")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="shape_name_unique_in_pool"),
            models.CheckConstraint(
                condition=Q(cpu_millicores_preferred__isnull=True)
                | Q(cpu_millicores_preferred__gte=models.F("cpu_millicores_min")),
                name="shape_cpu_preferred_gte_min",
            ),
            models.CheckConstraint(
                condition=Q(memory_mib_preferred__isnull=True)
                | Q(memory_mib_preferred__gte=models.F("memory_mib_min")),
                name="shape_memory_preferred_gte_min",
            ),
        ]

    def __str__(self):
        return f"{self.pool.slug}/{self.name}"

    def as_request(self) -> dict:
        return {field: getattr(self, field) for field in REQUEST_FIELDS}

    def clean(self):
        errors = shape_errors(self)
        sharing = self.gpu_sharing_class
        if sharing == GpuSharingClass.NONE and self.gpu_count:
            errors["gpu_sharing_class"] = "A shape with GPUs needs a sharing class."
        if sharing != GpuSharingClass.NONE and not self.gpu_count:
            errors["gpu_count"] = "A GPU sharing class needs at least one GPU."
        if sharing in (GpuSharingClass.TIMESLICE, GpuSharingClass.MPS):
            if not 0 < self.gpu_milli < 1000:
                errors["gpu_milli"] = "Shared classes take a share between 1 and 999 thousandths."
            if self.gpu_count != 1:
                errors["gpu_count"] = "A shared-GPU shape takes a share of exactly one GPU."
        elif self.gpu_milli:
            errors["gpu_milli"] = "Only time-slicing and MPS take a fractional share."
        if sharing == GpuSharingClass.MIG and not self.mig_profile:
            errors["mig_profile"] = "A MIG shape names its profile, e.g. 1g.10gb."
        if sharing != GpuSharingClass.MIG and self.mig_profile:
            errors["mig_profile"] = "Only MIG shapes name a profile."
        if self.container_runtime == ContainerRuntime.GVISOR and self.gpu_count:
            # Debian's runsc (2022) has no GPU proxy: a device handed to the sandbox is unusable
            errors["container_runtime"] = "gVisor runs CPU work only: no GPUs under it."
        if errors:
            raise ValidationError(errors)


class PriorityClassQuerySet(VisibleQuerySet):
    def allowed_to(self, user, tenant):
        """The classes `user` may submit at for `tenant`: the one check point for priorities."""
        role = tenant_roles(user).get(tenant.pk)
        if role is None:
            return self.none()
        # No tenants listed means every tenant; a (class, tenant) pair joins at most one row.
        allowed = self.filter(Q(allowed_tenants__isnull=True) | Q(allowed_tenants=tenant))
        if role != TenantRole.ADMIN:
            allowed = allowed.filter(minimum_role=TenantRole.MEMBER)
        return allowed


class PriorityClass(models.Model):
    objects = PriorityClassQuerySet.as_manager()
    visibility = Visibility(public=True)

    name = models.SlugField(max_length=40, unique=True)
    value = models.IntegerField(help_text="Higher runs first")
    preemptible = models.BooleanField(
        default=True, help_text="Its checkpointable running jobs may be preempted"
    )
    may_preempt = models.BooleanField(
        default=False, help_text="Its queued jobs may preempt jobs of lower, preemptible classes"
    )
    max_wait_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Target: a job of this class waits at most this long"
    )
    description = models.CharField(max_length=200, blank=True)
    allowed_tenants = models.ManyToManyField(
        Tenant, blank=True, related_name="+", help_text="Only these tenants; none: every tenant"
    )
    minimum_role = models.CharField(
        max_length=10,
        choices=TenantRole.choices,
        default=TenantRole.MEMBER,
        help_text="Tenant admin: only a tenant's admins may submit at this class",
    )

    class Meta:
        ordering = ["-value"]
        verbose_name_plural = "priority classes"

    def __str__(self):
        return f"{self.name} ({self.value})"


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


class SchedulingPolicy(models.Model):
    """A named policy of a pool; its content lives in immutable numbered versions."""

    pool = models.OneToOneField(
        ComputePool, on_delete=models.CASCADE, related_name="scheduling_policy"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "scheduling policies"

    def __str__(self):
        return f"policy of {self.pool}"

    @property
    def current(self):
        return self.versions.order_by("-number").first()


class SchedulingPolicyVersion(models.Model):
    policy = models.ForeignKey(SchedulingPolicy, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    weights = models.JSONField(default=dict, help_text="Scorer name → weight")
    knobs = models.JSONField(default=dict, blank=True, help_text="Other policy settings")
    comment = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["policy", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "number"], name="policy_version_unique")
        ]

    def __str__(self):
        return f"{self.policy.pool} v{self.number}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValidationError("Policy versions are immutable; publish a new version.")
        super().save(*args, **kwargs)


class AllowedRegistry(models.Model):
    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="registries")
    prefix = models.CharField(max_length=200, help_text="e.g. 127.0.0.1:5000/computepool/")
    require_digest = models.BooleanField(default=True, help_text="Images must be pinned @sha256")

    class Meta:
        verbose_name_plural = "allowed registries"
        constraints = [
            models.UniqueConstraint(fields=["pool", "prefix"], name="registry_prefix_unique")
        ]

    def __str__(self):
        return f"{self.prefix} → {self.pool}"


class PoolTrustedKey(models.Model):
    """A public key whose image signatures a sensitive pool accepts."""

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="trusted_keys")
    name = models.CharField(max_length=100)
    public_key_pem = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"{self.name} trusted by {self.pool}"


class TenantSecret(models.Model):
    """A value a tenant's jobs reference by name (`secrets: {NAME: secret name}`); only the
    agent that runs the job receives the value, no listing, event or log ever shows it. The
    value is stored encrypted (pools/encryption.py), bound to its tenant and name."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant")

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="secrets")
    name = models.SlugField(max_length=100)
    # AES-256-GCM: nonce || ciphertext || tag of the value (at most 64 KiB of UTF-8)
    ciphertext = models.BinaryField()
    key_id = models.CharField(
        max_length=32, help_text="The ENCRYPTION_KEYS entry it is sealed under"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="secret_name_unique_in_tenant")
        ]

    def __str__(self):  # never the value
        return f"{self.tenant}/{self.name}"

    def seal(self, value: str) -> None:
        """Encrypts `value` under the current key (the caller saves ciphertext and key_id)."""
        self.key_id, self.ciphertext = encryption.encrypt(value, context=self.context)

    def reveal(self) -> str:
        return encryption.decrypt(self.key_id, self.ciphertext, context=self.context)

    @property
    def context(self) -> str:
        return secret_context(self.tenant_id, self.name)


def secret_context(tenant_id: int, name: str) -> str:
    """What a secret's ciphertext is bound to (the GCM associated data): its tenant and name,
    so a value copied onto another row does not decrypt there."""
    return f"pools.TenantSecret:{tenant_id}:{name}"


class SupportGrant(models.Model):
    """A tenant admin lets one operator read the tenant's job logs and outputs, until
    `expires_at` or a revocation (pools.services.support_grant_*; checked on every read by
    pools.selectors.tenant_data_readable). Without one, operators see jobs' metadata only."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant")  # the tenant's people; operators (all rows)

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="support_grants")
    operator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="support_grants"
    )
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.CharField(max_length=200, help_text="Why: a ticket, an incident")
    state = models.CharField(
        max_length=10, choices=SupportGrantState.choices, default=SupportGrantState.ACTIVE
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["operator", "tenant", "state"])]

    def __str__(self):
        return f"support of {self.operator} for {self.tenant} ({self.state})"

    def is_active(self, now) -> bool:
        return self.state == SupportGrantState.ACTIVE and self.expires_at > now


class SupportGrantEvent(EventBase):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="grant__tenant")
    subject_field = "grant"
    grant = models.ForeignKey(SupportGrant, on_delete=models.CASCADE, related_name="events")

    class Meta(EventBase.Meta):
        pass


def token_digest(secret: str) -> str:
    # Tokens are 256-bit random, so a fast unsalted hash is safe and lets us look them up.
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token_secret(kind: str) -> str:
    return f"cp{kind}_{secrets.token_urlsafe(32)}"


class ApiToken(models.Model):
    """A person's API token; only its digest is stored, the secret is shown once."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(owner="user")  # its owner's alone, operators included

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=60)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise it")
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.user} / {self.name} ({self.prefix}…)"

    def is_valid(self, now) -> bool:
        return self.revoked_at is None and self.expires_at > now

    def allows(self, scope: str) -> bool:
        return scope in self.scopes
