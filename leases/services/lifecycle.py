"""A lease's life after reserve: commit (startup began), renew, release, uncertain while its
node is silent, reconcile, stopping until the agent confirms a cancelled job's container
stopped, measured usage — each a transition with its event, through `lease_transition`; a
transition out of HOLDING returns the capacity in the same transaction."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from leases.choices import HOLDING, LEASE_TRANSITIONS, TERMINAL, LeaseState
from leases.events import publish_lease_event
from leases.models import Lease, LeaseEvent
from leases.window import as_timedelta
from nodes.push import push_assignments
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused, transition

from .capacity import adopt_capacity, return_capacity

S = LeaseState


def lease_transition(*, lease: Lease, to: str, actor: Actor, reason: str, **details) -> Lease:
    """The one transition helper: lock, check LEASE_TRANSITIONS, save, write the event. Once
    committed, the event is published and the node's agent nudged (nodes/push.py): a lease
    that ends or stops changes what the node runs (not pushed back to the node that did it)."""

    def committed(obj: Lease, event: LeaseEvent) -> None:
        publish_lease_event(obj, event)
        push_assignments([obj.node_id], actor=actor)

    return transition(
        Lease,
        lease.pk,
        to=to,
        allowed=LEASE_TRANSITIONS,
        event_model=LeaseEvent,
        actor=actor,
        reason=reason,
        on_commit=committed,
        **details,
    )


def lease_note(lease: Lease, *, fields, actor: Actor, reason: str, message: str, now, data=None):
    """A change within the lease's state (`fields` saved: its expiry, its job, its reservation,
    its silence), with its event."""
    lease.save(update_fields=fields)
    return LeaseEvent.record(
        lease,
        actor=actor,
        from_state=lease.state,
        to_state=lease.state,
        reason=reason,
        message=message,
        at=now,
        data=data,
    )


def _authorize(lease: Lease, actor: Actor) -> None:
    """A node's credential acts only on leases of that node."""
    if actor.kind == "node" and getattr(actor.node, "pk", None) != lease.node_id:
        raise TransitionRefused("not_your_lease", "This node does not hold that lease.")


def _fencing_check(token, now, *, allow_expired: bool = False):
    def check(obj: Lease):
        if int(token) != obj.fencing_token:
            raise TransitionRefused(
                "fencing_token_mismatch", "Stale fencing token: another attempt holds this lease."
            )
        if not allow_expired and obj.expires_at <= now:
            raise TransitionRefused("lease_expired", f"The lease expired at {obj.expires_at}.")

    return check


def _require_state(state):
    def check(obj):
        if obj.state != state:
            raise TransitionRefused(
                "transition_not_allowed", f"Only a {state} lease can do this, not {obj.state}."
            )

    return check


def lease_commit(*, lease: Lease, fencing_token, actor: Actor, now=None) -> Lease:
    """Startup began: reserved → committed. A reservation is claimed within its tolerance."""
    now = now or timezone.now()
    _authorize(lease, actor)
    token_check = _fencing_check(fencing_token, now)

    def check(obj: Lease):
        token_check(obj)
        if obj.window_start is not None and now < obj.window_start:
            raise TransitionRefused(
                Reason.RESERVATION_WINDOW_NOT_OPEN,
                f"The reservation's window opens at {obj.window_start}.",
            )
        if obj.window_start is not None and (running := running_backfills(obj)):
            raise TransitionRefused(
                Reason.RESERVATION_BACKFILLS_STOPPING,
                f"Backfilled jobs may still run in this reservation (leases {running}): its"
                " claim waits until their node confirms their containers stopped.",
            )

    with transaction.atomic():
        lease = lease_transition(
            lease=lease,
            to=S.COMMITTED,
            actor=actor,
            reason=Reason.COMMITTED,
            now=now,
            check=check,
            changes={"committed_at": now},
        )
        if lease.window_start is not None:
            # The claim holds the capacity until the window's end, not longer.
            lease.expires_at = lease.window_end
            lease.save(update_fields=["expires_at"])
            _close_backfills(lease, actor, now)
    return lease


def running_backfills(reservation: Lease) -> list[int]:
    """The backfilled jobs' leases of `reservation` whose containers may run (started, silent
    or stopping): its claim waits for them, since its job would run beside them on the same
    capacity (lease_commit refuses it, the scheduling pass does not hand it over)."""
    live = (S.COMMITTED, S.UNCERTAIN, S.STOPPING)
    backfills = reservation.backfills.filter(state__in=live, job__isnull=False).order_by("id")
    return list(backfills.values_list("pk", flat=True))


def _close_backfills(parent: Lease, actor: Actor, now) -> None:
    """At the claim: what is left inside the reservation never ran (reserved) or is a lease of
    the lease API whose expiry was at most the window start: it ends."""
    for child in parent.backfills.filter(state__in=HOLDING).order_by("id"):
        lease_transition(
            lease=child,
            to=S.EXPIRED,
            actor=actor,
            reason=Reason.BACKFILL_WINDOW_CLOSED,
            message=f"reservation {parent.pk} was claimed",
            now=now,
            changes={"ended_at": now},
        )


def lease_renew(*, lease: Lease, fencing_token, actor: Actor, duration, now=None) -> Lease:
    """Extend a live lease to now + duration (capped by its window or backfill deadline).
    A lease whose job has ended is not renewed (`job_ended`): it runs out."""
    now = now or timezone.now()
    _authorize(lease, actor)
    duration = as_timedelta(duration)
    if duration <= timedelta(0):
        raise TransitionRefused("invalid_duration", "A renewal lasts a positive duration.")
    with transaction.atomic():
        obj = (
            Lease.objects.select_for_update(of=("self",))
            .select_related("backfill_of", "job")
            .get(pk=lease.pk)
        )
        if obj.state not in (S.RESERVED, S.COMMITTED):
            raise TransitionRefused(
                "transition_not_allowed", f"A {obj.state} lease cannot be renewed."
            )
        _fencing_check(fencing_token, now)(obj)
        if obj.state == S.RESERVED and obj.job_id is None and obj.window_start is None:
            raise TransitionRefused(
                "not_committed",
                "Only a committed lease renews: commit it first (an uncommitted one expires"
                " after the pool's commit window).",
            )
        if obj.job is not None and obj.job.has_ended:
            raise TransitionRefused(
                "job_ended", f"Job {obj.job_id} is {obj.job.state}: its lease is not renewed."
            )
        cap = None
        if obj.window_start is not None:
            cap = obj.window_end if obj.state == S.COMMITTED else obj.expires_at
        if obj.backfill_of_id is not None:
            cap = obj.backfill_of.window_start
        wanted = now + duration
        new_expiry = min(wanted, cap) if cap else wanted
        if new_expiry <= obj.expires_at and cap is not None and wanted > cap:
            raise TransitionRefused(
                "hold_cap_reached", f"This lease cannot be held beyond {cap} (policy cap)."
            )
        previous = obj.expires_at
        obj.expires_at = max(new_expiry, obj.expires_at)
        lease_note(
            obj,
            fields=["expires_at"],
            actor=actor,
            reason=Reason.RENEWED,
            message=f"expires at {obj.expires_at:%Y-%m-%d %H:%M:%S}",
            now=now,
            data={"previous_expires_at": previous.isoformat()},
        )
    return obj


def end_lease(lease: Lease, *, to: str, actor: Actor, reason: str, message: str, now, check=None):
    """A transition out of HOLDING with the capacity returned in the same transaction."""
    with transaction.atomic():
        lease = lease_transition(
            lease=lease,
            to=to,
            actor=actor,
            reason=reason,
            message=message,
            now=now,
            check=check,
            changes={"ended_at": now},
        )
        return_capacity(lease)
        if lease.window_start is not None:
            _adopt_backfills(lease, actor, now)
    return lease


def _adopt_backfills(reservation: Lease, actor: Actor, now) -> None:
    """A reservation that ends before it is claimed (released, expired, its node lost) leaves
    its backfills as they are: each holds its own part of the capacity the reservation has
    just returned, and is a plain lease from now (no reclaim, no cap at the old window). Ending
    them instead would free capacity their containers still run on. (A claimed reservation has
    none left: its claim closed them.)"""
    for child in reservation.backfills.filter(state__in=HOLDING).select_related("pool"):
        adopt_capacity(child)
        child.backfill_of = None
        lease_note(
            child,
            fields=["backfill_of"],
            actor=actor,
            reason=Reason.BACKFILL_ADOPTED,
            message=f"reservation {reservation.pk} ended before its window: this lease holds"
            " its own capacity now",
            now=now,
            data={"backfill_of": reservation.pk},
        )
        transaction.on_commit(lambda lease=child: publish_lease_event(lease))


def lease_release(*, lease: Lease, actor: Actor, reason: str, message: str = "", now=None):
    """Explicit and idempotent: releasing an ended lease returns it unchanged. A stopping lease
    is not released by anyone's word but the stop's (lease_stopped): its container may still
    run on the capacity it holds."""
    now = now or timezone.now()
    _authorize(lease, actor)
    with transaction.atomic():
        current = Lease.objects.select_for_update().get(pk=lease.pk)
        if current.state in TERMINAL:
            return current
        if current.state == S.STOPPING:
            raise TransitionRefused(
                "transition_not_allowed",
                f"Lease {current.pk} is held until its cancelled job's container has stopped.",
            )
        if actor.is_person and current.job_id is not None and not current.job.has_ended:
            # its capacity would return while the container runs, and the job end `lost`;
            # cancelling the job (which ends it first) releases or stops its leases
            raise TransitionRefused(
                "job_lease",
                f"Lease {current.pk} runs job {current.job_id}: cancel the job to end it.",
            )
        return end_lease(
            current, to=S.RELEASED, actor=actor, reason=reason, message=message, now=now
        )


def lease_stop(*, lease: Lease, actor: Actor, message: str = "", now=None) -> Lease:
    """committed (or uncertain) → stopping: the lease's job was cancelled while its container
    may run. The capacity stays held until the node's agent confirms the stop (lease_stopped),
    its heartbeat no longer lists the lease, or its node is found gone (receivers, sweeps). An
    uncertain lease keeps `uncertain_since`: its node is silent, the lost-node rules apply."""
    return lease_transition(
        lease=lease,
        to=S.STOPPING,
        actor=actor,
        reason=Reason.STOP_REQUESTED,
        message=message or "its job was cancelled: held until its container has stopped",
        now=now or timezone.now(),
    )


def lease_stopped(
    *, lease: Lease, actor: Actor, reason: str = Reason.STOP_CONFIRMED, message: str = "", now=None
) -> Lease:
    """stopping → released, the capacity back: the container stopped (the agent said so, or
    its heartbeat no longer lists it: `reconciled_gone`)."""
    _authorize(lease, actor)
    return end_lease(
        lease,
        to=S.RELEASED,
        actor=actor,
        reason=reason,
        message=message or "the container has stopped",
        now=now or timezone.now(),
        check=_require_state(S.STOPPING),
    )


def lease_record_final_report(*, lease: Lease, now=None) -> None:
    """The node's agent made its final report under this lease (no state change, no event:
    the job's event is the report): its callbacks after this are refused (`lease_ended`)."""
    Lease.objects.filter(pk=lease.pk, final_report_at__isnull=True).update(
        final_report_at=now or timezone.now()
    )


def _stopping_silent_since(lease, *, since, actor, reason, message, now) -> Lease:
    """A stopping lease stays stopping when its node goes silent (`since` = now) or returns
    (`since` = None): only `uncertain_since` changes, with an event; nothing when it already
    says so or the lease is no longer stopping."""
    with transaction.atomic():
        obj = Lease.objects.select_for_update().get(pk=lease.pk)
        if obj.state != S.STOPPING or (obj.uncertain_since is None) == (since is None):
            return obj
        obj.uncertain_since = since
        lease_note(
            obj, fields=["uncertain_since"], actor=actor, reason=reason, message=message, now=now
        )
    return obj


def lease_mark_uncertain(*, lease: Lease, actor: Actor, now=None) -> Lease:
    """committed → uncertain: the node's agent stopped answering; capacity stays held. A
    stopping lease stays stopping with its node silent since now (`uncertain_since`): nobody can
    confirm its stop, so the uncertain deadline ends it unless the node returns first."""
    now = now or timezone.now()
    if lease.state == S.STOPPING:
        return _stopping_silent_since(
            lease,
            since=now,
            actor=actor,
            reason=Reason.NODE_SILENT,
            message="its node went silent while its container was being stopped",
            now=now,
        )
    return lease_transition(
        lease=lease,
        to=S.UNCERTAIN,
        actor=actor,
        reason=Reason.NODE_SILENT,
        now=now,
        changes={"uncertain_since": now},
    )


def lease_reconcile(*, lease: Lease, running: bool, actor: Actor, now=None) -> Lease:
    """uncertain → committed when the workload still runs, else released (capacity back). A
    stopping lease whose node returned stays stopping while the workload still runs there (its
    agent stops it and confirms), else it is released."""
    now = now or timezone.now()
    _authorize(lease, actor)
    if lease.state == S.STOPPING:
        if not running:
            return lease_stopped(
                lease=lease,
                actor=actor,
                reason=Reason.RECONCILED_GONE,
                message="its node returned without it",
                now=now,
            )
        return _stopping_silent_since(
            lease,
            since=None,
            actor=actor,
            reason=Reason.RECONCILED_RUNNING,
            message="its node returned with it; it is being stopped there",
            now=now,
        )
    if running:
        with transaction.atomic():
            current = Lease.objects.select_for_update().get(pk=lease.pk)
            expires_at = max(current.expires_at, now + settings.LEASE_DEFAULT_TTL)
            if current.window_end is not None:
                expires_at = min(expires_at, max(current.window_end, current.expires_at))
            return lease_transition(
                lease=current,
                to=S.COMMITTED,
                actor=actor,
                reason=Reason.RECONCILED_RUNNING,
                now=now,
                changes={"uncertain_since": None, "expires_at": expires_at},
            )
    return end_lease(
        lease,
        to=S.RELEASED,
        actor=actor,
        reason=Reason.RECONCILED_GONE,
        message="reconciliation found no running workload",
        now=now,
        check=_require_state(S.UNCERTAIN),
    )


def lease_report_usage(
    *,
    lease: Lease,
    actor: Actor,
    cpu_millicores: int,
    memory_mib: int,
    gpu_milli: int = 0,
    now=None,
) -> Lease:
    """The agent's measured consumption of a committed lease (accounting: held vs consumed),
    within what can be true, else ValidationError with field errors (400): CPU up to the
    node's raw CPU (a CPU request is a share, not a cap: a container may burst to the whole
    node), memory up to the lease's (the container's hard limit), GPU up to 1000 per device
    the lease holds (a time-sliced share may use its whole device while others idle)."""
    now = now or timezone.now()
    _authorize(lease, actor)
    bounds = {
        "cpu_millicores": (cpu_millicores, lease.node.cpu_millicores_raw, "the node's CPU"),
        "memory_mib": (memory_mib, lease.memory_mib, "the lease's memory"),
        "gpu_milli": (gpu_milli, 1000 * len(lease.gpu_allocations), "the lease's GPUs"),
    }
    errors = {
        field: f"Must be between 0 and {limit} ({what})."
        for field, (value, limit, what) in bounds.items()
        if not 0 <= value <= limit
    }
    if errors:
        raise ValidationError(errors)
    updated = Lease.objects.filter(pk=lease.pk, state=S.COMMITTED).update(
        used_cpu_millicores=cpu_millicores,
        used_memory_mib=memory_mib,
        used_gpu_milli=gpu_milli,
        usage_reported_at=now,
    )
    if not updated:
        raise TransitionRefused("transition_not_allowed", "Usage is reported on committed leases.")
    lease.refresh_from_db()
    return lease
