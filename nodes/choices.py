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
