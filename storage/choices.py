"""A persistent volume's states (docs/storage.md "Persistent volumes") and the allowed moves."""

from django.db import models


class VolumeState(models.TextChoices):
    AVAILABLE = "available", "Available (created or detached)"
    ATTACHED = "attached", "Attached to at least one job"
    DELETED = "deleted", "Deleted by its tenant"
    EXPIRED = "expired", "Expired by retention"


S = VolumeState
# Live volumes hold their size on their node's disk and in the tenant's storage quota.
LIVE = frozenset({S.AVAILABLE, S.ATTACHED})
GONE = frozenset({S.DELETED, S.EXPIRED})

VOLUME_TRANSITIONS: dict[str, frozenset[str]] = {
    S.AVAILABLE: frozenset({S.ATTACHED, S.DELETED, S.EXPIRED}),
    # attached → attached: another job joins (read-only) or one of several leaves
    S.ATTACHED: frozenset({S.ATTACHED, S.AVAILABLE}),
    S.DELETED: frozenset(),
    S.EXPIRED: frozenset(),
}
