"""What grants access to data or the API: tenants' secrets (encrypted at rest), operators'
support grants, people's API tokens."""

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from .. import encryption
from ..choices import SupportGrantState
from ..statemachine import EventBase
from ..visibility import Visibility, VisibleQuerySet
from .tenancy import Tenant


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
