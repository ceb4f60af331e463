"""Queue order: which queued job a pass tries first. Pure: the pass reads the rows, this orders.

`order` takes the queued jobs of one pool and each tenant's standing and returns them in the
order a pass should try them. Today: highest priority first, then the tenant that holds the
least (its dominant share of the pool over its weight), then the longest waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

RESOURCES = ("cpu_millicores", "memory_mib", "gpus")


@dataclass(frozen=True)
class QueuedJob:
    id: int
    tenant: int | str
    priority: int = 0  # the priority class's value
    waited_s: float = 0.0  # since it was (last) queued
    demand: tuple[float, float, float] = (0.0, 0.0, 0.0)  # cpu millicores, MiB, GPUs (a share)
    max_runtime_s: int | None = None
    max_wait_s: int | None = None  # its class's target


@dataclass
class TenantStanding:
    tenant: int | str
    weight: float = 1.0
    held: tuple[float, float, float] = (0.0, 0.0, 0.0)  # what it holds now, as `demand`


@dataclass(frozen=True)
class QueuePolicy:
    pass


def dominant_share(held, capacity) -> float:
    """The largest fraction of any resource of the pool that `held` is (DRF's dominant share)."""
    return max((h / c for h, c in zip(held, capacity, strict=True) if c > 0), default=0.0)


def order(
    jobs: list[QueuedJob],
    standings: dict,
    capacity: tuple[float, float, float],
    policy: QueuePolicy | None = None,
) -> list[QueuedJob]:
    def key(job: QueuedJob):
        standing = standings.get(job.tenant) or TenantStanding(job.tenant)
        share = dominant_share(standing.held, capacity) / max(standing.weight, 1e-9)
        return (-job.priority, share, -job.waited_s, job.id)

    return sorted(jobs, key=key)
