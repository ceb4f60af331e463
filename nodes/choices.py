from django.db import models


class NodeState(models.TextChoices):
    REGISTERED = "registered", "Registered"
    VERIFIED = "verified", "Verified"
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    QUARANTINED = "quarantined", "Quarantined"
    RETIRED = "retired", "Retired"


S = NodeState
# New placements go only to these.
SCHEDULABLE = frozenset({S.READY})
# Work placed before may keep running on these.
SERVING = frozenset({S.READY, S.DRAINING})
TERMINAL = frozenset({S.RETIRED})

NODE_TRANSITIONS: dict[str, frozenset[str]] = {
    S.REGISTERED: frozenset({S.VERIFIED, S.QUARANTINED, S.RETIRED}),
    S.VERIFIED: frozenset({S.READY, S.QUARANTINED, S.RETIRED}),
    S.READY: frozenset({S.DRAINING, S.QUARANTINED, S.RETIRED}),
    S.DRAINING: frozenset({S.READY, S.QUARANTINED, S.RETIRED}),
    S.QUARANTINED: frozenset({S.VERIFIED, S.READY, S.RETIRED}),
    S.RETIRED: frozenset(),
}


class Reachability(models.TextChoices):
    """A condition, not a state: an unreachable node keeps its lifecycle state."""

    REACHABLE = "reachable", "Reachable"
    UNREACHABLE = "unreachable", "Unreachable"


class GpuHealth(models.TextChoices):
    """Why a present device is (un)suitable; anything but OK makes it unschedulable alone."""

    OK = "ok", "OK"
    ERROR = "error", "Error state (XID / ECC)"
    TOO_HOT = "too_hot", "Over temperature"
    DEGRADED_LINK = "degraded_link", "PCIe/NVLink link degraded"
    HEALTH_CHECK_FAILED = "health_check_failed", "Health check failed"
    MISSING = "missing", "No longer reported by the node"


class ProbeKind(models.TextChoices):
    VALIDATION = "validation", "Validation (claims vs measured)"
    RECOVERY = "recovery", "Device recovery"


class ProbeState(models.TextChoices):
    REQUESTED = "requested", "Requested"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
