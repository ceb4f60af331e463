"""The leases services: the capacity ledger's only writers. Every state change writes a
LeaseEvent with a reason code. Callers use `from leases import services`; the modules:

- `reserve`: lease_reserve (snapshot → core → guarded writes, re-planned on conflict), the
  refusals (409 not now / 422 never), check_ever_fits and explain_request (the answer now,
  reserving nothing)
- `group_commit`: concurrent reserves of one process combined into one transaction
- `ledger`: `apply`, the one write of new leases for every writer (a reserve is a batch of
  one), in one lock order; the race hook for tests
- `capacity`: the capacity guards, each stated once (ORM and SQL), the guarded UPDATEs that
  take capacity and the decrements that return it
- `lease_rows`: the one builder of a new lease and its event, and their inserts
- `quota`: the per-tenant quota check over every dimension, `tenants_at_quota`, the batch
  pass's `Headroom`
- `credits`: charging tenants' credit accounts for held and consumed lease time
- `backfill`: short work inside a reservation's hold before its window opens
- `lifecycle`: commit, renew, release, uncertain, reconcile, stopping, usage,
  `lease_transition`
- `sweeps`: expiry, uncertain deadline, unclaimed reservations
- `usage`: what a heartbeat means for the leases of running jobs (renewal, usage), routes
"""

from leases.explain import IdempotencyKeyReused, NeverFits, NoCapacity
from leases.window import Window

from .lifecycle import (
    lease_commit,
    lease_mark_uncertain,
    lease_reconcile,
    lease_record_final_report,
    lease_release,
    lease_renew,
    lease_report_usage,
    lease_stop,
    lease_stopped,
    lease_transition,
)
from .quota import tenants_at_quota
from .reserve import (
    SCHEDULER_KEY_PREFIX,
    check_ever_fits,
    explain_request,
    lease_reserve,
)
from .sweeps import expire_leases, expire_uncertain, release_unclaimed_reservations
from .usage import lease_set_route, leases_record_usage, leases_renew_by_heartbeat

__all__ = [
    "SCHEDULER_KEY_PREFIX",
    "IdempotencyKeyReused",
    "NeverFits",
    "NoCapacity",
    "Window",
    "check_ever_fits",
    "expire_leases",
    "expire_uncertain",
    "explain_request",
    "lease_commit",
    "lease_mark_uncertain",
    "lease_reconcile",
    "lease_record_final_report",
    "lease_release",
    "lease_renew",
    "lease_report_usage",
    "lease_reserve",
    "lease_set_route",
    "lease_stop",
    "lease_stopped",
    "lease_transition",
    "leases_record_usage",
    "leases_renew_by_heartbeat",
    "release_unclaimed_reservations",
    "tenants_at_quota",
]
