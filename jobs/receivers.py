"""What node events mean to the jobs on the node (connected in JobsConfig.ready()): a node
whose reported capacity shrank under its placed or running jobs (nodes/signals.py
`capacity_vanished`) ends the attempts that no longer fit there (jobs.lifecycle)."""

from __future__ import annotations

from leases.choices import HOLDING
from leases.models import Lease
from pools.actors import Actor

from .choices import ACTIVE
from .lifecycle import job_capacity_vanished

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


def on_capacity_vanished(sender, *, node, shortfall: dict, gpus, actor: Actor, now, **_):
    leases = list(
        Lease.objects.filter(node=node, state__in=HOLDING, job__state__in=ACTIVE)
        .select_related("job")
        .order_by("-created_at", "-id")
    )
    for lease in vanished_under(leases, shortfall, gpus):
        lost = [a.get("gpu") for a in lease.gpu_allocations or () if a.get("gpu") in set(gpus)]
        what = ", ".join(
            [f"{d} short by {v}" for d, v in shortfall.items() if v > 0]
            + ([f"{len(lost)} of its GPUs gone"] if lost else [])
        )
        job_capacity_vanished(
            job=lease.job,
            actor=actor,
            message=f"node {node.name} reported less capacity than it holds ({what})",
            data={"node": node.name, "lease": lease.pk, "shortfall": shortfall, "gpus": lost},
            now=now,
        )
