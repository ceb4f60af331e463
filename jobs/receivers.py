"""What node events mean to the jobs on the node (connected in JobsConfig.ready()): a node
whose reported capacity shrank under its placed or running jobs (nodes/signals.py
`capacity_vanished`) ends the attempts that no longer fit there (jobs.lifecycle)."""

from __future__ import annotations

from django.db import transaction

from leases.choices import HOLDING
from leases.models import Lease
from nodes.services import node_allocatable_lower
from pools.actors import Actor

from . import selectors
from .choices import ACTIVE, TERMINAL
from .lifecycle import job_capacity_vanished
from .models import Job

DIMENSIONS = ("cpu_millicores", "memory_mib", "scratch_mib")


def vanished_under(leases, shortfall: dict, gpus) -> list:
    """Which of the node's job leases (newest first) lose their capacity: every one holding a
    vanished device, then the newest others until the shortfall of each dimension is covered.
    Pure over the leases' `gpu_allocations` and dimensions."""
    gpus = set(gpus)
    left = {d: v for d, v in shortfall.items() if v > 0}
    chosen = []
    for lease in leases:
        if any(a.get("gpu") in gpus for a in lease.gpu_allocations or ()):
            chosen.append(lease)
            for dimension in left:
                left[dimension] -= getattr(lease, dimension)
    for lease in leases:
        if not any(v > 0 for v in left.values()):
            break
        if lease in chosen or not any(getattr(lease, d) > 0 for d, v in left.items() if v > 0):
            continue
        chosen.append(lease)
        for dimension in left:
            left[dimension] -= getattr(lease, dimension)
    return chosen


def on_capacity_vanished(
    sender, *, node, shortfall: dict, gpus, actor: Actor, now, allocatable=None, inventory=None, **_
):
    """Sent once the node's row lock is released (nodes.services.inventory): the victims are
    decided from the node's holding leases as they are now, then each job ends in its own
    transaction in the usual lock order (job → lease → node), the node's allocatable lowered
    toward the report in the same commit (never below what its leases then hold). A victim
    that ended or moved meanwhile is left alone: the sender asks again while still short."""
    # one query, one snapshot: what the node's leases hold now (its ledger), and its jobs' ones
    holding = list(
        Lease.objects.filter(node=node, state__in=HOLDING)
        .select_related("job")
        .order_by("-created_at", "-id")
    )
    if allocatable:
        # short by what they hold now: a job that ended since the sender looked freed its part
        shortfall = {
            dimension: short
            for field, value in allocatable.items()
            if (dimension := field.removesuffix("_allocatable")) in DIMENSIONS
            and (short := sum(getattr(lease, dimension) for lease in holding) - value) > 0
        }
    leases = [lease for lease in holding if lease.job_id and lease.job.state in ACTIVE]
    for lease in vanished_under(leases, shortfall, gpus):
        lost = [a.get("gpu") for a in lease.gpu_allocations or () if a.get("gpu") in set(gpus)]
        what = ", ".join(
            [f"{d} short by {v}" for d, v in shortfall.items() if v > 0]
            + ([f"{len(lost)} of its GPUs gone"] if lost else [])
        )
        with transaction.atomic():
            job_capacity_vanished(
                job=lease.job,
                actor=actor,
                message=f"node {node.name} reported less capacity than it holds ({what})",
                data={"node": node.name, "lease": lease.pk, "shortfall": shortfall, "gpus": lost},
                now=now,
                lease=lease,
            )
            if allocatable:
                node_allocatable_lower(node=node, allocatable=allocatable, inventory=inventory)


def on_storage_statement(sender, lease, **kwargs) -> dict | None:
    """A job's lease says what its job's statement says (leases/signals.py
    `storage_statement`), with this lease as the lease."""
    job = lease.job
    return None if job is None else selectors.job_storage(job, lease=lease)


def on_volume_jobs(sender, *, volume_id: int, **kwargs) -> list[int]:
    """The jobs that have not ended and mount the volume (storage/signals.py `volume_jobs`):
    its delete is refused and its retention waits while there are any. Read over the jobs of
    the volume's tenant and pool that mount something (JSON containment is PostgreSQL's only;
    `make run` is SQLite)."""
    volume = sender.objects.filter(pk=volume_id).values("tenant_id", "pool_id").first()
    if volume is None:
        return []
    rows = (
        Job.objects.filter(tenant_id=volume["tenant_id"], pool_id=volume["pool_id"])
        .exclude(state__in=TERMINAL)
        .exclude(volumes=[])
        .values_list("pk", "volumes")
    )
    return [
        pk
        for pk, mounts in rows
        if any(isinstance(m, dict) and m.get("volume") == volume_id for m in mounts or ())
    ]
