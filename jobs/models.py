from django.conf import settings
from django.db import models
from django.utils import timezone

from pools.statemachine import EventBase
from pools.visibility import Visibility, VisibleQuerySet

from .choices import TERMINAL, JobState


class Job(models.Model):
    objects = VisibleQuerySet.as_manager()
    # a node's agent sees the jobs that hold (or held) a lease on its node
    visibility = Visibility(tenant="tenant", node="leases__node")

    tenant = models.ForeignKey("pools.Tenant", on_delete=models.PROTECT, related_name="jobs")
    pool = models.ForeignKey("pools.ComputePool", on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=100)
    shape = models.ForeignKey(
        "pools.ResourceShape", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resources = models.JSONField(help_text="The resolved resource request (shape fields)")
    image = models.CharField(max_length=300)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    priority_class = models.ForeignKey(
        "pools.PriorityClass", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    checkpointable = models.BooleanField(default=False)
    max_runtime_s = models.PositiveIntegerField(default=3600)
    state = models.CharField(
        max_length=14, choices=JobState.choices, default=JobState.QUEUED, db_index=True
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    # Why a queued job is not placed yet: the scheduler's latest explanation (counts per reason,
    # nearest miss). Cleared when it is placed.
    pending_reason = models.JSONField(default=dict, blank=True)
    pending_checked_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["pool", "state", "created_at"])]

    def __str__(self):
        return f"job {self.pk} {self.name}"

    @property
    def has_ended(self) -> bool:
        """Ended for good (succeeded, failed, cancelled, lost): its lease is not renewed."""
        return self.state in TERMINAL


class JobEvent(EventBase):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="job__tenant", node="job__leases__node")
    subject_field = "job"
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")

    class Meta(EventBase.Meta):
        pass
