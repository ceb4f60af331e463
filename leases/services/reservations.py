"""Jobs named into reservations: a reservation (a lease made with a window) runs the job of its
tenant that names it. At submit, `reservation_for_job` checks that the job may: the tenant's
reservation in the job's pool, still reserved, the job fits what it holds and its maximum
runtime fits the window (jobs.services adds: no other live job names it). Once the window
opens, the scheduling pass hands the reservation to the job (`reservation_take`); the job's
agent commits it when the container starts, and that commit is the claim (`lease_commit`).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from leases import snapshot as snap
from leases.choices import LeaseState
from leases.models import Lease
from nodes.push import push_assignments
from placement import place
from placement import types as core
from pools.actors import Actor
from pools.reasons import Reason

from .lifecycle import lease_note


def reservation_for_job(
    *, lease_id, tenant, pool, request: dict, max_runtime_s: int, image_platforms=(), now
) -> Lease:
    """The reservation `lease_id` a job of `tenant` in `pool` may name, or a ValidationError
    saying why not (the API answers it as a 400 on `reservation`). Another tenant's lease reads
    as one that does not exist."""
    lease = (
        Lease.objects.filter(pk=lease_id, tenant=tenant, backfill_of__isnull=True)
        .exclude(window_start__isnull=True)
        .first()
    )
    if lease is None:
        raise ValidationError(f"No reservation {lease_id} of tenant {tenant.slug}.")
    if lease.pool_id != pool.pk:
        raise ValidationError(f"Reservation {lease.pk} is in another pool.")
    if lease.state != LeaseState.RESERVED or lease.job_id is not None or lease.expires_at <= now:
        raise ValidationError(f"Reservation {lease.pk} is {lease.state}: it takes no job now.")
    window_s = (lease.window_end - lease.window_start).total_seconds()
    if max_runtime_s > window_s:
        raise ValidationError(
            f"The job's max_runtime_s ({max_runtime_s}) is longer than reservation {lease.pk}'s "
            f"window ({int(window_s)} s): it would be stopped when the window ends."
        )
    view = snap.reservation_view(lease, whole=True)
    req = snap.core_request(request, tenant.pk, image_platforms)
    found = place(req, [view], snap.pool_policy(pool)) if view is not None else None
    if not isinstance(found, core.Placement):
        reasons = ", ".join(sorted(found.reasons)) if found is not None else "node gone"
        raise ValidationError(
            f"The job does not fit what reservation {lease.pk} holds "
            f"({lease.cpu_millicores}m CPU, {lease.memory_mib} MiB, "
            f"{len(lease.gpu_allocations)} GPU(s)): {reasons}."
        )
    return lease


def reservation_take(*, lease: Lease, job, actor: Actor, now) -> Lease | None:
    """The reservation becomes the lease `job` runs on (its window is open), with an event; None
    when it can no longer: ended, taken, or not open yet. Call under the job's row lock."""
    with transaction.atomic():
        locked = Lease.objects.select_for_update().filter(pk=lease.pk).first()
        if (
            locked is None
            or locked.state != LeaseState.RESERVED
            or locked.job_id not in (None, job.pk)
            or now < locked.window_start
            or locked.expires_at <= now
        ):
            return None
        locked.job = job
        lease_note(
            locked,
            fields=["job"],
            actor=actor,
            reason=Reason.PLACED,
            message=f"job {job.pk} placed into this reservation; its start claims it",
            now=now,
            data={"job": job.pk},
        )
        push_assignments([locked.node_id])  # the job is the node's work now
    return locked
