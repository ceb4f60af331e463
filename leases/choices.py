from django.db import models


class LeaseState(models.TextChoices):
    RESERVED = "reserved", "Reserved"
    COMMITTED = "committed", "Committed"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"
    UNCERTAIN = "uncertain", "Uncertain"


S = LeaseState
# Leases that hold capacity on their node (the ledger is the sum of these).
HOLDING = frozenset({S.RESERVED, S.COMMITTED, S.UNCERTAIN})
TERMINAL = frozenset({S.RELEASED, S.EXPIRED})

LEASE_TRANSITIONS: dict[str, frozenset[str]] = {
    S.RESERVED: frozenset({S.COMMITTED, S.RELEASED, S.EXPIRED}),
    S.COMMITTED: frozenset({S.RELEASED, S.UNCERTAIN, S.EXPIRED}),
    S.UNCERTAIN: frozenset({S.COMMITTED, S.RELEASED, S.EXPIRED}),
    S.RELEASED: frozenset(),
    S.EXPIRED: frozenset(),
}
