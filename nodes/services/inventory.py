"""Inventory: the agent reports what the node has now; the reconciliation sweep compares it
with the registered inventory and adjusts capacity (or quarantines) on drift."""

import logging
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from pools.actors import Actor
from pools.choices import TrustLevel
from pools.reasons import Reason
from pools.statemachine import record_sweep_failure
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
from .storage import node_disk_ceiling

log = logging.getLogger(__name__)


def node_inventory_report(*, node: Node, inventory: dict, now=None) -> Node:
    """Store what the node reports now; the reconciliation sweep compares it with the claims."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).update(
        reported_inventory=normalize_inventory(inventory), inventory_reported_at=now
    )
    node.refresh_from_db()
    return node


# Rounds of ending jobs under a shrunk node before its allocatable is left at what its leases
# hold (a job placed on the capacity in the instant between two rounds, say): the next drift
# reconciles again.
SHRINK_ROUNDS = 3


@dataclass(frozen=True)
class Shrink:
    """A node's registered capacity that came out below what its leases hold, or devices that
    vanished under them: what `_shrink_under_leases` ends and lowers once the node's row lock is
    released."""

    node: int
    allocatable: dict  # {"<dimension>_allocatable": the reported value} of the short dimensions
    shortfall: dict  # {dimension: how much more its leases hold than it now has}
    gpus: tuple  # ids of its devices that vanished
    inventory: dict  # the registered inventory it was computed for


def node_inventory_reconcile(*, node: Node, actor: Actor, now=None) -> list[dict]:
    """Compare the latest report with the registered inventory; adjust capacity on drift.

    Drift records an inventory_drift event and makes the report the registered inventory
    (raw and allocatable recomputed; a vanished GPU is marked missing and unschedulable). Large
    drift, or any drift in a marketplace pool, also quarantines the node.

    A shrink under the node's leases (less than they hold, or their devices gone) caps the
    allocatable at what they hold under the node's row lock; the jobs that lost their capacity
    end after that lock is released (`capacity_vanished`), each in its own transaction taking
    the usual order (job → lease → node) and lowering the allocatable toward the report in the
    same commit. So call it outside a transaction: never with the node's row locked."""
    now = now or timezone.now()
    diffs, shrink = _reconcile(node, actor, now)
    if shrink is not None:
        _shrink_under_leases(shrink, actor, now)
    return diffs


def _reconcile(node: Node, actor: Actor, now) -> tuple[list[dict], Shrink | None]:
    """The reconciliation under the node's row lock: (the differences, what to shrink after)."""
    with transaction.atomic():
        node = Node.objects.select_for_update().select_related("pool").get(pk=node.pk)
        reported = node.reported_inventory
        if reported is None or node.state == NodeState.RETIRED:
            return [], None
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
            return [], None
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
        ceiling = node_disk_ceiling(node)
        if ceiling is not None:
            # never more scratch than the disk the heartbeats report can hold (storage.py);
            # a disk short of what is reserved is reported there, and no job ends for it here
            scratch = allocatable["scratch_mib_allocatable"]
            allocatable["scratch_mib_allocatable"] = max(
                min(scratch, ceiling), node.scratch_mib_reserved
            )
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
        shrink = None
        if shortfall or vanished:
            shrink = Shrink(
                node=node.pk,
                allocatable={
                    f"{d}_allocatable": reported_allocatable[f"{d}_allocatable"] for d in shortfall
                },
                shortfall=shortfall,
                gpus=tuple(vanished),
                inventory=reported,
            )
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
    return diffs, shrink


def node_allocatable_lower(*, node: Node, allocatable: dict, inventory: dict) -> bool:
    """Lower the node's allocatable toward `allocatable` ({"<dimension>_allocatable": value}),
    never below what its holding leases reserve (the same UPDATE reads them: the check
    constraints hold at every commit), and only while `inventory` is still its registered one
    (a newer reconciliation owns the node's capacity). Locks the node's row: in a transaction
    that locks a job or a lease, call it after them (job → lease → node)."""
    if not allocatable:
        return False
    return bool(
        Node.objects.filter(pk=node.pk, inventory=inventory).update(
            **{
                field: Greatest(
                    Value(value, output_field=Node._meta.get_field(field)),
                    F(field.replace("_allocatable", "_reserved")),
                )
                for field, value in allocatable.items()
            }
        )
    )


def _shrink_under_leases(shrink: Shrink, actor: Actor, now) -> None:
    """The node has less than its leases hold, or lost devices they hold (its row lock is no
    longer held): the jobs above end the attempts that lost their capacity, each in its own
    transaction (nodes.signals.capacity_vanished), then the node's allocatable comes down to
    what it reported, never below what its live leases still hold. Short still (a job ended
    otherwise meanwhile while another was placed), the jobs above are asked again."""
    shortfall, gpus = shrink.shortfall, list(shrink.gpus)
    for _ in range(SHRINK_ROUNDS):
        node = Node.objects.get(pk=shrink.node)
        capacity_vanished.send(
            sender=Node,
            node=node,
            shortfall=shortfall,
            gpus=gpus,
            allocatable=shrink.allocatable,
            inventory=shrink.inventory,
            actor=actor,
            now=now,
        )
        with transaction.atomic():
            node = Node.objects.select_for_update().get(pk=shrink.node)
            if node.inventory != shrink.inventory:
                return  # reconciled again since: that reconciliation owns the capacity
            node_allocatable_lower(
                node=node, allocatable=shrink.allocatable, inventory=shrink.inventory
            )
            node.refresh_from_db()
            shortfall = {
                field.removesuffix("_allocatable"): held - value
                for field, value in shrink.allocatable.items()
                if (held := getattr(node, field.replace("_allocatable", "_reserved"))) > value
            }
        if not shortfall:
            return
        gpus = []  # the devices' jobs were asked in the first round
    log.warning(
        "node %s: its leases still hold %s more than it reported after %d rounds",
        shrink.node,
        shortfall,
        SHRINK_ROUNDS,
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
        lambda node: _reconcile(node, actor, now),
        event_model=NodeEvent,
        actor=actor,
        now=now,
    )
    # after the sweep's row locks are released (node_inventory_reconcile)
    for pk, (_, shrink) in results.items():
        if shrink is None:
            continue
        try:
            _shrink_under_leases(shrink, actor, now)
        except Exception as error:
            record_sweep_failure(Node, pk, event_model=NodeEvent, actor=actor, error=error, now=now)
    return {pk: diffs for pk, (diffs, _) in results.items() if diffs}
