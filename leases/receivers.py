"""What a node's events mean to the ledger. nodes sends these signals (nodes/signals.py) inside
its own transaction; LeasesConfig.ready() connects the receivers, so nodes never imports
leases."""

from django.dispatch import receiver

from nodes import signals
from nodes.errors import NodeScopeRefused
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from .choices import LeaseState
from .models import Lease
from .services import (
    lease_mark_uncertain,
    lease_reconcile,
    lease_stopped,
    leases_record_usage,
    leases_renew_by_heartbeat,
)


@receiver(signals.workloads_reported, dispatch_uid="leases.check_workloads_scope")
def check_workloads_scope(sender, *, node, workloads: list[dict], **kwargs) -> None:
    """Every lease and job a node reports must be placed on that node."""
    lease_ids = {int(w["lease"]) for w in workloads if w.get("lease") is not None}
    job_ids = {int(w["job"]) for w in workloads if w.get("job") is not None}
    on_node = Lease.objects.filter(node=node)
    own_leases = set(on_node.filter(pk__in=lease_ids).values_list("pk", flat=True))
    if lease_ids - own_leases:
        raise NodeScopeRefused(f"leases {sorted(lease_ids - own_leases)} are not on this node")
    own_jobs = set(on_node.filter(job_id__in=job_ids).values_list("job_id", flat=True))
    if job_ids - own_jobs:
        raise NodeScopeRefused(f"jobs {sorted(job_ids - own_jobs)} are not placed on this node")


@receiver(signals.workloads_reported, dispatch_uid="leases.renew_and_record_usage")
def renew_and_record_usage(sender, *, node, workloads: list[dict], now=None, **kwargs) -> None:
    """A heartbeat renews the leases of the jobs its node runs and records their usage (usage
    is checked first: out of bounds → ValidationError, 400, nothing written). Connected after
    the scope check, so only this node's own leases get here."""
    if not workloads:
        return
    leases_record_usage(node=node, workloads=workloads, now=now)
    leases_renew_by_heartbeat(node=node, workloads=workloads, now=now)


@receiver(signals.workloads_reported, dispatch_uid="leases.end_stops_not_listed")
def end_stops_not_listed(sender, *, node, workloads: list[dict], now=None, **kwargs) -> list[int]:
    """A stopping lease that the node's heartbeat no longer lists has nothing running for it
    there (the agent lists every run it has, from before its `starting` report until it ends):
    released, `reconciled_gone`. One of a silent node (`uncertain_since`) waits for its return."""
    lease_ids = {int(w["lease"]) for w in workloads if w.get("lease") is not None}
    job_ids = {int(w["job"]) for w in workloads if w.get("job") is not None}
    gone = (
        Lease.objects.filter(node=node, state=LeaseState.STOPPING, uncertain_since__isnull=True)
        .exclude(pk__in=lease_ids)
        .exclude(job_id__in=job_ids)
    )
    ended = []
    for lease in gone.order_by("id"):
        try:
            lease_stopped(
                lease=lease,
                actor=Actor.for_node(node),
                reason=Reason.RECONCILED_GONE,
                message="its node's heartbeat no longer lists it: nothing runs for it there",
                now=now,
            )
        except TransitionRefused:  # ended meanwhile (its `stopped` report): the heartbeat goes on
            continue
        ended.append(lease.pk)
    return ended


@receiver(signals.node_unreachable, dispatch_uid="leases.mark_node_leases_uncertain")
def mark_node_leases_uncertain(sender, *, node, actor, now, **kwargs) -> list[int]:
    """The node went silent: its committed leases become uncertain (capacity stays held), and
    so, in effect, do its stopping ones (they stay stopping, silent since now)."""
    states = (LeaseState.COMMITTED, LeaseState.STOPPING)
    leases = list(Lease.objects.filter(node=node, state__in=states, uncertain_since__isnull=True))
    for lease in leases:
        lease_mark_uncertain(lease=lease, actor=actor, now=now)
    return [lease.pk for lease in leases]


@receiver(signals.node_returned, dispatch_uid="leases.reconcile_node_workloads")
def reconcile_node_workloads(sender, *, node, workloads: list[dict], actor, now, **kwargs):
    """After a node returns: its uncertain leases it still runs are committed again; the
    others are released (the workload is gone). Its stopping leases it still runs stay
    stopping (its agent stops them), the others are released. Returns {"running": [...],
    "gone": [...]}."""
    reported = {int(w["lease"]) for w in workloads if w.get("lease") is not None}
    running, gone = [], []
    silent = Lease.objects.filter(node=node, state=LeaseState.UNCERTAIN) | Lease.objects.filter(
        node=node, state=LeaseState.STOPPING, uncertain_since__isnull=False
    )
    for lease in silent.order_by("id"):
        still_runs = lease.pk in reported
        (running if still_runs else gone).append(lease.pk)
        lease_reconcile(lease=lease, running=still_runs, actor=actor, now=now)
    return {"running": running, "gone": gone}
