"""Jobs named into a reservation (`Job.reservation`, docs/leases.md "Jobs in a reservation"):
the pass hands each its reservation once the window opens, and it runs on that lease; before,
it waits with `reservation_window_not_open`. It never competes for the pool's other capacity
while its reservation is live; once the reservation has ended (released unclaimed, say), the
job is placed like any other and this step leaves it to the pass."""

from __future__ import annotations

from django.db import transaction

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_note_pending, job_transition
from leases.choices import LeaseState
from leases.models import Lease
from leases.services.lifecycle import running_backfills
from leases.services.reservations import reservation_take
from pools.reasons import Reason

from .outcomes import SCHEDULER, PassResult, placement_note, scheduling_error


def place_into_reservations(pool_id: int, job_ids: list[int], now, result: PassResult) -> set[int]:
    """The window's jobs whose reservation is live: placed into it when its window is open, or
    noted waiting for it. Returns their ids (the rest of the window goes on as usual)."""
    # from the reservations' side: a pool holds a few of them, and a long queue (the lease
    # index (pool, state), then the jobs' reservation index)
    live = set(
        Lease.objects.filter(
            pool_id=pool_id,
            state=LeaseState.RESERVED,
            window_start__isnull=False,
            reserved_jobs__state=JobState.QUEUED,
        ).values_list("reserved_jobs__pk", flat=True)
    ).intersection(job_ids)
    handled = set()
    for job_id in sorted(live):
        try:
            outcome = _place(job_id, now)
        except Exception as error:  # one bad job never stops the pass
            outcome = scheduling_error(job_id, error, now)
        if outcome is None:
            continue
        handled.add(job_id)
        if outcome is True:
            result.placed.append(job_id)
        else:
            result.pending[job_id] = outcome
    return handled


def _place(job_id: int, now) -> bool | str | None:
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("reservation")
            .filter(pk=job_id, state=JobState.QUEUED)
            .first()
        )
        if job is None or job.reservation is None:
            return None
        reservation = job.reservation
        if now < reservation.window_start:
            explanation = {
                "code": Reason.RESERVATION_WINDOW_NOT_OPEN.value,
                "message": f"waits for its reservation {reservation.pk} on its node: the window "
                f"opens at {reservation.window_start:%Y-%m-%d %H:%M:%S %Z}",
                "reservation": reservation.pk,
                "window_start": reservation.window_start.isoformat(),
            }
            job_note_pending(job=job, explanation=explanation, now=now)
            return explanation["code"]
        if running := running_backfills(reservation):
            explanation = {
                "code": Reason.RESERVATION_BACKFILLS_STOPPING.value,
                "message": f"its reservation {reservation.pk}'s window is open; waits until the"
                f" node confirms that the backfilled jobs' containers in it stopped (leases "
                f"{', '.join(map(str, running))})",
                "reservation": reservation.pk,
                "backfills": running,
            }
            job_note_pending(job=job, explanation=explanation, now=now)
            return explanation["code"]
        lease = reservation_take(lease=reservation, job=job, actor=SCHEDULER, now=now)
        if lease is None:
            return None  # ended or taken meanwhile: the pass places it like any job
        node = lease.placement.get("node", "")
        message, data = placement_note(node, lease.pk, lease.policy_version, "")
        job_transition(
            job=job,
            to=JobState.LEASED,
            actor=SCHEDULER,
            reason=Reason.PLACED,
            message=f"{message}: its reservation",
            now=now,
            changes={"attempts": job.attempts + 1, "pending_reason": {}},
            data=data | {"reservation": lease.pk},
        )
    return True
