"""Inventory: the agent reports what the node has now; the reconciliation sweep compares it
with the registered inventory and adjusts capacity (or quarantines) on drift."""

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from pools.actors import Actor
from pools.choices import TrustLevel
from pools.reasons import Reason
from pools.sweeps import sweep

from ..capacity import allocatable_from_raw
from ..choices import GpuHealth, NodeState
from ..inventory import (
    describe_drift,
    gpu_model_fields,
    inventory_drift,
    learned_capabilities,
    normalize_inventory,
)
from ..models import GpuDevice, Node, NodeEvent
from ..signals import capacity_vanished
from .base import node_event
from .health import gpu_mark_unsuitable
from .lifecycle import node_quarantine


def node_inventory_report(*, node: Node, inventory: dict, now=None) -> Node:
    """Store what the node reports now; the reconciliation sweep compares it with the claims."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).update(
        reported_inventory=normalize_inventory(inventory), inventory_reported_at=now
    )
    node.refresh_from_db()
    return node


def node_inventory_reconcile(*, node: Node, actor: Actor, now=None) -> list[dict]:
    """Compare the latest report with the registered inventory; adjust capacity on drift.

    Drift records an inventory_drift event and makes the report the registered inventory
    (raw and allocatable recomputed; a vanished GPU is marked missing and unschedulable). Large
    drift, or any drift in a marketplace pool, also quarantines the node.
    """
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().select_related("pool").get(pk=node.pk)
        reported = node.reported_inventory
        if reported is None or node.state == NodeState.RETIRED:
            return []
        diffs, large = inventory_drift(node.inventory, reported)
        node.inventory_reconciled_at = now
        if not diffs:
            saved = ["inventory_reconciled_at"]
            if learned := learned_capabilities(node.inventory, reported):
                for uuid, capability in learned.items():
                    GpuDevice.objects.filter(node=node, uuid=uuid).update(
                        compute_capability=capability
                    )
                for gpu in node.inventory.get("gpus") or ():
                    if gpu["uuid"] in learned:
                        gpu["compute_capability"] = learned[gpu["uuid"]]
                saved.append("inventory")
            node.save(update_fields=saved)
            return []
        pool = node.pool
        allocatable = allocatable_from_raw(
            pool,
            cpu_millicores=reported["cpu_millicores"],
            memory_mib=reported["memory_mib"],
            scratch_mib=reported["scratch_mib"],
        )
        capped, shortfall, reported_allocatable = [], {}, dict(allocatable)
        for dimension in ("cpu_millicores", "memory_mib", "scratch_mib"):
            reserved = getattr(node, f"{dimension}_reserved")
            if allocatable[f"{dimension}_allocatable"] < reserved:
                # the ledger never goes below what live leases hold: the jobs that lost their
                # capacity end (capacity_vanished, below), then it shrinks to what is left
                shortfall[dimension] = reserved - allocatable[f"{dimension}_allocatable"]
                allocatable[f"{dimension}_allocatable"] = reserved
                capped.append(dimension)
        node.cpu_millicores_raw = reported["cpu_millicores"]
        node.memory_mib_raw = reported["memory_mib"]
        node.scratch_mib_raw = reported["scratch_mib"]
        for field, value in allocatable.items():
            setattr(node, field, value)
        node.inventory = reported
        if reported.get("numa"):
            node.numa_layout = reported["numa"]
        node.save(
            update_fields=[
                "cpu_millicores_raw",
                "memory_mib_raw",
                "scratch_mib_raw",
                *allocatable,
                "inventory",
                "numa_layout",
                "inventory_reconciled_at",
            ]
        )
        new_gpus = {g["uuid"]: g for g in reported["gpus"]}
        vanished = []
        for gpu in node.gpus.all():
            if gpu.uuid not in new_gpus:
                vanished.append(gpu.pk)
                gpu_mark_unsuitable(
                    gpu=gpu,
                    health=GpuHealth.MISSING,
                    flags=["missing"],
                    reason_text="no longer reported by the node",
                    actor=actor,
                    now=now,
                )
                continue
            fields = gpu_model_fields(new_gpus.pop(gpu.uuid))
            fields.pop("index")
            GpuDevice.objects.filter(pk=gpu.pk).update(**fields)
        taken = set(node.gpus.values_list("index", flat=True))
        for gpu in new_gpus.values():
            fields = gpu_model_fields(gpu)
            if fields["index"] in taken:
                fields["index"] = max(taken) + 1
            taken.add(fields["index"])
            GpuDevice.objects.create(node=node, **fields)
        text = "; ".join(describe_drift(d) for d in diffs)
        data = {"differences": diffs, "capped_by_reserved": capped, "large": large}
        node_event(
            node, actor=actor, reason=Reason.INVENTORY_DRIFT, message=text, now=now, data=data
        )
        if shortfall or vanished:
            _capacity_vanished(node, shortfall, vanished, reported_allocatable, actor, now)
        untrusted = pool.trust_level == TrustLevel.MARKETPLACE
        if (large or untrusted) and node.state != NodeState.QUARANTINED:
            node_quarantine(
                node=node,
                actor=actor,
                reason=Reason.INVENTORY_DRIFT,
                message=("large drift: " if large else "drift in an untrusted pool: ") + text,
                data=data,
                now=now,
            )
    return diffs


def _capacity_vanished(node, shortfall, gpus, reported_allocatable, actor, now) -> None:
    """The node has less than its leases hold, or lost devices they hold: the jobs above end the
    attempts that lost their capacity (nodes.signals.capacity_vanished), then the node's
    allocatable comes down to what it reported, never below what its live leases still hold."""
    capacity_vanished.send(
        sender=Node, node=node, shortfall=shortfall, gpus=gpus, actor=actor, now=now
    )
    if not shortfall:
        return
    fields = [f"{dimension}_reserved" for dimension in shortfall]
    held = Node.objects.filter(pk=node.pk).values(*fields).get()
    Node.objects.filter(pk=node.pk).update(
        **{
            f"{d}_allocatable": max(reported_allocatable[f"{d}_allocatable"], held[f"{d}_reserved"])
            for d in shortfall
        }
    )


def inventory_reconcile_sweep(*, now=None) -> dict[int, list[dict]]:
    """Reconcile every node with a report newer than its last reconciliation."""
    now = now or timezone.now()
    actor = Actor.system("reconciliation")
    pending = (
        Node.objects.exclude(state=NodeState.RETIRED)
        .filter(inventory_reported_at__isnull=False)
        .filter(
            Q(inventory_reconciled_at__isnull=True)
            | Q(inventory_reconciled_at__lt=F("inventory_reported_at"))
        )
    )
    results = sweep(
        pending,
        lambda node: node_inventory_reconcile(node=node, actor=actor, now=now),
        event_model=NodeEvent,
        actor=actor,
        now=now,
    )
    return {pk: diffs for pk, diffs in results.items() if diffs}
