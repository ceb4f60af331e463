"""The single path: each job in its own transaction through `lease_reserve` — the same guarded
path as the lease API — and each whole gang in one. It serves SQLite (`make run`), the jobs of
a plan whose apply failed (one by one isolates the bad one), and jobs that did not fit while
the pool holds reservations, which may backfill them."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_note_pending, job_transition
from leases import snapshot as snap
from leases.choices import LeaseState
from leases.explain import NoCapacity, explanation_dict
from leases.models import Lease
from leases.services import SCHEDULER_KEY_PREFIX, lease_reserve, quota
from leases.services.backfill import backfill_advice
from placement import Explanation, place_gang
from pools import knobs
from pools.reasons import Reason
from pools.statemachine import TransitionRefused, error_summary

from .admission import Admission
from .gangs import Gang, GangWaits, form_gangs, well_formed
from .outcomes import (
    SCHEDULER,
    TENANT_WIDE,
    PassResult,
    note_tenants_at_quota,
    placement_note,
    scheduling_error,
)
from .plan import Planned, core_request
from .volumes import VolumeWriters, writer_refusal_locked
from .window import gang_mates

logger = logging.getLogger(__name__)


def one_by_one(job_ids, now, result: PassResult) -> None:
    """The window's jobs placed one by one, then its gangs, each whole."""
    at_quota: set[tuple[int, int]] = set()
    owners = {
        job_id: (tenant_id, pool_id, gang)
        for job_id, tenant_id, pool_id, gang in Job.objects.filter(pk__in=job_ids).values_list(
            "id", "tenant_id", "pool_id", "gang"
        )
    }
    for job_id in job_ids:
        tenant_id, job_pool_id, gang = owners.get(job_id, (None, None, None))
        if gang:
            continue  # a gang is placed whole (`place_gangs`), never one member alone
        if (tenant_id, job_pool_id) in at_quota:
            continue  # reached its quota earlier in this pass: noted in bulk
        outcome = _attempt(job_id, now)
        if outcome is True:
            result.placed.append(job_id)
        elif outcome:
            result.pending[job_id] = outcome
        if outcome in TENANT_WIDE:  # the tenant's other jobs need no attempt if it is full
            at_quota |= note_tenants_at_quota(now, pool_id=job_pool_id, tenant_id=tenant_id)
    place_gangs([j for j in job_ids if owners.get(j, (0, 0, None))[2]], now, result)


def place_gangs(job_ids, now, result: PassResult) -> None:
    """The gangs of the window's members (`job_ids`), counted over the whole queue and formed
    as the batch pass forms them; each whole gang placed in one transaction, or every member
    waits with the reason."""
    queued = Job.objects.filter(pk__in=job_ids, state=JobState.QUEUED)
    members = well_formed(list(queued), now, result)
    if not members:
        return
    pool_id = members[0].pool_id
    ids = [job.pk for job in members] + gang_mates(pool_id, members)
    queued = Job.objects.filter(pk__in=ids, state=JobState.QUEUED).order_by("pk")
    members = well_formed(list(queued.select_related("pool", "tenant")), now, result)
    core_requests = {}
    for job in members:
        try:
            core_requests[job.pk] = core_request(job)
        except Exception as error:  # a corrupt stored request fails its own job only
            result.pending[job.pk] = scheduling_error(job.pk, error, now)
    members = [job for job in members if job.pk in core_requests]
    result.gangs.update(job.pk for job in members)
    admission = Admission.for_tenants(pool_id, {job.tenant_id for job in members})
    admission.volumes = VolumeWriters(pool_id)  # one writer per volume, gangs included
    for gang in form_gangs(members, core_requests):
        if isinstance(gang, GangWaits):
            outcome = gang.explanation
        else:
            try:
                outcome = _place_gang(gang, admission, now)
            except Exception as error:  # one bad gang never stops the pass
                outcome = {"code": Reason.SCHEDULING_ERROR.value, "message": error_summary(error)}
                logger.exception("scheduling pass: gang %s failed", gang.name)
        if outcome is True:
            result.placed.extend(job.pk for job in gang.members)
            continue
        for job in gang.members:
            job_note_pending(job=job, explanation=outcome, now=now)
            result.pending[job.pk] = outcome["code"]


def _place_gang(gang: Gang, admission: Admission, now) -> bool | dict:
    """`place_gang` on a fresh snapshot; every member through the Admission, then reserved on
    its node through `lease_reserve`, in one transaction: any refusal rolls the gang back (and
    what the Admission took). True, or the explanation every member waits with."""
    first = gang.members[0]
    nodes = snap.pool_snapshot(first.pool_id).nodes
    placed = place_gang(gang.replicas, nodes, knobs.pool_policy(first.pool))
    if isinstance(placed, Explanation):
        return NoCapacity(explanation_dict(placed, gang_reason=placed.gang_reason)).explanation
    with admission.trial() as trial:
        for job, placement in zip(gang.members, placed.placements, strict=True):
            if refusal := admission.admit(job, placement):
                return refusal
        try:
            _reserve_gang(gang, placed.placements, now)
        except NoCapacity as refusal:
            return refusal.explanation
        except TransitionRefused as refusal:  # the quota re-checked under its lock, a move
            return quota.explanation(refusal)
        trial.commit()
    return True


def _reserve_gang(gang: Gang, placements, now) -> None:
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(
            pk__in=[job.pk for job in gang.members], state=JobState.QUEUED
        )
        if locked.count() < len(gang.members):  # a member was cancelled or placed meanwhile
            raise TransitionRefused(
                Reason.PLAN_CONFLICT.value, f"a member of gang {gang.name} moved meanwhile"
            )
        for job, placement in zip(gang.members, placements, strict=True):
            _reserve_and_place(job, {**job.resources, "node_pin": placement.node}, now, gang.name)


def _attempt(job_id: int, now) -> bool | str | None:
    """One job through `place_one`; an unexpected error is recorded on the job."""
    try:
        return place_one(job_id, now)
    except Exception as error:  # one bad job never stops the pass
        return scheduling_error(job_id, error, now)


def place_one(job_id: int, now) -> bool | str | None:
    """True when placed; a reason code when it must wait; None when another pass has it."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("pool", "tenant")
            .filter(pk=job_id, state=JobState.QUEUED)
            .first()
        )
        if job is None:
            return None
        try:
            _reserve_and_place(job, job.resources, now)
        except NoCapacity as refusal:
            explanation = refusal.explanation
            if advice := _backfill_advice(job, now):
                explanation = {**explanation, "advice": advice}
        except TransitionRefused as refusal:  # quota, credit and other policy refusals
            explanation = quota.explanation(refusal)
        else:
            return True
    job_note_pending(job=job, explanation=explanation, now=now)
    return explanation.get("code", "pending")


def _backfill_advice(job: Job, now) -> str | None:
    """How a job that waits for capacity could run inside a reservation's hold, when it could."""
    if not holds_reservations(job.pool_id):
        return None
    expires_at = now + settings.LEASE_DEFAULT_TTL
    req = core_request(job)
    return backfill_advice(job.pool, job.tenant_id, req, job, now, expires_at)


def _reserve_and_place(job: Job, resources: dict, now, gang: str = "") -> None:
    """One job placed (its row locked by the caller): a lease through `lease_reserve` for
    `resources` (the job's, or pinned to its gang's node), and the job queued → leased in the
    same transaction. Refusals (NoCapacity, TransitionRefused) are the caller's. A job that
    writes a volume another job writes (or is placed to) is refused `volume_in_use`, under
    the volumes' row locks (the batch pass's `VolumeWriters` rule, race-safe here)."""
    if busy := writer_refusal_locked(job):
        refused = TransitionRefused(busy["code"], busy["message"])
        refused.extra = {"volume": busy["volume"]}
        raise refused
    lease = lease_reserve(
        pool=job.pool,
        tenant=job.tenant,
        request=resources,
        actor=SCHEDULER,
        duration=settings.LEASE_DEFAULT_TTL,
        job=job,
        idempotency_key=f"{SCHEDULER_KEY_PREFIX}{job.pk}-attempt-{job.attempts + 1}",
        now=now,
    )
    node = lease.placement.get("node", "")
    message, data = placement_note(node, lease.pk, lease.policy_version, gang)
    job_transition(
        job=job,
        to=JobState.LEASED,
        actor=SCHEDULER,
        reason=Reason.PLACED,
        message=message,
        now=now,
        changes={"attempts": job.attempts + 1, "pending_reason": {}},
        data=data,
    )


def holds_reservations(pool_id: int) -> bool:
    """A job that does not fit may still run inside a reservation's hold (backfill): only the
    single path knows how, and only when the pool holds reservations."""
    return Lease.objects.filter(
        pool_id=pool_id,
        state=LeaseState.RESERVED,
        window_start__isnull=False,
        backfill_of__isnull=True,
    ).exists()


def backfill(waiting: list[Planned], now, result: PassResult) -> None:
    """The single path for jobs that did not fit while reservations hold capacity; after a
    request that could not backfill, its equals need no attempt (same request, same hold: a
    backfill's hold is its runtime unless it can checkpoint, leases/services/backfill.py)."""
    failed = set()
    for p in waiting:
        hold = None if p.job.checkpointable else p.job.max_runtime_s
        key = (p.job.tenant_id, p.job.key, hold)
        if key in failed:
            continue
        outcome = _attempt(p.job.pk, now)
        if outcome is True:
            result.placed.append(p.job.pk)
            result.pending.pop(p.job.pk, None)
        else:
            failed.add(key)
