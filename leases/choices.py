from django.db import models


class LeaseState(models.TextChoices):
    RESERVED = "reserved", "Reserved"
    COMMITTED = "committed", "Committed"
    # Its job was cancelled while its container ran: the capacity stays held until the node's
    # agent confirms the container stopped (or its node is found gone), so nothing else is
    # placed there during the stop grace (docs/leases.md, "Stopping").
    STOPPING = "stopping", "Stopping"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"
    UNCERTAIN = "uncertain", "Uncertain"


S = LeaseState
# Leases that hold capacity on their node (the ledger is the sum of these).
HOLDING = frozenset({S.RESERVED, S.COMMITTED, S.UNCERTAIN, S.STOPPING})
TERMINAL = frozenset({S.RELEASED, S.EXPIRED})

LEASE_TRANSITIONS: dict[str, frozenset[str]] = {
    S.RESERVED: frozenset({S.COMMITTED, S.RELEASED, S.EXPIRED}),
    S.COMMITTED: frozenset({S.RELEASED, S.UNCERTAIN, S.EXPIRED, S.STOPPING}),
    S.UNCERTAIN: frozenset({S.COMMITTED, S.RELEASED, S.EXPIRED, S.STOPPING}),
    S.STOPPING: frozenset({S.RELEASED, S.EXPIRED}),
    S.RELEASED: frozenset(),
    S.EXPIRED: frozenset(),
}
