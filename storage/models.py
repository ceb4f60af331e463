"""Persistent volumes (issue 23, docs/storage.md "Persistent volumes"): a tenant's named
filesystem of a fixed size on one node's disk, that outlives the jobs that mount it.

The volume reserves its size on its node's disk ledger (`Node.scratch_mib_reserved`, the same
column leases reserve scratch on, so the database's `node_scratch_not_overcommitted` check holds
volumes too) from its creation until its node confirmed its image is gone (`disk_released_at`),
and counts against its tenant's `storage_mib` quota while it is live. Jobs are a layer above:
a job is named by its id only (`holder_job_id`, `VolumeAttachment.job_id`)."""

from django.db import models
from django.db.models import Q
from django.utils import timezone

from pools.statemachine import EventBase
from pools.visibility import Visibility, VisibleQuerySet

from .choices import LIVE, VolumeState


class Volume(models.Model):
    objects = VisibleQuerySet.as_manager()
    # its tenant's people, operators, and the agent of the node it lives on
    visibility = Visibility(tenant="tenant", node="node")

    tenant = models.ForeignKey("pools.Tenant", on_delete=models.PROTECT, related_name="volumes")
    pool = models.ForeignKey("pools.ComputePool", on_delete=models.PROTECT, related_name="volumes")
    node = models.ForeignKey("nodes.Node", on_delete=models.PROTECT, related_name="volumes")
    name = models.CharField(max_length=63)
    size_mib = models.PositiveIntegerField()
    # what the tenant asked for: a zone of the pool, or a node by name ("" = any)
    zone = models.CharField(max_length=40, blank=True)
    state = models.CharField(
        max_length=12, choices=VolumeState.choices, default=VolumeState.AVAILABLE
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    # the job that mounts it read-write now (at most one; None: none)
    holder_job_id = models.BigIntegerField(null=True, blank=True)
    retention_days = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    last_attached_at = models.DateTimeField(null=True, blank=True)
    last_detached_at = models.DateTimeField(null=True, blank=True)
    # when retention expires it (retention_days after the last detach, or after creation when
    # never attached); None while attached or gone
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # what the node's agent last said it uses (bytes in the filesystem), and when
    used_bytes = models.BigIntegerField(default=0)
    used_reported_at = models.DateTimeField(null=True, blank=True)
    # when the volume's size went back to its node's disk ledger (its image known gone)
    disk_released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "pool", "name"],
                condition=Q(state__in=sorted(LIVE)),
                name="volume_name_unique_live",
            ),
            models.CheckConstraint(condition=Q(size_mib__gte=1), name="volume_size_positive"),
        ]

    def __str__(self):
        return f"volume {self.pk} {self.name}"

    @property
    def is_live(self) -> bool:
        return self.state in LIVE


class VolumeAttachment(models.Model):
    """A job that mounts the volume now. The database holds the rule of one read-write job at
    a time (`volume_one_writer`), whatever a code path forgets."""

    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="attachments")
    job_id = models.BigIntegerField()
    read_only = models.BooleanField()
    attached_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["volume", "job_id"], name="volume_attached_once"),
            models.UniqueConstraint(
                fields=["volume"], condition=Q(read_only=False), name="volume_one_writer"
            ),
        ]

    def __str__(self):
        mode = "read-only" if self.read_only else "read-write"
        return f"job {self.job_id} mounts volume {self.volume_id} {mode}"


class VolumeEvent(EventBase):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="volume__tenant", node="volume__node")
    subject_field = "volume"
    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="events")

    class Meta(EventBase.Meta):
        pass
