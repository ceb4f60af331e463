"""What a policy admin edits for a pool: its scheduling policy (immutable numbered versions),
the registries its images may come from and the keys that sign them."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from .tenancy import ComputePool


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
