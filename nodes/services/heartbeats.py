"""Heartbeats: liveness, usage and device health from the agent; silence makes a node
unreachable, and its return is reconciled. What that means for the node's leases is the
ledger's (nodes.signals, received by leases/receivers.py)."""

from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from pools.actors import Actor
from pools.choices import TrustLevel
from pools.models import ComputePool
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from pools.sweeps import sweep

from .. import signals
from ..choices import NodeState, Reachability
from ..conf import setting
from ..models import Node, NodeEvent
from .base import node_event
from .health import gpu_health_apply
from .lifecycle import node_mark_ready, node_verify
from .storage import node_cache_report, node_disk_report, node_downloads_record


def node_heartbeat(
    *,
    node: Node,
    actor: Actor,
    now=None,
    usage: dict | None = None,
    gpus: list[dict] | None = None,
    workloads: list[dict] | None = None,
    agent_version: str = "",
    images: list[str] | None = None,
    runtime: str = "",
    runtimes: list[str] | None = None,
    features: list[str] | None = None,
    disk: dict | None = None,
    cache: dict | None = None,
    downloads: list[dict] | None = None,
) -> Node:
    """Liveness, usage, device health, the image cache, the runtimes, the features and the
    storage report (`disk`, `cache`, `downloads`: nodes/services/storage.py) from the
    node's agent (`runtime` the one it runs jobs with, `runtimes` all it offers, `features` what
    it has: the scheduler's filters read both).

    A private-fleet node that is still `registered` is verified and made ready by its first
    authenticated heartbeat; a node that was unreachable becomes reachable and the workloads it
    reports are reconciled with its uncertain leases.
    """
    now = now or timezone.now()
    workloads = workloads or []
    # every lease and job reported must be placed on this node: checked before any write
    signals.workloads_reported.send(sender=Node, node=node, workloads=workloads, now=now)
    fields = {"last_heartbeat_at": now, "usage": usage or {}}
    if agent_version:
        fields["agent_version"] = agent_version
    if images is not None:  # the agent's image cache: the scheduler's warm images
        fields["cached_images"] = sorted(set(images))
    if runtime:
        fields["agent_runtime"] = runtime
    if runtimes is not None:  # e.g. gvisor offered once dockerd has the runsc runtimes
        fields["runtimes"] = list(dict.fromkeys(runtimes))
    if features is not None:  # validated (distinct names) by the API; absent: kept
        fields["features"] = list(features)
    Node.objects.filter(pk=node.pk).update(**fields)
    node.refresh_from_db()
    returned = Node.objects.filter(pk=node.pk, reachability=Reachability.UNREACHABLE).update(
        reachability=Reachability.REACHABLE, reachability_changed_at=now
    )
    if returned:
        node.refresh_from_db()
        node_event(
            node,
            actor=actor,
            reason=Reason.NODE_RETURNED,
            message=f"heartbeat resumed; {len(workloads)} workload(s) reported",
            now=now,
        )
        signals.node_returned.send(
            sender=Node, node=node, workloads=workloads, actor=actor, now=now
        )
    if node.state == NodeState.REGISTERED and node.pool.trust_level == TrustLevel.PRIVATE:
        try:
            node = node_verify(
                node=node, actor=actor, message="private fleet: authenticated agent", now=now
            )
            node = node_mark_ready(
                node=node, actor=actor, reason=Reason.AGENT_AUTHENTICATED, now=now
            )
        except TransitionRefused:
            node.refresh_from_db()  # another heartbeat got there first
    gpu_health_apply(node=node, reports=gpus or [], actor=actor, now=now)
    # storage (docs/storage.md): each part absent keeps what the node said last
    if cache is not None:
        node_cache_report(node=node, cache=cache)
    if downloads:
        node_downloads_record(node=node, downloads=downloads)
    if disk is not None:
        node = node_disk_report(node=node, disk=disk, actor=actor, now=now)
    return node


def node_mark_unreachable(*, node: Node, cutoff, actor: Actor, now=None) -> bool:
    """Guarded: only if still reachable and still silent since `cutoff`."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = (
            Node.objects.filter(pk=node.pk, reachability=Reachability.REACHABLE)
            .filter(
                Q(last_heartbeat_at__lt=cutoff)
                | Q(last_heartbeat_at__isnull=True, created_at__lt=cutoff)
            )
            .update(reachability=Reachability.UNREACHABLE, reachability_changed_at=now)
        )
        if not changed:
            return False
        node.refresh_from_db()
        responses = signals.node_unreachable.send(sender=Node, node=node, actor=actor, now=now)
        leases = [pk for _, uncertain in responses for pk in uncertain or ()]
        node_event(
            node,
            actor=actor,
            reason=Reason.NODE_UNREACHABLE,
            message=f"no heartbeat since {node.last_heartbeat_at or node.created_at:%H:%M:%S}; "
            f"{len(leases)} committed lease(s) now uncertain",
            now=now,
            data={"leases": leases},
        )
    return True


def node_heartbeat_sweep(*, now=None) -> list[int]:
    """Mark silent nodes unreachable (per-pool interval × missed beats). Returns node ids."""
    now = now or timezone.now()
    actor = Actor.system("heartbeat-sweep")
    marked = []
    missed = setting("NODE_MISSED_HEARTBEATS")
    for pool in ComputePool.objects.all():
        cutoff = now - timedelta(seconds=pool.heartbeat_interval_s * missed)
        silent = (
            Node.objects.filter(pool=pool, reachability=Reachability.REACHABLE)
            .exclude(state=NodeState.RETIRED)
            .filter(
                Q(last_heartbeat_at__lt=cutoff)
                | Q(last_heartbeat_at__isnull=True, created_at__lt=cutoff)
            )
        )
        done = sweep(
            silent,
            lambda node, cutoff=cutoff: node_mark_unreachable(
                node=node, cutoff=cutoff, actor=actor, now=now
            ),
            event_model=NodeEvent,
            actor=actor,
            now=now,
        )
        marked += [pk for pk, changed in done.items() if changed]
    return marked


def node_image_pull_record(*, node: Node, image: str, seconds: float) -> dict:
    """The time the node's agent took to pull `image` (a digest reference or `sha256:…`),
    kept per digest on the node (the newest measurement wins). At most NODE_IMAGE_PULL_TIMES_MAX
    digests: past that, digests no longer in the node's cache go first. Not an event: a pull
    is already one on its job (`image_pulled` with `pull_seconds`)."""
    digest = image.rpartition("@")[2] if "@" in image else image
    if not digest.startswith("sha256:"):
        return {}
    limit = setting("NODE_IMAGE_PULL_TIMES_MAX")
    with transaction.atomic():
        row = Node.objects.select_for_update().only("image_pull_seconds", "cached_images")
        row = row.get(pk=node.pk)
        times = dict(row.image_pull_seconds or {})
        times[digest] = round(float(seconds), 3)
        if len(times) > limit:
            cached = set(row.cached_images or ())
            # jsonb keeps no insertion order: evict what left the cache, then by digest
            for old in sorted(times, key=lambda d: (d in cached, d)):
                if len(times) <= limit:
                    break
                if old != digest:
                    del times[old]
        Node.objects.filter(pk=node.pk).update(image_pull_seconds=times)
    node.image_pull_seconds = times
    return times
