from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    LEASED = "leased", "Leased"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    CHECKPOINTING = "checkpointing", "Checkpointing"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    LOST = "lost", "Lost"


class AntiAffinityScope(models.TextChoices):
    """Where a job's anti-affinity looks for work with the labels it avoids."""

    HOST = "host", "Host"
    ZONE = "zone", "Zone"


S = JobState
PENDING = frozenset({S.QUEUED})
ACTIVE = frozenset({S.LEASED, S.STARTING, S.RUNNING, S.CHECKPOINTING})
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST})

_ENDINGS = frozenset({S.FAILED, S.CANCELLED, S.LOST})
JOB_TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.LEASED, S.CANCELLED, S.FAILED}),
    # back to queued: the lease expired or capacity vanished before start
    S.LEASED: frozenset({S.STARTING, S.QUEUED}) | _ENDINGS,
    S.STARTING: frozenset({S.RUNNING, S.QUEUED}) | _ENDINGS,
    # back to queued from running too: a failure or a lost node that the retry policy retries
    S.RUNNING: frozenset({S.CHECKPOINTING, S.SUCCEEDED, S.QUEUED}) | _ENDINGS,
    # a checkpoint ends either back in running or, when preempted/drained, re-queued
    S.CHECKPOINTING: frozenset({S.RUNNING, S.QUEUED, S.SUCCEEDED}) | _ENDINGS,
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.LOST: frozenset(),
}
