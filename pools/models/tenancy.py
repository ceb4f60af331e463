"""Who uses the pools and the pools they use: tenants, their people's memberships, pools."""

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from ..choices import PlatformRole, TenantRole, TrustLevel
from ..statemachine import EventBase
from ..visibility import Visibility, VisibleQuerySet


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


class MembershipEvent(EventBase):
    """One change to who belongs to a tenant: a person added, their role changed, or removed.
    Keyed by the tenant and the person's username (kept as written), not by the membership row,
    so a removal's history outlives the row. `from_state`/`to_state` are the roles ("" before
    an add, "removed" after a removal); `data` names the member and both roles."""

    REMOVED = "removed"

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant")
    subject_field = "tenant"
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="membership_events")
    username = models.CharField(max_length=150)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta(EventBase.Meta):
        indexes = [models.Index(fields=["tenant", "username"], name="membership_event_member")]


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
