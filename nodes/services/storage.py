"""A node's disk and caches, as its agent's heartbeats report them (docs/storage.md, "Scratch on
disk" and "Data locality").

The disk: the scheduler's scratch (`scratch_mib_allocatable`) follows what the disk that holds
the agent's work root can really hold (`disk_ceiling_mib`, rule below), lowered or raised by one
guarded UPDATE under the node's row lock that never goes below what the node's leases and volumes
reserve; a disk that can no longer hold what is reserved is reported (`disk_short`) and takes no
new scratch until it can (`disk_recovered`).

The caches: image digests and input keys with their sizes (`Node.cached_data`), what the
`data_locality` scorer reads; the throughput measured pulling images and downloading inputs."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest

from pools.actors import Actor
from pools.reasons import Reason

from ..capacity import allocatable_from_raw
from ..conf import setting
from ..models import Node
from .base import node_event

MIB = 1024 * 1024
# How much a new throughput measurement moves the node's figure (exponential average).
RATE_WEIGHT = 0.5


def disk_ceiling_mib(pool, *, free_bytes: int, held_bytes: int) -> int:
    """The most scratch the node's disk can honour, reservations included: its free space plus
    what the node's reservations have already written there, less the pool's safety margin.

    Why free + held (and not free + reserved − written): a reservation is a sparse image that
    fills as its job writes. What it wrote is already counted out of `free`, and its unwritten
    rest still has to come out of `free`. So the reservations and any new work together can
    use exactly free + written; every reserved MiB is inside that ceiling, and the ceiling does
    not move while a job fills its own scratch."""
    keep = (100 - pool.safety_margin_percent) / 100
    return max(0, int((free_bytes + held_bytes) // MIB * keep))


def node_disk_ceiling(node: Node) -> int | None:
    """The node's last reported ceiling (None: its agent never reported its disk)."""
    if node.disk_free_mib is None:
        return None
    return disk_ceiling_mib(
        node.pool,
        free_bytes=node.disk_free_mib * MIB,
        held_bytes=(node.disk_held_mib or 0) * MIB,
    )


def node_disk_report(*, node: Node, disk: dict, actor: Actor, now) -> Node:
    """Record the disk the agent reports and reconcile the node's scratch with it:
    allocatable = min(what the inventory gives, the disk's ceiling), never below what is
    reserved (the same UPDATE reads it, under the row lock: the check constraint
    node_scratch_not_overcommitted holds at every commit). A ceiling below the reserved amount
    writes `disk_short` (once, until `disk_recovered`): the node takes no new scratch then, as
    its free scratch is 0."""
    with transaction.atomic():
        row = (
            Node.objects.select_for_update(of=("self",))
            .select_related("pool")
            .only(
                "state",
                "pool",
                "scratch_mib_raw",
                "scratch_mib_allocatable",
                "scratch_mib_reserved",
                "disk_short",
            )
            .get(pk=node.pk)
        )
        ceiling = disk_ceiling_mib(
            row.pool, free_bytes=disk["free_bytes"], held_bytes=disk["held_bytes"]
        )
        from_inventory = allocatable_from_raw(
            row.pool, cpu_millicores=0, memory_mib=0, scratch_mib=row.scratch_mib_raw
        )["scratch_mib_allocatable"]
        target = min(from_inventory, ceiling)
        short = ceiling < row.scratch_mib_reserved
        field = Node._meta.get_field("scratch_mib_allocatable")
        Node.objects.filter(pk=row.pk).update(
            scratch_mib_allocatable=Greatest(
                Value(target, output_field=field), F("scratch_mib_reserved")
            ),
            disk_total_mib=disk["total_bytes"] // MIB,
            disk_free_mib=disk["free_bytes"] // MIB,
            disk_held_mib=disk["held_bytes"] // MIB,
            disk_reported_at=now,
            disk_short=short,
        )
        if short != row.disk_short:
            data = {
                "ceiling_mib": ceiling,
                "reserved_mib": row.scratch_mib_reserved,
                "free_mib": disk["free_bytes"] // MIB,
                "held_mib": disk["held_bytes"] // MIB,
                "total_mib": disk["total_bytes"] // MIB,
            }
            if short:
                message = (
                    f"the disk holds {ceiling} MiB of scratch (free + written by its "
                    f"reservations, less the safety margin), below the {row.scratch_mib_reserved} "
                    "MiB reserved: no new scratch until it recovers"
                )
            else:
                message = (
                    f"the disk holds {ceiling} MiB again, {row.scratch_mib_reserved} MiB reserved"
                )
            node_event(
                row,
                actor=actor,
                reason=Reason.DISK_SHORT if short else Reason.DISK_RECOVERED,
                message=message,
                now=now,
                data=data,
            )
    node.refresh_from_db()
    return node


def node_cache_report(*, node: Node, cache: dict) -> dict:
    """Store the node's caches as {"sha256:…" or an input key: bytes}, and its pull throughput:
    the bytes of the cached images it measured a pull of, over those pulls' seconds."""
    data = {entry["digest"]: entry["bytes"] for entry in cache.get("images") or ()}
    data |= {entry["key"]: entry["bytes"] for entry in cache.get("inputs") or ()}
    fields = {"cached_data": data}
    with transaction.atomic():
        row = (
            Node.objects.select_for_update(of=("self",)).only("image_pull_seconds").get(pk=node.pk)
        )
        pulls = row.image_pull_seconds or {}
        sizes = {d: data[d] for d, s in pulls.items() if d in data and data[d] > 0 and s > 0}
        if sizes:
            fields["pull_bytes_per_s"] = sum(sizes.values()) / sum(pulls[d] for d in sizes)
        Node.objects.filter(pk=node.pk).update(**fields)
    return data


def node_downloads_record(*, node: Node, downloads: list[dict]) -> None:
    """The inputs the node downloaded since its last heartbeat: each one's seconds kept per key
    (the newest win; at most NODE_INPUT_DOWNLOAD_TIMES_MAX keys, those no longer cached evicted
    first), and the node's download throughput moved toward what they measured."""
    measured = [d for d in downloads if d["seconds"] > 0 and d["bytes"] > 0]
    if not downloads:
        return
    limit = setting("NODE_INPUT_DOWNLOAD_TIMES_MAX")
    with transaction.atomic():
        row = (
            Node.objects.select_for_update(of=("self",))
            .only("input_download_seconds", "download_bytes_per_s", "cached_data")
            .get(pk=node.pk)
        )
        times = dict(row.input_download_seconds or {})
        for entry in downloads:
            times[entry["key"]] = round(float(entry["seconds"]), 3)
        if len(times) > limit:
            cached, newest = set(row.cached_data or ()), {d["key"] for d in downloads}
            for old in sorted(times, key=lambda k: (k in newest, k in cached, k)):
                if len(times) <= limit:
                    break
                del times[old]
        fields = {"input_download_seconds": times}
        if measured:
            rate = sum(d["bytes"] for d in measured) / sum(d["seconds"] for d in measured)
            old = row.download_bytes_per_s or 0.0
            fields["download_bytes_per_s"] = (
                rate if old <= 0 else (1 - RATE_WEIGHT) * old + RATE_WEIGHT * rate
            )
        Node.objects.filter(pk=node.pk).update(**fields)
