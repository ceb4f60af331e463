"""A tenant's registered buckets: where its jobs' `s3://` inputs come from and its outputs go
(docs/storage.md, "Object stores: buckets, inputs and outputs"). The credentials are sealed
with the control plane's key ring (pools/encryption.py) like tenants' secrets, and never leave
the control plane: the agent gets presigned URLs (pools/objectstore.py)."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import models
from django.utils import timezone

from .. import encryption
from ..statemachine import EventBase
from ..visibility import Visibility, VisibleQuerySet
from .tenancy import Tenant


class ServerSideEncryption(models.TextChoices):
    NONE = "", "None requested"
    AES256 = "AES256", "AES256 (the store's own keys, SSE-S3)"


class TenantBucket(models.Model):
    """A bucket of an S3-compatible store, registered by a tenant admin with the tenant's own
    credentials. Jobs of the tenant name it in `s3://<bucket>/…` inputs and output
    destinations; the endpoint is one of OBJECT_STORE_ENDPOINTS."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant")

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="buckets")
    bucket = models.CharField(max_length=63, help_text="The bucket's name in the store")
    endpoint = models.CharField(max_length=300, help_text="One of OBJECT_STORE_ENDPOINTS")
    region = models.CharField(max_length=40, default="us-east-1")
    server_side_encryption = models.CharField(
        max_length=10, choices=ServerSideEncryption.choices, blank=True, default=""
    )
    # AES-256-GCM of {"access_key_id", "secret_access_key"} (JSON), bound to tenant and bucket
    ciphertext = models.BinaryField()
    key_id = models.CharField(
        max_length=32, help_text="The ENCRYPTION_KEYS entry it is sealed under"
    )
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["tenant", "bucket"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "bucket"], name="bucket_unique_in_tenant")
        ]

    def __str__(self):  # never the credentials
        return f"{self.tenant}/s3://{self.bucket}"

    def seal(self, access_key_id: str, secret_access_key: str) -> None:
        plain = json.dumps({"access_key_id": access_key_id, "secret_access_key": secret_access_key})
        self.key_id, self.ciphertext = encryption.encrypt(plain, context=self.context)

    def reveal(self) -> tuple[str, str]:
        """(access key id, secret access key)."""
        plain = json.loads(encryption.decrypt(self.key_id, self.ciphertext, context=self.context))
        return plain["access_key_id"], plain["secret_access_key"]

    @property
    def context(self) -> str:
        return f"pools.TenantBucket:{self.tenant_id}:{self.bucket}"


class TenantBucketEvent(EventBase):
    """A bucket registered or removed: keyed by its tenant and the bucket's name, so a removal's
    history outlives the row. `data` names the bucket and its endpoint, never a credential."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant")
    subject_field = "tenant"
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="bucket_events")
    bucket = models.CharField(max_length=63)

    class Meta(EventBase.Meta):
        indexes = [models.Index(fields=["tenant", "bucket"], name="bucket_event_bucket")]
