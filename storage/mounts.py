"""A job's volume mounts against the volumes themselves (the submit's check, and what the
scheduler and the agent are told): the tenant's own live volumes of the job's pool, all on one
node (a node-local volume pins the job there: docs/storage.md "Persistent volumes")."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError

from nodes.choices import NodeState

from .choices import LIVE
from .models import Volume


class MountRefused(ValueError):
    """Why a job cannot mount what it names (a 400 on `volumes`)."""


@dataclass(frozen=True)
class Pinned:
    node_name: str
    writes: tuple[int, ...]  # the volumes it mounts read-write


def resolve(tenant, pool, mounts: list[dict]) -> Pinned | None:
    """The node the mounts pin the job to (None: no mounts), or MountRefused. Another tenant's
    volume reads as one that does not exist."""
    if not mounts:
        return None
    ids = [m["volume"] for m in mounts]
    volumes = {
        v.pk: v
        for v in Volume.objects.filter(pk__in=ids, tenant=tenant).select_related("node", "pool")
    }
    for index, mount in enumerate(mounts):
        volume = volumes.get(mount["volume"])
        if volume is None:
            raise MountRefused(
                f"Mount {index}: tenant {tenant.slug} has no volume {mount['volume']}."
            )
        if volume.state not in LIVE:
            raise MountRefused(f"Mount {index}: volume {volume.name} is {volume.state}.")
        if volume.pool_id != pool.pk:
            raise MountRefused(
                f"Mount {index}: volume {volume.name} is in pool {volume.pool.slug}, "
                f"not {pool.slug}."
            )
        if volume.node.state == NodeState.RETIRED:
            raise MountRefused(f"Mount {index}: volume {volume.name}'s node is retired.")
    nodes = {volumes[i].node.name for i in ids}
    if len(nodes) > 1:
        raise MountRefused(
            f"The volumes live on different nodes ({', '.join(sorted(nodes))}): a job mounts "
            "volumes of one node only."
        )
    writes = tuple(sorted(m["volume"] for m in mounts if not m["read_only"]))
    return Pinned(node_name=nodes.pop(), writes=writes)


def assignment_volumes(mounts: list[dict]) -> list[dict]:
    """What the agent is told of a job's mounts: each volume's id, size, path and mode."""
    if not mounts:
        return []
    sizes = dict(
        Volume.objects.filter(pk__in=[m["volume"] for m in mounts]).values_list("pk", "size_mib")
    )
    return [
        {
            "id": m["volume"],
            "size_mib": sizes.get(m["volume"], 0),
            "path": m["path"],
            "read_only": bool(m["read_only"]),
        }
        for m in mounts
        if m["volume"] in sizes
    ]


def volume_placement(tenant, pool, mounts: list[dict] | None) -> dict:
    """The keys a job's request carries for its mounts (`jobs.services.job_submit`): its
    volumes' node as `node_pin` (the core's hard filter) and `volume_node`, and the volumes it
    writes as `volume_writes` (the pass holds it while another job writes one); {} without
    mounts. A mount that cannot be is a ValidationError on `volumes` (400)."""
    try:
        pinned = resolve(tenant, pool, mounts or [])
    except MountRefused as error:
        raise ValidationError({"volumes": [str(error)]}) from error
    if pinned is None:
        return {}
    placement = {"node_pin": pinned.node_name, "volume_node": pinned.node_name}
    if pinned.writes:
        placement["volume_writes"] = list(pinned.writes)
    return placement
