"""Every write of persistent volumes (docs/storage.md "Persistent volumes"): create, attach,
detach, delete, expire, and what a node's agent reports of the images it holds.

Each state change goes through `pools.statemachine.transition` with a `VolumeEvent`. The disk a
volume holds is taken on its node's ledger with a guarded UPDATE (the `node_scratch_not_
overcommitted` check refuses any overcommitted row besides), under the lock order of the
ledger: the tenant's quota row, then the node row. A volume's disk goes back to its node when
the node confirmed its image gone (or the node is retired): until then the bytes are still on
that disk. Its quota goes back at once."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from nodes.choices import NodeState, Reachability
from nodes.models import Node
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.models import ComputePool, Quota, Tenant
from pools.reasons import Reason
from pools.statemachine import Refusal, TransitionRefused, transition
from pools.sweeps import sweep

from .choices import GONE, LIVE, VOLUME_TRANSITIONS, VolumeState
from .models import Volume, VolumeAttachment, VolumeEvent
from .signals import volume_jobs

S = VolumeState
MIB = 1024 * 1024
SYSTEM = Actor.system("storage")


class VolumeRefused(Refusal):
    """A request about a volume the domain refuses (409 with its code)."""

    status = 409


class VolumeInvalid(Refusal):
    """A create that names something that cannot be (400, on its field)."""

    status = 400
    code = "invalid"

    def __init__(self, field: str, message: str):
        super().__init__(message, extra={field: [message]})


# --- the storage quota ---------------------------------------------------------------------


def _volume_transition(volume_id: int, **fields) -> Volume:
    """A volume's state change through the one transition helper: its map, its event."""
    return transition(
        Volume, volume_id, allowed=VOLUME_TRANSITIONS, event_model=VolumeEvent, **fields
    )


def stored_bytes(pool_id: int, tenant_ids) -> dict[int, int]:
    """tenant id → bytes it stores in the pool: its jobs' outputs the control plane keeps
    (`JobOutput.size`, read through the tenant's `jobs` relation: storage imports nothing of
    jobs) and the sizes of its live volumes. What the `storage_mib` quota counts."""
    tenant_ids = set(tenant_ids)
    outputs = Tenant.objects.filter(pk__in=tenant_ids).annotate(
        # outputs kept by the control plane only: those in a tenant's own bucket (`location`)
        # are the tenant's store's, not this quota's
        stored=Sum(
            "jobs__outputs__size",
            filter=Q(jobs__pool_id=pool_id, jobs__outputs__location=""),
        )
    )
    stored = {tenant_id: size or 0 for tenant_id, size in outputs.values_list("pk", "stored")}
    volumes = (
        Volume.objects.filter(tenant_id__in=tenant_ids, pool_id=pool_id, state__in=LIVE)
        .values("tenant_id")
        .annotate(size=Sum("size_mib"))
    )
    for row in volumes:
        stored[row["tenant_id"]] = stored.get(row["tenant_id"], 0) + row["size"] * MIB
    return stored


def check_volume_quota(tenant: Tenant, pool: ComputePool, size_mib: int) -> None:
    """Inside the create's transaction, under the quota row's lock (two creates cannot both
    take the last megabytes): refuses `quota_exceeded` (`storage_mib`)."""
    quota = (
        Quota.objects.select_for_update()
        .filter(tenant=tenant, pool=pool, storage_mib__isnull=False)
        .values_list("storage_mib", flat=True)
        .first()
    )
    if quota is None:
        return
    after = stored_bytes(pool.pk, [tenant.pk])[tenant.pk] / MIB + size_mib
    if after > quota:
        raise VolumeRefused(
            f"Quota exceeded: storage_mib {after:.4g} > {quota} (outputs and volumes)",
            code="quota_exceeded",
            extra={"dimension": "storage_mib"},
        )


# --- the node's disk ledger ------------------------------------------------------------------


def _take_disk(node_id: int, size_mib: int) -> bool:
    """The guarded UPDATE: the node is ready, reachable and has `size_mib` of disk free."""
    return bool(
        Node.objects.filter(
            pk=node_id,
            state=NodeState.READY,
            reachability=Reachability.REACHABLE,
            scratch_mib_reserved__lte=F("scratch_mib_allocatable") - size_mib,
        ).update(scratch_mib_reserved=F("scratch_mib_reserved") + size_mib)
    )


def _return_disk(volume: Volume, *, actor: Actor, now, message: str) -> None:
    """The volume's size back on its node's ledger, once (its `disk_released_at`)."""
    updated = Volume.objects.filter(pk=volume.pk, disk_released_at__isnull=True).update(
        disk_released_at=now
    )
    if not updated:
        return
    Node.objects.filter(pk=volume.node_id, scratch_mib_reserved__gte=volume.size_mib).update(
        scratch_mib_reserved=F("scratch_mib_reserved") - volume.size_mib
    )
    VolumeEvent.record(
        volume,
        actor=actor,
        from_state=volume.state,
        to_state=volume.state,
        reason=Reason.VOLUME_DISK_RELEASED,
        message=message,
        at=now,
        data={"node": volume.node_id, "size_mib": volume.size_mib},
    )


def candidate_nodes(pool: ComputePool, *, zone: str = "", node_name: str = ""):
    """Where a new volume may live, best first: the named node, or the pool's (zone's) ready,
    reachable nodes, the one with the most free disk first."""
    nodes = Node.objects.filter(
        pool=pool, state=NodeState.READY, reachability=Reachability.REACHABLE
    )
    if node_name:
        nodes = nodes.filter(name=node_name)
    if zone:
        nodes = nodes.filter(zone=zone)
    free = F("scratch_mib_allocatable") - F("scratch_mib_reserved")
    return list(nodes.annotate(free=free).order_by("-free", "pk"))


# --- lifecycle -------------------------------------------------------------------------------


def _retention_end(volume: Volume, since):
    return since + timedelta(days=volume.retention_days)


def volume_create(
    *,
    tenant: Tenant,
    pool: ComputePool,
    name: str,
    size_mib: int,
    actor: Actor,
    zone: str = "",
    node_name: str = "",
    retention_days: int | None = None,
    now=None,
) -> Volume:
    """A new volume on the named node, or on the pool's (zone's) node with the most free disk
    that has room; its size taken from that node's disk and counted in the tenant's storage
    quota. Refused 409 `volume_node_full` when no such node has room (`no_ready_node` when the
    pool or zone has no ready node, or the named one is not ready), `quota_exceeded`, or
    `volume_name_taken`."""
    now = now or timezone.now()
    if node_name and not Node.objects.filter(pool=pool, name=node_name).exists():
        raise VolumeInvalid("node", f"Pool {pool.slug} has no node named {node_name!r}.")
    if zone and not Node.objects.filter(pool=pool, zone=zone).exists():
        raise VolumeInvalid("zone", f"Pool {pool.slug} has no node in zone {zone!r}.")
    retention = retention_days or knobs_for(pool).volume_retention_days
    candidates = candidate_nodes(pool, zone=zone, node_name=node_name)
    if not candidates:
        where = f"node {node_name}" if node_name else f"zone {zone}" if zone else "the pool"
        raise VolumeRefused(
            f"No ready node in {where} to hold the volume now.", code=Reason.NO_READY_NODE
        )
    try:
        with transaction.atomic():
            check_volume_quota(tenant, pool, size_mib)  # the quota row first, then the node
            node = next((n for n in candidates if _take_disk(n.pk, size_mib)), None)
            if node is None:
                best = max(n.free for n in candidates)
                raise VolumeRefused(
                    f"No node has {size_mib} MiB of disk free for the volume (the most free: "
                    f"{max(best, 0)} MiB).",
                    code=Reason.VOLUME_NODE_FULL,
                    extra={"size_mib": size_mib, "largest_free_mib": max(best, 0)},
                )
            volume = Volume.objects.create(
                tenant=tenant,
                pool=pool,
                node=node,
                name=name,
                size_mib=size_mib,
                zone=zone,
                retention_days=retention,
                state=S.AVAILABLE,
                state_changed_at=now,
                created_at=now,
                expires_at=now + timedelta(days=retention),
            )
            VolumeEvent.record(
                volume,
                actor=actor,
                from_state="",
                to_state=S.AVAILABLE,
                reason=Reason.VOLUME_CREATED,
                message=f"{size_mib} MiB on node {node.name}",
                at=now,
                data={"node": node.name, "size_mib": size_mib},
            )
    except IntegrityError as exc:
        if "volume_name_unique_live" not in str(exc):
            raise
        raise VolumeRefused(
            f"Tenant {tenant.slug} has a volume named {name!r} in pool {pool.slug} already.",
            code="volume_name_taken",
        ) from exc
    return volume


def volume_attach(*, volume_id: int, job_id: int, read_only: bool, actor: Actor, now=None):
    """A job mounts the volume (its agent reported `starting`). At most one read-write job at
    a time: another one is refused `volume_in_use` (under the volume's row lock, and the
    database's `volume_one_writer` besides); read-only mounts share. A job that is attached
    already changes nothing. A volume that is gone is refused `volume_gone`."""
    now = now or timezone.now()
    with transaction.atomic():
        volume = Volume.objects.select_for_update().get(pk=volume_id)
        if volume.attachments.filter(job_id=job_id).exists():
            return volume
        if volume.state not in LIVE:
            raise TransitionRefused(Reason.VOLUME_GONE, f"volume {volume.name} was {volume.state}")
        if not read_only and volume.holder_job_id not in (None, job_id):
            raise TransitionRefused(
                Reason.VOLUME_IN_USE,
                f"volume {volume.name} is mounted read-write by job {volume.holder_job_id}",
            )
        VolumeAttachment.objects.create(
            volume=volume, job_id=job_id, read_only=read_only, attached_at=now
        )
        changes = {"last_attached_at": now, "expires_at": None}
        if not read_only:
            changes["holder_job_id"] = job_id
        return _volume_transition(
            volume.pk,
            to=S.ATTACHED,
            actor=actor,
            reason=Reason.VOLUME_ATTACHED,
            message=f"job {job_id} mounts it {'read-only' if read_only else 'read-write'}",
            now=now,
            changes=changes,
            data={"job": job_id, "read_only": read_only},
        )


def volumes_detach(*, job_id: int, actor: Actor, now=None) -> list[Volume]:
    """The job no longer mounts any volume (it ended, was re-queued or left its node): each
    volume it was attached to is detached; the last one to leave starts its retention."""
    now = now or timezone.now()
    detached = []
    with transaction.atomic():
        for attachment in (
            VolumeAttachment.objects.select_related("volume")
            .filter(job_id=job_id)
            .order_by("volume_id")
        ):
            volume = Volume.objects.select_for_update().get(pk=attachment.volume_id)
            attachment.delete()
            left = volume.attachments.exists()
            changes = {"last_detached_at": now}
            if volume.holder_job_id == job_id:
                changes["holder_job_id"] = None
            if not left:
                changes["expires_at"] = _retention_end(volume, now)
            detached.append(
                _volume_transition(
                    volume.pk,
                    to=S.ATTACHED if left else S.AVAILABLE,
                    actor=actor,
                    reason=Reason.VOLUME_DETACHED,
                    message=f"job {job_id} no longer mounts it",
                    now=now,
                    changes=changes,
                    data={"job": job_id},
                )
            )
    return detached


def mounting_jobs(volume_id: int) -> list[int]:
    """The jobs that have not ended (queued, placed, running …) and mount the volume, as the
    jobs app answers (storage/signals.py `volume_jobs`)."""
    ids: set[int] = set()
    for _receiver, answer in volume_jobs.send(sender=Volume, volume_id=volume_id):
        ids.update(answer or ())
    return sorted(ids)


def volume_delete(*, volume: Volume, actor: Actor, now=None) -> Volume:
    """Its tenant deletes it: refused `volume_in_use` (with `jobs`, their ids) while a job
    that has not ended mounts it, a queued one included (Kubernetes protects a claim in use
    the same way): the tenant cancels them first, or waits for them. Under the volume's row
    lock, which a submit that mounts it takes too (`volumes_hold`), so a job submitted at the
    same time either is seen here or sees the volume gone. Out of the quota at once; the node
    removes the image at its next report, and its disk returns then."""
    now = now or timezone.now()

    def not_in_use(row):
        attached = row.attachments.values_list("job_id", flat=True)
        jobs = sorted(set(mounting_jobs(row.pk)) | set(attached))
        if row.state == S.ATTACHED or jobs:
            shown = ", ".join(str(j) for j in jobs[:20]) + (" …" if len(jobs) > 20 else "")
            raise VolumeRefused(
                f"volume {row.name} is mounted by job(s) {shown}: cancel "
                "them or delete it once they ended",
                code=Reason.VOLUME_IN_USE,
                extra={"jobs": jobs[:100]},
            )

    with transaction.atomic():
        not_in_use(Volume.objects.select_for_update().get(pk=volume.pk))
        volume = _volume_transition(
            volume.pk,
            to=S.DELETED,
            actor=actor,
            reason=Reason.VOLUME_DELETED,
            message="deleted by its tenant",
            now=now,
            changes={"expires_at": None},
        )
        _release_if_node_gone(volume, actor, now)
    return volume


def volumes_hold(tenant_id: int, pool_id: int, mounts: list[dict] | None) -> None:
    """Inside a submit's transaction: the mounted volumes' rows locked (in id order) and
    each still live, else a ValidationError on `volumes` (400). A delete holds the same lock
    while it looks for the jobs that mount the volume, so the two take turns."""
    ids = sorted({int(m["volume"]) for m in mounts or ()})
    if not ids:
        return
    rows = list(
        Volume.objects.select_for_update()
        .filter(pk__in=ids, tenant_id=tenant_id, pool_id=pool_id)
        .order_by("pk")
        .values_list("pk", "name", "state")
    )
    live = {pk for pk, _name, state in rows if state in LIVE}
    for pk, name, state in rows:
        if pk not in live:
            raise ValidationError({"volumes": [f"Volume {name} is {state}."]})
    if missing := [pk for pk in ids if pk not in live]:
        raise ValidationError({"volumes": [f"The tenant has no volume {missing[0]}."]})


def _release_if_node_gone(volume: Volume, actor: Actor, now) -> None:
    """A retired node will never report again, and a volume no job ever mounted has no image
    on its node (the agent makes it when the first one starts, after `starting` attached it):
    either way its disk goes back at once, without waiting for the node's report."""
    if volume.last_attached_at is None:
        _return_disk(volume, actor=actor, now=now, message="never mounted: no image to remove")
    elif Node.objects.filter(pk=volume.node_id, state=NodeState.RETIRED).exists():
        _return_disk(volume, actor=actor, now=now, message="its node is retired")


def volume_expire(volume: Volume, *, actor: Actor = SYSTEM, now=None) -> Volume:
    """Detached past its retention: expired (the sweep's step, under the row's lock). A volume
    that a job which has not ended still mounts (queued for it, say) is not: its retention
    counts again from that job's detach."""
    now = now or timezone.now()

    def still_due(row):
        if row.state != S.AVAILABLE or row.expires_at is None or row.expires_at > now:
            raise TransitionRefused("not_due", f"volume {row.pk} is not due")
        if mounting_jobs(row.pk):  # a queued job waits for it: kept until that one is done
            raise TransitionRefused("not_due", f"volume {row.pk} is mounted by a queued job")

    volume = _volume_transition(
        volume.pk,
        to=S.EXPIRED,
        actor=actor,
        reason=Reason.VOLUME_EXPIRED,
        message=f"no job mounted it for {volume.retention_days} days",
        now=now,
        check=still_due,
        changes={"expires_at": None},
    )
    _release_if_node_gone(volume, actor, now)
    return volume


def expire_volumes(*, now=None) -> int:
    """The retention sweep (storage.expire_volumes): every available volume whose retention
    ended, each in its own transaction (pools.sweeps.sweep); the others are untouched."""
    now = now or timezone.now()
    due = Volume.objects.filter(state=S.AVAILABLE, expires_at__lte=now)
    done = sweep(
        due,
        lambda volume: volume_expire(volume, now=now),
        event_model=VolumeEvent,
        actor=SYSTEM,
        now=now,
    )
    return len(done)


# --- what a node reports ---------------------------------------------------------------------


def volumes_reconcile(*, node: Node, reported: list[dict], now=None) -> dict:
    """A node's agent lists the volume images it holds (`[{"id", "used_bytes"}]`): each live
    volume of the node records what it uses; the answer names the images to remove (volumes
    deleted or expired, and any that is not this node's live volume). A gone volume whose image
    the node no longer holds has its disk back on the node's ledger."""
    now = now or timezone.now()
    held = {int(item["id"]): int(item.get("used_bytes") or 0) for item in reported}
    ours = {v.pk: v for v in Volume.objects.filter(node=node, pk__in=held)}
    remove = sorted(pk for pk in held if pk not in ours or ours[pk].state in GONE)
    for pk, used in held.items():
        if pk in ours and ours[pk].state in LIVE:
            Volume.objects.filter(pk=pk).update(used_bytes=used, used_reported_at=now)
    actor = Actor.for_node(node)
    for volume in Volume.objects.filter(
        node=node, state__in=GONE, disk_released_at__isnull=True
    ).exclude(pk__in=held):
        with transaction.atomic():
            _return_disk(volume, actor=actor, now=now, message=f"node {node.name}: image removed")
    return {"remove": remove}


def volumes_node_retired(*, node: Node, now=None) -> int:
    """A retired node's gone volumes have their disk back (it reports no more)."""
    now = now or timezone.now()
    count = 0
    for volume in Volume.objects.filter(node=node, state__in=GONE, disk_released_at__isnull=True):
        with transaction.atomic():
            _return_disk(volume, actor=SYSTEM, now=now, message="its node is retired")
            count += 1
    return count
