"""Leases: time-bounded claims on capacity of one node (and, for GPUs, exact devices)."""

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from pools.statemachine import EventBase
from pools.visibility import Visibility, VisibleQuerySet

from .choices import HOLDING, LeaseState


def new_fencing_token() -> int:
    return secrets.randbits(62)


MIG_COMPUTE_SLICES = 7  # a full MIG device (7g.*) has 7 compute slices


def gpu_share(allocations) -> float:
    """How much GPU a lease holds, in whole GPUs: an exclusive device 1, a time-slice or MPS
    share its milli / 1000, a MIG slice its compute slices out of the device's 7 (the "g" of
    its profile: 1g.10gb is 1/7 of a 7g.80gb, 3g.40gb 3/7; memory does not count). Quotas and
    fair share count GPUs with this rule alone."""
    total = 0.0
    for allocation in allocations:
        profile = allocation.get("mig_profile") or ""
        if profile or allocation.get("mig_slots"):
            g = profile.split("g.", 1)[0]
            if g.isdigit():
                total += min(int(g), MIG_COMPUTE_SLICES) / MIG_COMPUTE_SLICES
            else:  # no profile recorded: its memory slices, at most the whole device
                slices = bin(int(allocation.get("mig_slots") or 0)).count("1")
                total += min(slices, MIG_COMPUTE_SLICES) / MIG_COMPUTE_SLICES
        else:
            total += allocation.get("milli", 1000) / 1000
    return total


class LeaseQuerySet(VisibleQuerySet):
    def holding(self):
        return self.filter(state__in=HOLDING)


class Lease(models.Model):
    objects = LeaseQuerySet.as_manager()
    visibility = Visibility(tenant="tenant", node="node")

    # indexed by (pool, state) below: a pool-only index would be one more to write per lease
    pool = models.ForeignKey(
        "pools.ComputePool", on_delete=models.PROTECT, related_name="leases", db_index=False
    )
    tenant = models.ForeignKey("pools.Tenant", on_delete=models.PROTECT, related_name="leases")
    # indexed by (node, state) below: the snapshot reads each node's holding leases by both,
    # and an index on the node alone left the planner free to combine it with another one
    node = models.ForeignKey(
        "nodes.Node", on_delete=models.PROTECT, related_name="leases", db_index=False
    )
    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="leases"
    )
    state = models.CharField(max_length=10, choices=LeaseState.choices, default=LeaseState.RESERVED)
    state_changed_at = models.DateTimeField(default=timezone.now)
    # what was reserved on the node (the ledger holds the sum of these for HOLDING leases)
    cpu_millicores = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField()
    scratch_mib = models.PositiveIntegerField(default=0)
    gpu_allocations = models.JSONField(
        default=list,
        blank=True,
        help_text='[{"gpu": id, "index": i, "milli": m, "mig_slots": mask}]',
    )
    request = models.JSONField(default=dict, help_text="The resource request as asked")
    placement = models.JSONField(default=dict, help_text="Granted values and score breakdown")
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=new_fencing_token)
    # indexed by (state, expires_at) below, which every query on it filters by state too
    expires_at = models.DateTimeField()
    committed_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # When the node's agent made its final report under this lease (the job's end, a
    # checkpoint): its callbacks after that are refused (409 lease_ended, jobs/lifecycle.py).
    final_report_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=100, blank=True)
    # What the keyed reserve asked for (pool, resources, duration or window), so a retry with
    # the same key and another body is refused instead of answered with this lease.
    idempotency_digest = models.CharField(max_length=64, blank=True, default="")
    # A reservation for scheduled work: holds its capacity for the window (start, end) and must
    # be claimed (committed) within `tolerance_s` of the start, or the sweep releases it.
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    tolerance_s = models.PositiveIntegerField(default=0)
    # Backfill: short work running inside a reservation's hold before its window opens. Such a
    # lease holds nothing on the node ledger itself; it borrows from `backfill_of`.
    # indexed below over the few leases that name one: a scheduling pass writes none
    backfill_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="backfills",
        db_index=False,
    )
    uncertain_since = models.DateTimeField(null=True, blank=True)
    # Measured consumption reported by the node's agent (held ≠ consumed).
    used_cpu_millicores = models.PositiveIntegerField(null=True, blank=True)
    used_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    used_gpu_milli = models.PositiveIntegerField(null=True, blank=True)
    usage_reported_at = models.DateTimeField(null=True, blank=True)
    # Over the job's run, from its node's heartbeats (leases/receivers.py): the peak and the
    # running average of each measure above ({"cpu_millicores", "memory_mib", "gpu_milli",
    # "gpu_memory_mib"}), and how many samples the average holds.
    usage_peak = models.JSONField(default=dict, blank=True)
    usage_average = models.JSONField(default=dict, blank=True)
    usage_samples = models.PositiveIntegerField(default=0)
    # Where the running job answers: {"host": "10.0.0.5", "ports": {"8080": 32768}}.
    route = models.JSONField(default=dict, blank=True)
    # indexed below over the leases a person made (a user's deletion sets it to NULL): the
    # scheduler's leases name nobody
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "scheduling_lease"  # created when leases lived in scheduling/; kept as is
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="lease_idempotency_key_unique_per_tenant",
            )
        ]
        # Every lease a scheduling pass writes takes an entry in each index that covers it: the
        # two foreign keys that are mostly NULL are indexed over the rows that name one only
        # (they serve `= id` and `IN (ids)`, the deletion cascades included)
        indexes = [
            models.Index(fields=["state", "expires_at"]),
            models.Index(fields=["pool", "state"]),
            models.Index(fields=["node", "state"], name="lease_node_state"),
            models.Index(
                fields=["backfill_of"],
                condition=models.Q(backfill_of__isnull=False),
                name="lease_backfill_of_partial",
            ),
            models.Index(
                fields=["created_by"],
                condition=models.Q(created_by__isnull=False),
                name="lease_created_by_partial",
            ),
        ]

    def __str__(self):
        return f"lease {self.pk} on {self.node_id} ({self.state})"

    @property
    def is_reservation(self) -> bool:
        return self.window_start is not None

    @property
    def gpu_milli(self) -> int:
        return sum(a.get("milli", 0) for a in self.gpu_allocations)

    @property
    def gpu_share(self) -> float:
        return gpu_share(self.gpu_allocations)


class LeaseEvent(EventBase):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="lease__tenant", node="lease__node")
    subject_field = "lease"
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="events")

    class Meta(EventBase.Meta):
        db_table = "scheduling_leaseevent"
