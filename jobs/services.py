"""Job submission and lifecycle. Every state change writes a JobEvent and publishes it live."""

from __future__ import annotations

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from leases.choices import HOLDING, LeaseState
from leases.explain import IdempotencyKeyReused
from leases.models import Lease
from leases.services import check_ever_fits, lease_release, lease_stop, ledger
from leases.services.quota import storage_left_mib
from leases.services.reservations import reservation_for_job
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.models import ComputePool, PriorityClass, Quota, ResourceShape, Tenant
from pools.reasons import Reason
from pools.statemachine import Refusal, TransitionRefused, check_allowed, create_many, transition
from storage import services as volume_services
from storage.mounts import volume_placement

from .choices import JOB_TRANSITIONS, TERMINAL, AntiAffinityScope, JobState
from .events import publish_job_event
from .models import Job, JobEvent
from .signals import job_cancelled, job_ended, jobs_submitted


class QueueFull(Refusal):
    """The tenant already has its maximum of queued jobs in this pool (HTTP 429)."""

    status = 429
    code = "queue_full"


def max_queued_jobs(tenant: Tenant, pool: ComputePool) -> int:
    """Quota.max_queued_jobs of the tenant in the pool, else TENANT_MAX_QUEUED_JOBS."""
    limit = (
        Quota.objects.filter(tenant=tenant, pool=pool)
        .values_list("max_queued_jobs", flat=True)
        .first()
    )
    return settings.TENANT_MAX_QUEUED_JOBS if limit is None else limit


def check_queue_room(tenant: Tenant, pool: ComputePool) -> None:
    """Inside the submit's transaction: refuse a job past the tenant's cap of queued jobs in the
    pool, so that no tenant fills the control plane. Submits of one tenant and pool take turns
    (a transaction-scoped advisory lock on PostgreSQL), so concurrent submits never overshoot."""
    limit = max_queued_jobs(tenant, pool)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", [f"queue:{tenant.pk}:{pool.pk}"]
            )
    queued = Job.objects.filter(tenant=tenant, pool=pool, state=JobState.QUEUED).count()
    if queued >= limit:
        raise QueueFull(
            f"Tenant {tenant.slug} already has {queued} queued jobs in pool {pool.slug}, its "
            f"maximum ({limit}); cancel some or wait for them to start.",
            extra={"max_queued_jobs": limit},
        )


def _default_class(pool) -> PriorityClass | None:
    """The pool's `default_priority_class` (a knob), for a job that names none."""
    name = knobs_for(pool).default_priority_class
    return PriorityClass.objects.filter(name=name).first() if name else None


def job_submit(
    *,
    tenant: Tenant,
    pool: ComputePool,
    name: str,
    image: str,
    actor: Actor,
    shape: ResourceShape | None = None,
    resources: dict | None = None,
    command: list[str] | None = None,
    env: dict | None = None,
    priority_class: PriorityClass | None = None,
    checkpointable: bool = False,
    max_runtime_s: int = 3600,
    image_requested: str = "",
    secrets: dict | None = None,
    inputs: list | None = None,
    ports: list | None = None,
    network_policy: dict | None = None,
    retry_policy: dict | None = None,
    output_destination: str = "",
    output_limit_mib: int | None = None,
    volumes: list | None = None,
    image_platforms: list[str] | None = None,
    labels: dict | None = None,
    affinity: dict | None = None,
    affinity_preferred: dict | None = None,
    anti_affinity: dict | None = None,
    anti_affinity_scope: str = AntiAffinityScope.HOST,
    require_numa: bool = False,
    gang: dict | None = None,
    reservation: int | None = None,
    idempotency_key: str = "",
    idempotency_digest: str = "",
    trace: tuple[str, str] | None = None,
    drain_exempt: bool = False,
) -> Job:
    """A queued job. `image` is what the agent will run (a digest reference once the image
    is resolved), `image_requested` what the client sent (default: `image`). The data-plane
    fields arrive validated (pools.validation); None keeps the model's defaults.

    With `idempotency_key`, a second submit of the tenant with the same key returns the first
    job (nothing new is queued) when it asked the same (`idempotency_digest`), and is refused
    422 `idempotency_key_reused` otherwise — also when two such submits race.

    `trace`: (trace id, parent span id) of the client's `traceparent` (jobs/trace.py): the
    job joins that trace; None: it starts a new one of its own.

    `drain_exempt`: the job may also be placed on a draining node (its request's
    `drain_exempt`, which the core's `node_schedulable` filter and the ledger's guard read).
    Only a volume's export sets it (jobs/volume_export.py), never a tenant's submit body."""
    if (shape is None) == (resources is None):
        raise ValueError("give exactly one of shape or resources")
    if idempotency_key and (earlier := _keyed_job(tenant, idempotency_key, idempotency_digest)):
        return earlier
    resources = shape.as_request() if shape else resources
    # The placement fields travel in the request the pass reserves with (leases.snapshot's
    # core_request reads them; the lease keeps `labels` for other jobs' anti-affinity).
    placement = {
        key: value
        for key, value in (
            ("labels", labels),
            ("affinity", affinity),
            ("affinity_preferred", affinity_preferred),
            ("anti_affinity", anti_affinity),
            # where it looks (host | zone), with the labels it avoids
            ("anti_affinity_scope", str(anti_affinity_scope) if anti_affinity else ""),
            ("require_numa", require_numa),
        )
        if value
    }
    output_limit_mib = _output_limit(tenant, pool, output_limit_mib, output_destination)
    # Its persistent volumes pin it to their node, a hard constraint the core's node_pin
    # filter keeps; the pass names a wait there `volume_node_full`/`…_unavailable` and holds a
    # read-write mount while another job has the volume (storage/scheduling.py).
    placement |= volume_placement(tenant, pool, volumes)
    if drain_exempt:
        placement["drain_exempt"] = True
    priority_class = priority_class or _default_class(pool)
    # the /outputs filesystem is disk on the node: the request reserves it with the scratch
    resources = {**resources, **placement, "output_limit_mib": output_limit_mib}
    if not drain_exempt:  # the serializers refuse the key; whoever else calls, it is not kept
        resources.pop("drain_exempt", None)
    # A shape no node of the pool could ever hold is refused now (NeverFits, 422), not queued
    # forever: the same answer as POST /compute-leases.
    # The image's platforms count too: an amd64-only image never fits a pool of arm64 nodes.
    check_ever_fits(
        pool=pool,
        tenant=tenant,
        request=resources,
        image_platforms=image_platforms or (),
        gang=gang,
    )
    try:
        with transaction.atomic():
            # A person's submit is capped (the system's builders, demo and benchmarks are not).
            if actor.is_person:
                check_queue_room(tenant, pool)
            # its volumes locked and still live: a delete takes turns with this submit
            volume_services.volumes_hold(tenant.pk, pool.pk, volumes)
            if reservation is not None:
                reservation = _reservation(
                    reservation, tenant, pool, resources, max_runtime_s, image_platforms, gang
                )
            job = Job.objects.create(
                tenant=tenant,
                pool=pool,
                name=name,
                image=image,
                shape=shape,
                resources=resources,
                command=command or [],
                env=env or {},
                priority_class=priority_class,
                checkpointable=checkpointable,
                max_runtime_s=max_runtime_s,
                submitted_by=actor.user,
                image_requested=image_requested or image,
                image_platforms=image_platforms or [],
                secrets=secrets or {},
                inputs=inputs or [],
                ports=ports or [],
                output_destination=output_destination,
                output_limit_mib=output_limit_mib,
                volumes=volumes or [],
                labels=labels or {},
                affinity=affinity or {},
                affinity_preferred=affinity_preferred or {},
                anti_affinity=anti_affinity or {},
                anti_affinity_scope=anti_affinity_scope,
                require_numa=require_numa,
                gang=gang or {},
                reservation=reservation,
                idempotency_key=idempotency_key,
                idempotency_digest=idempotency_digest,
                **({"trace_id": trace[0], "parent_span_id": trace[1]} if trace else {}),
                **({"network_policy": network_policy} if network_policy is not None else {}),
                **({"retry_policy": retry_policy} if retry_policy is not None else {}),
            )
            event = JobEvent.record(
                job,
                actor=actor,
                from_state="",
                to_state=JobState.QUEUED,
                reason=Reason.SUBMITTED,
                message=f"submitted to pool {pool.slug}",
            )
            transaction.on_commit(lambda: publish_job_event(job, event))
            jobs_submitted.send(sender=Job, pool_id=pool.pk)
    except IntegrityError:  # a racing submit with the same key committed first
        if idempotency_key and (earlier := _keyed_job(tenant, idempotency_key, idempotency_digest)):
            return earlier
        raise
    return job


def _reservation(lease_id, tenant, pool, resources, max_runtime_s, platforms, gang):
    """The reservation a job names (leases.services.reservation_for_job), locked so that two
    submits naming it take turns; one live job per reservation. A ValidationError on
    `reservation` (400) when the job may not run in it."""
    if gang:
        raise ValidationError({"reservation": "A gang's jobs cannot name a reservation."})
    try:
        lease = reservation_for_job(
            lease_id=lease_id,
            tenant=tenant,
            pool=pool,
            request=resources,
            max_runtime_s=max_runtime_s,
            image_platforms=platforms or (),
            now=timezone.now(),
        )
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        named = Job.objects.filter(reservation=lease).exclude(state__in=TERMINAL).first()
        if named is not None:
            raise ValidationError(f"Reservation {lease.pk} is already named by job {named.pk}.")
    except ValidationError as error:
        raise ValidationError({"reservation": error.messages}) from error
    return lease


def jobs_submit_many(*, pool: ComputePool, specs: list[dict], actor: Actor, now=None) -> list:
    """Many queued jobs at once, written as `job_submit` writes each one (the job with its
    request, its `submitted` event; each distinct request checked once to fit the pool ever)
    but in bulk INSERTs and without live events: for the scheduler benchmark's queues of tens
    of thousands, from the system's builders only (no queue room, no image resolution). Each
    spec: `tenant`, `name`, `image`, `resources` (a request dict), and other Job fields
    (priority_class, image_platforms …)."""
    now = now or timezone.now()
    checked = set()
    jobs = []
    default_class = _default_class(pool)
    for spec in specs:
        spec = dict(spec)
        if spec.get("priority_class") is None:
            spec["priority_class"] = default_class
        tenant, resources = spec.pop("tenant"), spec.pop("resources")
        platforms = spec.setdefault("image_platforms", [])
        key = orjson.dumps([resources, platforms], option=orjson.OPT_SORT_KEYS)
        if key not in checked:
            check_ever_fits(pool=pool, tenant=tenant, request=resources, image_platforms=platforms)
            checked.add(key)
        spec.setdefault("image_requested", spec["image"])
        jobs.append(
            Job(
                tenant=tenant,
                pool=pool,
                resources=resources,
                submitted_by=actor.user,
                created_at=now,
                **spec,
            )
        )
    created = create_many(
        jobs,
        path=[(JobState.QUEUED, Reason.SUBMITTED, f"submitted to pool {pool.slug}")],
        allowed=JOB_TRANSITIONS,
        event_model=JobEvent,
        actor=actor,
        now=now,
    )
    jobs_submitted.send(sender=Job, pool_id=pool.pk)  # after its commit (or the caller's)
    return created


def _output_limit(
    tenant: Tenant, pool: ComputePool, wanted: int | None, destination: str = ""
) -> int:
    """The job's output limit (the pool's knob `output_limit_mib` when it names none); 400 on
    `output_limit_mib` when it is above what the tenant's storage quota in the pool has left.
    Outputs bound for the tenant's own bucket (`s3://…`) are not kept here: no quota applies."""
    if wanted is None:
        wanted = knobs_for(pool).output_limit_mib
    if destination:
        return wanted
    left = storage_left_mib(tenant.pk, pool.pk)
    if left is not None and wanted > left:
        raise ValidationError(
            {
                "output_limit_mib": f"{wanted} MiB is more than the {max(0, int(left))} MiB "
                f"left of tenant {tenant.slug}'s storage quota in pool {pool.slug}."
            }
        )
    return wanted


def _keyed_job(tenant: Tenant, key: str, digest: str) -> Job | None:
    earlier = Job.objects.filter(tenant=tenant, idempotency_key=key).first()
    if earlier is not None and earlier.idempotency_digest != digest:
        raise IdempotencyKeyReused(
            f"Idempotency key {key!r} was used for job {earlier.pk}, which asked for something "
            "else; use a new key for a new job."
        )
    return earlier


def job_transition(*, job: Job, to: str, actor: Actor, reason: str, **details) -> Job:
    """The one way a job changes state; `details`: message, now, changes, data, check. A job
    that ends sends `job_ended` once that commits. A job with volumes attaches them as it
    starts (refused `volume_in_use` when another job writes one: nothing changes) and detaches
    them when it leaves its node (re-queued or ended), in the same transaction."""
    if job.volumes:
        _volumes_follow(job, to, actor, details.get("now"))
    job = transition(
        Job,
        job.pk,
        to=to,
        allowed=JOB_TRANSITIONS,
        event_model=JobEvent,
        actor=actor,
        reason=reason,
        on_commit=publish_job_event,
        **details,
    )
    if to in TERMINAL:
        job_id = job.pk
        transaction.on_commit(lambda: job_ended.send(sender=Job, job_id=job_id, state=to))
    return job


def _volumes_follow(job: Job, to: str, actor: Actor, now) -> None:
    """A job's volume attachments follow its state (docs/storage.md "Persistent volumes")."""
    if to == JobState.STARTING:
        for mount in job.volumes:
            volume_services.volume_attach(
                volume_id=mount["volume"],
                job_id=job.pk,
                read_only=bool(mount.get("read_only")),
                actor=actor,
                now=now,
            )
    elif to not in (JobState.LEASED, JobState.RUNNING, JobState.CHECKPOINTING):
        volume_services.volumes_detach(job_id=job.pk, actor=actor, now=now)


def jobs_placed_many(placed, *, actor: Actor, now) -> JobEvent | None:
    """queued → leased for many jobs at once (the batch scheduling pass), their rows locked by
    the caller's transaction: one UPDATE and one COPY of their `placed` events, writing what
    `job_transition` writes one by one. `placed`: (job id, message, data) of each one's
    `placed` event. Refused as `job_transition` refuses (TransitionRefused, nothing written
    once the caller rolls back) when the map forbids it or a job is no longer queued. Returns
    the event they share."""
    if not placed:
        return None
    job_ids = [job_id for job_id, _, _ in placed]
    check_allowed(Job, job_ids[0], JobState.QUEUED, JobState.LEASED, JOB_TRANSITIONS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} SET state = %s, state_changed_at = %s, "
            "attempts = attempts + 1, pending_reason = '{}'::jsonb "
            "WHERE id = ANY(CAST(%s AS bigint[])) AND state = %s",
            [JobState.LEASED.value, now, job_ids, JobState.QUEUED.value],
        )
        moved = cursor.rowcount
    if moved != len(job_ids):  # the caller rolls back: no job goes to leased
        raise TransitionRefused(
            "transition_not_allowed",
            f"{len(job_ids) - moved} of {len(job_ids)} jobs are not queued: they cannot go to "
            "leased",
        )
    base = JobEvent.build(
        None,
        actor=actor,
        from_state=JobState.QUEUED,
        to_state=JobState.LEASED,
        reason=Reason.PLACED,
        at=now,
    )
    events = [{"job_id": job_id, "message": m, "data": data} for job_id, m, data in placed]
    ledger.copy_rows(base, events)
    return base


def job_note_pending(*, job: Job, explanation: dict, now=None) -> None:
    """Record why the scheduler could not place a queued job (not a state change)."""
    Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
        pending_reason=explanation, pending_checked_at=now or timezone.now()
    )


def jobs_note_pending(*, tenant_id: int, pool_id: int, explanation: dict, now=None) -> int:
    """The same for every queued job of a tenant in a pool at once (the scheduling pass skips a
    tenant at its quota); jobs that already say so are not rewritten on every pass."""
    return (
        Job.objects.filter(state=JobState.QUEUED, tenant_id=tenant_id, pool_id=pool_id)
        .exclude(pending_reason=explanation)
        .update(pending_reason=explanation, pending_checked_at=now or timezone.now())
    )


def job_cancel(*, job: Job, actor: Actor, message: str = "") -> Job:
    """Cancelled, and in the same transaction its lease ends: at once when nothing was started
    (reserved: the agent creates a container only once its `starting` report committed the
    lease), else it is `stopping` — still holding the capacity, so nothing else is placed there
    while the container gets its stop grace — until the agent confirms the stop (job_report).
    The node cannot renew either for work nobody wants."""
    with transaction.atomic():
        job = job_transition(
            job=job,
            to=JobState.CANCELLED,
            actor=actor,
            reason=Reason.CANCELLED_BY_USER,
            message=message or "cancelled",
        )
        job_cancelled.send(sender=Job, job=job, actor=actor)
        # after the job's row lock: a pass that placed it meanwhile has committed its lease
        for lease in job.leases.filter(state__in=HOLDING).order_by("id"):
            if lease.state in (LeaseState.COMMITTED, LeaseState.UNCERTAIN):
                lease_stop(lease=lease, actor=actor, message=f"job {job.pk} was cancelled")
                continue
            lease_release(
                lease=lease,
                actor=actor,
                reason=Reason.RELEASED_JOB_ENDED,
                message=f"job {job.pk} was cancelled",
            )
    return job


def job_finish(
    *,
    job: Job,
    actor: Actor,
    exit_code: int | None,
    reason: str = "",
    message: str = "",
    now=None,
    check=None,
) -> Job:
    """The job ended on its node: exit code 0 succeeds (`exited_zero`), anything else fails
    with `reason` (default `exited_nonzero`; `oom_killed`, `image_pull_failed` … from the
    agent). Its holding leases are released in the same transaction."""
    now = now or timezone.now()
    succeeded = exit_code == 0 and reason in ("", Reason.EXITED_ZERO)
    reason = Reason.EXITED_ZERO if succeeded else (reason or Reason.EXITED_NONZERO)
    if not message:
        message = f"process exited with {exit_code}" if exit_code is not None else reason
    with transaction.atomic():
        job = job_transition(
            job=job,
            to=JobState.SUCCEEDED if succeeded else JobState.FAILED,
            actor=actor,
            reason=reason,
            changes={"exit_code": exit_code},
            message=message,
            now=now,
            check=check,
        )
        job_release_leases(job=job, actor=actor, message=f"job {job.pk} {job.state}", now=now)
    return job


def job_volume_gone(*, job_id: int, actor: Actor, message: str, now=None) -> Job | None:
    """A placed job whose volume is gone (deleted or expired) by the time it starts: its start
    was refused `volume_gone` (storage.services.volume_attach), and it fails with that reason
    and its lease released, rather than waiting for the lease to expire and being queued again
    for a volume that never comes back. None when the job moved meanwhile."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.LEASED:
            return None
        return job_finish(
            job=job,
            actor=actor,
            exit_code=None,
            reason=Reason.VOLUME_GONE,
            message=message,
            now=now,
        )


def job_release_leases(*, job: Job, actor: Actor, message: str, now=None) -> None:
    """The job's holding leases end with it (call under the job's row lock, in its
    transaction): the capacity is back at once."""
    for lease in job.leases.filter(state__in=HOLDING).order_by("id"):
        lease_release(
            lease=lease, actor=actor, reason=Reason.RELEASED_JOB_ENDED, message=message, now=now
        )
