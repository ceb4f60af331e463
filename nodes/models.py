"""Nodes, their GPUs, and the per-node capacity ledger.

The ledger columns (`*_reserved`) are changed only by guarded UPDATEs in scheduling.services
(compare-and-set), and the database itself refuses a row where reserved exceeds allocatable
(CHECK constraints), so no code path can overcommit a node, whatever it does.
"""

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from pools.choices import Architecture
from pools.statemachine import EventBase

from .choices import NodeState


class Node(models.Model):
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
    runtimes = models.JSONField(default=list, blank=True)
    features = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    region = models.CharField(max_length=40, blank=True)
    zone = models.CharField(max_length=40, blank=True)
    rack = models.CharField(max_length=40, blank=True)
    network_class = models.CharField(max_length=40, blank=True)
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
    numa_layout = models.JSONField(default=list, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
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
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80)
    model = models.CharField(max_length=60)
    memory_mib = models.PositiveIntegerField()
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=20, blank=True)
    mig_enabled = models.BooleanField(default=False)
    interconnect_group = models.CharField(max_length=40, blank=True, help_text="NVLink domain")
    numa_node = models.SmallIntegerField(null=True, blank=True)
    healthy = models.BooleanField(default=True)
    health_reason = models.CharField(max_length=200, blank=True)
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
    subject_field = "node"
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")

    class Meta(EventBase.Meta):
        pass
