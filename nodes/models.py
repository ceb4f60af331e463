"""Nodes, their GPUs, and the per-node capacity ledger.

The ledger columns (`*_reserved`) are changed only by guarded UPDATEs in leases.services
(compare-and-set), and the database itself refuses a row where reserved exceeds allocatable
(CHECK constraints), so no code path can overcommit a node, whatever it does.
"""

import uuid

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from pools.choices import Architecture, GpuSharingMode
from pools.statemachine import EventBase
from pools.visibility import Visibility, VisibleQuerySet

from .choices import GpuHealth, NodeState, ProbeKind, ProbeState, Reachability


class ControlPlane(models.Model):
    """This control plane's identity: one row, made once (by the migration, or on first read
    after a flush). Its UUID is told to each node at enrollment and starts the names of the
    containers its agents run, so agents of two control planes sharing one Docker engine never
    pick the same name nor take each other's containers (docs/nodes.md, "Enrollment")."""

    SINGLETON = 1

    id = models.PositiveSmallIntegerField(primary_key=True, default=SINGLETON, editable=False)
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="control_plane_singleton")]

    def __str__(self):
        return f"control plane {self.uuid}"


class Node(models.Model):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(node="pk")  # operators, and a node's agent its own node

    pool = models.ForeignKey("pools.ComputePool", on_delete=models.PROTECT, related_name="nodes")
    name = models.CharField(max_length=100)
    machine_id = models.CharField(max_length=100, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    state = models.CharField(
        max_length=12, choices=NodeState.choices, default=NodeState.REGISTERED, db_index=True
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    architecture = models.CharField(
        max_length=10, choices=Architecture.choices, default=Architecture.AMD64
    )
    os = models.CharField(max_length=20, default="linux")
    # the runtimes the agent offers ("docker", "gvisor", "process"): sent at enrollment and in
    # every heartbeat; the scheduler's runtime filter reads them
    runtimes = models.JSONField(default=list, blank=True)
    # What the agent's heartbeats say: the runtime it runs jobs with ("docker", or the
    # non-isolating "process") and the image digests in its local cache ("sha256:…"), which the
    # scheduler's warm-image filter and scorer read (leases/snapshot.py).
    agent_runtime = models.CharField(max_length=10, blank=True)
    cached_images = models.JSONField(default=list, blank=True)
    # {"sha256:…": seconds} the agent measured pulling each image here (newest 512 kept)
    image_pull_seconds = models.JSONField(default=dict, blank=True)
    # Data locality (docs/storage.md "Data locality"): what the agent's heartbeats say its caches
    # hold, {"sha256:…" (an image) or an input's cache key: bytes}; the throughput it measured
    # pulling images and downloading inputs (bytes/s, 0: not measured yet); the seconds each
    # input took to download, {key: seconds} (newest NODE_INPUT_DOWNLOAD_TIMES_MAX kept)
    cached_data = models.JSONField(default=dict, blank=True)
    pull_bytes_per_s = models.FloatField(default=0.0)
    download_bytes_per_s = models.FloatField(default=0.0)
    input_download_seconds = models.JSONField(default=dict, blank=True)
    # The disk that holds the agent's work root, as its heartbeats report it (statvfs), in MiB:
    # its size, what is free, and what the node's reservations (jobs' scratch and outputs
    # images, volumes) have already written there (docs/storage.md "Scratch on disk"); null:
    # never reported. `disk_short`: its free space + held is below what the node has reserved.
    disk_total_mib = models.BigIntegerField(null=True, blank=True)
    disk_free_mib = models.BigIntegerField(null=True, blank=True)
    disk_held_mib = models.BigIntegerField(null=True, blank=True)
    disk_reported_at = models.DateTimeField(null=True, blank=True)
    disk_short = models.BooleanField(default=False)
    features = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    region = models.CharField(max_length=40, blank=True)
    zone = models.CharField(max_length=40, blank=True)
    rack = models.CharField(max_length=40, blank=True)
    network_class = models.CharField(max_length=40, blank=True)
    # price per hour (a number) and energy class (0…9 or A…G, 0 = A most efficient), which the
    # `price` scorer reads; the labels computepool.io/price-per-hour and /energy-class are the
    # fallback when these are blank
    price_class = models.CharField(max_length=40, blank=True)
    # raw totals as reported; allocatable = raw − system reserve − safety margin
    cpu_millicores_raw = models.PositiveIntegerField(default=0)
    memory_mib_raw = models.PositiveIntegerField(default=0)
    scratch_mib_raw = models.PositiveIntegerField(default=0)
    cpu_millicores_allocatable = models.PositiveIntegerField(default=0)
    memory_mib_allocatable = models.PositiveIntegerField(default=0)
    scratch_mib_allocatable = models.PositiveIntegerField(default=0)
    cpu_millicores_reserved = models.PositiveIntegerField(default=0)
    memory_mib_reserved = models.PositiveIntegerField(default=0)
    scratch_mib_reserved = models.PositiveIntegerField(default=0)
    numa_layout = models.JSONField(
        default=list, blank=True, help_text='[{"id": 0, "cpus": [0, 1], "memory_mib": 65536}]'
    )
    energy_class = models.CharField(max_length=40, blank=True)
    # set by an operator: a shape's `trust_level_min` places only on nodes at least this high
    trust_level = models.PositiveSmallIntegerField(
        default=0, help_text="Operator-set; shapes may require a minimum (trust_level_min)"
    )
    # The node's identity (docs/security.md "Node identity"): the Ed25519 public key its agent
    # enrolled with (base64 of the raw 32 bytes), which every signed request must verify under,
    # and its SHA-256, the signatures' keyid. Empty for a node no agent has enrolled as yet.
    public_key = models.CharField(max_length=64, blank=True)
    identity_fingerprint = models.CharField(
        max_length=64, blank=True, help_text="SHA-256 of the node's public key (its identity)"
    )
    enrollment_token = models.ForeignKey(
        "nodes.EnrollmentToken",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="nodes",
    )
    # conditions: orthogonal to the lifecycle state
    reachability = models.CharField(
        max_length=12, choices=Reachability.choices, default=Reachability.REACHABLE
    )
    reachability_changed_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    usage = models.JSONField(default=dict, blank=True, help_text="Current usage, from heartbeats")
    # inventory: what was registered (claims, updated by reconciliation) and the latest report
    inventory = models.JSONField(default=dict, blank=True)
    reported_inventory = models.JSONField(null=True, blank=True)
    inventory_reported_at = models.DateTimeField(null=True, blank=True)
    inventory_reconciled_at = models.DateTimeField(null=True, blank=True)
    # drain: no new placements; at the deadline the remaining work is stopped per pool policy
    drain_deadline = models.DateTimeField(null=True, blank=True)
    drain_enforced_at = models.DateTimeField(null=True, blank=True)
    drained_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="node_name_unique_in_pool"),
            models.CheckConstraint(
                condition=Q(cpu_millicores_reserved__lte=F("cpu_millicores_allocatable")),
                name="node_cpu_not_overcommitted",
            ),
            models.CheckConstraint(
                condition=Q(memory_mib_reserved__lte=F("memory_mib_allocatable")),
                name="node_memory_not_overcommitted",
            ),
            models.CheckConstraint(
                condition=Q(scratch_mib_reserved__lte=F("scratch_mib_allocatable")),
                name="node_scratch_not_overcommitted",
            ),
        ]

    def __str__(self):
        return self.name


class GpuDevice(models.Model):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(node="node")

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80)
    model = models.CharField(max_length=60)
    memory_mib = models.PositiveIntegerField()
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=20, blank=True)
    # "major.minor" as the agent reads it through NVML ("9.0"); blank: not reported, which
    # meets no shape's gpu_compute_capability_min
    compute_capability = models.CharField(max_length=7, blank=True)
    mig_enabled = models.BooleanField(default=False)
    sharing_mode = models.CharField(
        max_length=10,
        choices=GpuSharingMode.choices,
        default=GpuSharingMode.EXCLUSIVE,
        help_text="How the device is offered when MIG is off: whole, time-sliced or MPS",
    )
    mig_slices = models.JSONField(
        default=list, blank=True, help_text='MIG instances: [{"profile": "1g.10gb", "start": 0}]'
    )
    interconnect_group = models.CharField(max_length=40, blank=True, help_text="NVLink domain")
    numa_node = models.SmallIntegerField(null=True, blank=True)
    # healthy=False makes this device alone unschedulable; the node keeps serving the others
    healthy = models.BooleanField(default=True)
    health = models.CharField(max_length=20, choices=GpuHealth.choices, default=GpuHealth.OK)
    health_reason = models.CharField(max_length=200, blank=True)
    health_flags = models.JSONField(default=list, blank=True)
    # its NVLink error counters at the latest reading ({"at", "counters"}): they are cumulative,
    # so the health rule compares each reading with this one (nodes/services/health.py)
    nvlink_counters = models.JSONField(default=dict, blank=True)
    temperature_c = models.SmallIntegerField(null=True, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    # ledger: thousandths of the GPU held (1000 = exclusive), and the MIG slots in use
    milli_reserved = models.PositiveSmallIntegerField(default=0)
    mig_slots_used = models.PositiveIntegerField(default=0, help_text="Bitmask of MIG slots held")
    share_tenant = models.ForeignKey(
        "pools.Tenant",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The tenant holding non-isolated shares, when mixing is not allowed",
    )

    class Meta:
        ordering = ["node", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_on_node"),
            models.UniqueConstraint(fields=["uuid"], name="gpu_uuid_unique"),
            models.CheckConstraint(
                condition=Q(milli_reserved__lte=1000), name="gpu_not_overcommitted"
            ),
        ]

    def __str__(self):
        return f"{self.node.name}/gpu{self.index} ({self.model})"


class NodeEvent(EventBase):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(node="node")
    subject_field = "node"
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")

    class Meta(EventBase.Meta):
        pass


class EnrollmentToken(models.Model):
    """Lets a node join one pool. Only the digest is stored; the secret is shown once."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only

    pool = models.ForeignKey(
        "pools.ComputePool", on_delete=models.CASCADE, related_name="enrollment_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(uses__lte=F("max_uses")), name="enrollment_token_uses_within_max"
            )
        ]

    def __str__(self):
        return f"{self.pool.slug} / {self.name or self.prefix}"

    def refusal(self, now) -> str:
        """Why this token cannot enroll a node now, or "" when it can."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= now:
            return "expired"
        if self.uses >= self.max_uses:
            return "used up"
        return ""


class NodeCredential(models.Model):
    """A node agent's secret, bound to one node; digest only, expiring, rotated with overlap."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only: an agent presents its secret, it never lists

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="credentials")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    # set when a newer credential replaced this one: it stays valid until then (overlap)
    valid_until = models.DateTimeField(null=True, blank=True)
    replaced_by = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replaces"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.node.name} / {self.prefix}…"

    def refusal(self, now) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= now:
            return "expired"
        if self.valid_until is not None and self.valid_until <= now:
            return "rotated"
        return ""


class NodeProbe(models.Model):
    """A validation probe (claims vs measured) or a device recovery probe, and its result."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(node="node")

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="probes")
    gpu = models.ForeignKey(
        GpuDevice, null=True, blank=True, on_delete=models.CASCADE, related_name="probes"
    )
    kind = models.CharField(max_length=12, choices=ProbeKind.choices)
    state = models.CharField(
        max_length=10, choices=ProbeState.choices, default=ProbeState.REQUESTED, db_index=True
    )
    expected = models.JSONField(default=dict, blank=True, help_text="The claims to compare with")
    # a validation probe's fresh seeded work (nodes/challenge.py); {} for recovery probes
    challenge = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    differences = models.JSONField(default=list, blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)
    reported_by = models.ForeignKey(
        NodeCredential, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-requested_at", "-id"]

    def __str__(self):
        return f"{self.kind} probe {self.pk} of {self.node.name} ({self.state})"
