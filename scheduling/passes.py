"""The scheduling pass: queued jobs become leases, in the queue's order, planned together.

One pass per pool (PostgreSQL): read a window of queued jobs (`queued_jobs`, round-robin over
tenants, retries past their backoff), order it (`placement.queue.order` fed by the
tenants' fair-share standings), take ONE snapshot of the pool, plan every job on it in the pure
core (`placement.batch.plan`: the decisions `place` would make one by one; quotas through
each tenant's `Headroom`), then apply the plan in ONE transaction (`_apply`):

1. lock the planned jobs' rows (SKIP LOCKED): a job another pass or a cancel holds is dropped
   from the plan, neither placed nor noted, so a cancel always wins;
2. lock the quota rows and re-check each tenant's headroom under them;
3. take the capacity with guarded writes per node (`ledger.take_capacity_many`): a node whose
   capacity another pass or the lease API took meanwhile is dropped from the plan, its jobs
   stay queued with `plan_conflict` for the next pass;
4. insert the leases and their events, move the jobs to `leased` with their `placed` events,
   and note every job that did not fit with its explanation, in bulk: rows built as plain
   dicts over one base row per table, one statement per table.

One bad job never stops the pass: a job whose request cannot be planned is recorded on its own
(`scheduling_error`); a plan whose apply fails rolls back as a whole and its jobs are then
placed one by one on the single path (`_place_one`, through `lease_reserve`), which isolates
the bad one. The single path also serves SQLite (`make run`) and jobs that do not fit while the
pool holds reservations, which may backfill them.
"""

from __future__ import annotations

import copy
import gc
import logging
import threading
import time
from collections import defaultdict
from contextlib import ContextDecorator
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import SimpleNamespace

import orjson
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import F, Q, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from jobs.choices import JobState
from jobs.events import STREAM as JOB_STREAM
from jobs.lifecycle import job_lost
from jobs.models import Job, JobEvent
from jobs.services import job_note_pending, job_transition, jobs_note_pending, jobs_placed_many
from leases import snapshot as snap
from leases.choices import HOLDING, LeaseState
from leases.explain import NoCapacity, explanation_dict
from leases.models import Lease
from leases.services import SCHEDULER_KEY_PREFIX, lease_reserve, ledger, quota, tenants_at_quota
from leases.window import request_digest
from placement import Explanation, apply_placement, batch, place_gang
from placement.fragmentation import Workload
from placement.queue import (
    BACKFILL_WOULD_DELAY_HEAD,
    SHORT_SHARE_RESERVED,
    Gate,
    order,
)
from pools import validation
from pools.actors import Actor
from pools.events import MESSAGE_TYPE, event_fields, groups_of
from pools.models import ComputePool, PriorityClass
from pools.reasons import Reason
from pools.statemachine import TransitionRefused, error_summary, record_sweep_failure
from scheduling import fairshare
from scheduling.health import record_pass
from scheduling.preemption import preempt_for

SCHEDULER = Actor.system("scheduler")
logger = logging.getLogger(__name__)
# highest priority first, then oldest
PASS_ORDER = (
    F("priority_class__value").desc(nulls_last=True),
    F("created_at").asc(),
    F("id").asc(),
)


@dataclass
class PassResult:
    placed: list[int] = field(default_factory=list)
    pending: dict[int, str] = field(default_factory=dict)  # job id → reason code
    gangs: set[int] = field(default_factory=set)  # gang members: never preempted for one by one


def queued_jobs(*, pool_id=None, limit: int, skip=frozenset(), now=None):
    """The pass's window: (job id, tenant id, pool id) of up to `limit` queued jobs, in
    PASS_ORDER. It is filled round-robin over (tenant, pool) — every tenant's first job, then
    every tenant's second, … — so one tenant's backlog cannot keep another's job out of it.
    `skip`: (tenant id, pool id) pairs left out (at their quota). A retried job waits out its
    backoff (`not_before`)."""
    jobs = Job.objects.filter(state=JobState.QUEUED)
    jobs = jobs.filter(Q(not_before__isnull=True) | Q(not_before__lte=now or timezone.now()))
    if pool_id is not None:
        jobs = jobs.filter(pool_id=pool_id)
    for tenant_id, skipped_pool_id in skip:
        jobs = jobs.exclude(tenant_id=tenant_id, pool_id=skipped_pool_id)
    turn = Window(RowNumber(), partition_by=[F("tenant_id"), F("pool_id")], order_by=PASS_ORDER)
    window = jobs.annotate(turn=turn).order_by("turn", *PASS_ORDER).values("id")[:limit]
    return (
        Job.objects.filter(pk__in=Subquery(window))
        .order_by(*PASS_ORDER)
        .values_list("id", "tenant_id", "pool_id")
    )


def scheduling_pass(*, now=None, pool_id=None, limit: int | None = None) -> PassResult:
    now = now or timezone.now()
    result = PassResult()
    at_quota = _note_tenants_at_quota(now, pool_id=pool_id)
    limit = limit or settings.SCHEDULER_PASS_MAX_JOBS
    window: dict[int, list[int]] = defaultdict(list)
    for job_id, _, job_pool_id in queued_jobs(pool_id=pool_id, limit=limit, skip=at_quota, now=now):
        window[job_pool_id].append(job_id)
    for job_pool_id, job_ids in window.items():
        started, clock = timezone.now(), time.perf_counter()
        before = PassResult(list(result.placed), dict(result.pending))
        try:  # the tenants' decayed usage brought up to now, before their standings are read
            fairshare.charge(job_pool_id, now)
        except Exception:
            logger.exception("scheduling pass: fair-share charge of pool %s failed", job_pool_id)
        if not ledger.postgresql():
            _one_by_one(job_ids, now, result)
        else:
            try:
                pool_pass(job_pool_id, job_ids, now, result)
            except Exception:  # the plan rolled back as a whole: one by one isolates a bad job
                logger.exception("scheduling pass: the plan of pool %s failed", job_pool_id)
                done = set(result.placed) | set(result.pending)
                _one_by_one([j for j in job_ids if j not in done], now, result)
        _after_pool(job_pool_id, job_ids, before, result, now, started, clock)
    return result


def _after_pool(pool_id, job_ids, before: PassResult, result: PassResult, now, started, clock):
    """What follows a pool's pass: priority work that waits for capacity may preempt
    (scheduling/preemption.py), and the pass is recorded for the operators' health charts.
    Neither may fail the pass: each failure is logged and the pass goes on."""
    pending = {j: code for j, code in result.pending.items() if j not in before.pending}
    waiting = [
        j for j, code in pending.items() if code == NoCapacity.code and j not in result.gangs
    ]
    try:
        if waiting:
            preempt_for(pool_id, waiting, now)
    except Exception:
        logger.exception("scheduling pass: preemption in pool %s failed", pool_id)
    codes = list(pending.values())
    record_pass(
        pool_id=pool_id,
        started_at=started,
        duration_s=time.perf_counter() - clock,
        considered=len(job_ids),
        placed=len(result.placed) - len(before.placed),
        conflicts=codes.count(Reason.PLAN_CONFLICT.value),
        errors=codes.count(Reason.SCHEDULING_ERROR.value),
    )


def _one_by_one(job_ids, now, result: PassResult) -> None:
    """The single path: each job in its own transaction through `lease_reserve`."""
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
            continue  # a gang is placed whole (`_gangs_whole`), never one member alone
        if (tenant_id, job_pool_id) in at_quota:
            continue  # reached its quota earlier in this pass: noted in bulk
        try:
            outcome = _place_one(job_id, now)
        except Exception as error:  # one bad job never stops the pass
            outcome = _scheduling_error(job_id, error, now)
        if outcome is True:
            result.placed.append(job_id)
        elif outcome:
            result.pending[job_id] = outcome
        if outcome in TENANT_WIDE:  # the tenant's other jobs need no attempt if it is full
            at_quota |= _note_tenants_at_quota(now, pool_id=job_pool_id, tenant_id=tenant_id)
    _gangs_whole([j for j in job_ids if owners.get(j, (0, 0, None))[2]], now, result)


def _gangs_whole(job_ids, now, result: PassResult) -> None:
    """The single path's gangs (SQLite, or after a failed plan): each complete gang of the
    window's members placed whole in one transaction — the core's `place_gang` on a fresh
    snapshot, then each member reserved on its node through `lease_reserve` — or not at all:
    any refusal rolls the gang back and every member waits with it (the batch pass's rules)."""
    members = list(Job.objects.filter(pk__in=job_ids, state=JobState.QUEUED))
    members = _gangs_checked(members, now, result)
    groups: dict[tuple, list[Job]] = {}
    for job in members:
        groups.setdefault((job.pool_id, job.tenant_id, job.gang["name"]), [])
    for pool_id, tenant_id, name in groups:
        mates = _gangs_checked(
            Job.objects.filter(
                pool_id=pool_id, tenant_id=tenant_id, state=JobState.QUEUED, gang__name=name
            ).select_related("pool", "tenant"),
            now,
            result,
        )
        gang = sorted(mates, key=lambda job: job.pk)  # members in job-id order, as in the batch
        result.gangs.update(job.pk for job in gang)
        try:
            outcome = _gang_whole(gang, now)
        except Exception as error:  # one bad gang never stops the pass
            outcome = {"code": Reason.SCHEDULING_ERROR.value, "message": error_summary(error)}
            logger.exception("scheduling pass: gang %s failed", name)
        if outcome is True:
            result.placed.extend(job.pk for job in gang[: gang[0].gang["size"]])
            continue
        for job in gang:
            job_note_pending(job=job, explanation=outcome, now=now)
            result.pending[job.pk] = outcome["code"]


def _gang_whole(mates: list[Job], now) -> bool | dict:
    first = mates[0]
    name, size, topology = (first.gang[key] for key in ("name", "size", "topology"))
    if len(mates) < size:
        return {"code": GANG_INCOMPLETE, "message": f"{len(mates)} of {size} members queued"}
    gang = mates[:size]
    requests = [snap.core_request(job.resources, job.tenant_id) for job in gang]
    if any(job.gang != first.gang for job in gang) or any(
        _alike(r) != _alike(requests[0]) for r in requests
    ):
        message = f"the members of gang {name} ask for different resources, size or topology"
        return {"code": GANG_MISMATCH, "message": message}
    policy = snap.pool_policy(first.pool)
    nodes = snap.pool_snapshot(first.pool_id).nodes
    placed = place_gang(replace(requests[0], replicas=size, gang=topology), nodes, policy)
    if isinstance(placed, Explanation):
        return NoCapacity(explanation_dict(placed, gang_reason=placed.gang_reason)).explanation
    try:
        with transaction.atomic():
            locked = Job.objects.select_for_update().filter(
                pk__in=[job.pk for job in gang], state=JobState.QUEUED
            )
            if locked.count() < size:  # a member was cancelled or placed meanwhile
                raise TransitionRefused(
                    Reason.PLAN_CONFLICT.value, f"a member of gang {name} moved meanwhile"
                )
            for job, placement in zip(gang, placed.placements, strict=True):
                _reserve_and_place(job, {**job.resources, "node_pin": placement.node}, now, name)
    except NoCapacity as refusal:
        return refusal.explanation
    except TransitionRefused as refusal:
        return quota.explanation(refusal)
    return True


# --- the batch pass --------------------------------------------------------------------------


@dataclass(slots=True)
class _Job:
    """A queued job as the pass reads it: the columns it needs, no model instance (building
    20,000 of those costs a second). `key`: its request as canonical JSON, which equal
    requests share (one core request, one digest for them all)."""

    pk: int
    name: str
    tenant_id: int
    resources: dict
    image: str
    image_platforms: list
    attempts: int
    max_runtime_s: int | None
    state_changed_at: datetime
    priority: int | None
    max_wait_s: int | None
    key: str = ""
    gang: dict | None = None  # {"name", "size", "topology"}, or {}
    # the job model's visibility rule: pools.events.groups_of serves a _Job as a Job
    visibility = Job.visibility


def _read_jobs(job_ids: list[int]) -> list[_Job]:
    """The queued jobs among `job_ids`, in one query with a typed array parameter (as
    `_lock_queued`). Their JSON comes as text, each distinct text parsed once (a queue holds a
    few shapes many times over): equal requests share one dict, and the text, jsonb's canonical
    form, is their key."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT j.id, j.name, j.tenant_id, j.resources::text, j.image, "
            "j.image_platforms::text, j.attempts, j.max_runtime_s, j.state_changed_at, "
            f"p.value, p.max_wait_s, j.gang::text FROM {Job._meta.db_table} j "
            f"LEFT JOIN {PriorityClass._meta.db_table} p ON p.id = j.priority_class_id "
            "WHERE j.id = ANY(CAST(%s AS bigint[])) AND j.state = %s",
            [job_ids, JobState.QUEUED.value],
        )
        rows = cursor.fetchall()
    parsed: dict[str, object] = {}
    jobs = []
    for pk, name, tenant_id, resources, image, platforms, *rest, gang in rows:
        for text in (resources, platforms, gang):
            if text not in parsed:
                parsed[text] = orjson.loads(text)
        job = _Job(pk, name, tenant_id, parsed[resources], image, parsed[platforms], *rest)
        job.key, job.gang = resources, parsed[gang]
        jobs.append(job)
    return jobs


@dataclass(slots=True)
class _Planned:
    job: _Job
    placement: object = None  # core Placement
    decision: dict | None = None
    explanation: dict | None = None  # why it waits (pending_reason), when not placed
    gang: tuple | None = None  # (tenant id, gang name, first member) of a gang placed whole


class _GcPause(ContextDecorator):
    """The cyclic garbage collector paused while any pass of the process runs. A pass makes
    hundreds of thousands of objects that live until it ends (node views, placements, rows)
    and next to no garbage cycles: the collector's full sweeps over them took half of the
    plan's time (5,000 nodes × 20,000 jobs). Reference counting still frees everything else;
    the collector resumes, as it was, when the last pass ends."""

    def __init__(self):
        self.lock = threading.Lock()
        self.passes = 0
        self.resume = False

    def __enter__(self):
        with self.lock:
            if not self.passes:
                self.resume = gc.isenabled()
                gc.disable()
            self.passes += 1

    def __exit__(self, *exc):
        with self.lock:
            self.passes -= 1
            if not self.passes and self.resume:
                gc.enable()


@_GcPause()
def pool_pass(pool_id: int, job_ids: list[int], now, result: PassResult, timings=None) -> None:
    """One pool's part of a pass: read, order, snapshot, plan, apply (module docstring).
    `timings` (a dict), when given, receives the seconds of each phase (the benchmark)."""
    clock = _Clock(timings)
    pool = ComputePool.objects.get(pk=pool_id)
    jobs = _gangs_checked(_read_jobs(job_ids), now, result)
    # a gang is planned whole: its members outside the window too
    jobs += _gangs_checked(_gang_mates(pool_id, jobs), now, result)
    requests, shared = {}, {}  # equal requests share one core Request
    for job in jobs:
        key = (job.key, job.tenant_id, tuple(job.image_platforms or ()), job.image)
        try:
            if key not in shared:
                shared[key] = _core_request(job)
            requests[job.pk] = shared[key]
        except Exception as error:  # a corrupt stored request fails its own job only
            result.pending[job.pk] = _scheduling_error(job.pk, error, now)
    jobs = [job for job in jobs if job.pk in requests]
    # Fragmentation is measured against the mix of work asking for the pool: this window's
    # requests (FGD's "typical tasks"; the memory-coupled default needs their memory).
    policy = snap.pool_policy(pool)
    if requests:
        policy = policy.with_workload(Workload.from_requests(requests.values()))
    # with the nodes' lease ends: a job that does not fit is told when capacity frees up
    view = snap.pool_snapshot(
        pool_id, work=any(snap.needs_work(r, policy) for r in requests.values())
    )
    queue = _Queue(pool_id, jobs, view, now)
    jobs = queue.jobs
    clock.lap("snapshot_s")
    headroom = quota.quota_headroom(pool_id, {job.tenant_id for job in jobs})
    refusals: dict[int, dict] = {}  # job id → why admit refused the placement
    members = [job for job in jobs if job.gang]  # planned after the others, each gang whole
    jobs = [job for job in jobs if not job.gang]

    def admit_job(job: _Job, placement) -> str:
        queued = queue.queued[job.pk]
        if code := queue.gate.admits(queued):
            refusals[job.pk] = {"code": code, "message": GATE_MESSAGES[code]}
            return code
        room = headroom.get(job.tenant_id)
        over = (
            room.take(
                cpu_millicores=placement.cpu_millicores,
                memory_mib=placement.memory_mib,
                gpus=queued.demand[2],
            )
            if room is not None
            else ""
        )
        if over:
            refusals[job.pk] = room.explanation(over)
            return over
        queue.gate.took(queued)
        return ""

    def admit(position: int, placement) -> str:
        return admit_job(jobs[position], placement)

    def waited(position: int, explanation) -> None:
        near = explanation.nearest_miss
        fits_at = getattr(near, "fits_at", None) if near else None
        start_s = (fits_at - now).total_seconds() if hasattr(fits_at, "tzinfo") else None
        queue.gate.blocked(queue.queued[jobs[position].pk], start_s)

    outcomes, nodes = batch.plan(
        [requests[job.pk] for job in jobs], view.nodes, policy, admit=admit, waited=waited
    )
    plan = []
    explained: dict[int, dict] = {}  # a class of requests shares one explanation: one UPDATE
    for job, outcome in zip(jobs, outcomes, strict=True):
        if outcome.error is not None:
            result.pending[job.pk] = _scheduling_error(job.pk, outcome.error, now)
            continue
        planned = _Planned(job, outcome.placement, outcome.decision)
        if outcome.refusal:
            planned.explanation = refusals[job.pk]
        elif outcome.explanation is not None:
            key = id(outcome.explanation)
            if key not in explained:
                explanation = explanation_dict(outcome.explanation, now=now)
                explained[key] = NoCapacity(explanation).explanation
            planned.explanation = explained[key]
        plan.append(planned)
    if members:
        result.gangs.update(job.pk for job in members)
        gangs = _Gangs(nodes, policy, queue, headroom, admit_job, refusals)
        plan += gangs.plan(members, requests)
    clock.lap("plan_s")
    backfill = [p for p in plan if _code(p) == "no_capacity" and not p.job.gang]
    if backfill and not _holds_reservations(pool_id):
        backfill = []
    _apply(pool, plan, view, policy, now, result)
    for tenant_id in {p.job.tenant_id for p in plan if _code(p) in TENANT_WIDE}:
        _note_tenants_at_quota(now, pool_id=pool_id, tenant_id=tenant_id)  # all its jobs, bulk
    clock.lap("apply_s")
    if backfill:  # the single path tries reservations' holds, and explains the rest
        _backfill(backfill, now, result)


def _core_request(job: _Job):
    # a job is placed only where its image's architectures run (image_arch filter), preferring
    # nodes that have its pinned digest cached (warm_image): as lease_reserve does
    req = snap.core_request(job.resources, job.tenant_id, job.image_platforms or ())
    if "@" in (job.image or ""):
        req = replace(req, image=job.image.rsplit("@", 1)[1])
    return req


def _gangs_checked(jobs: list, now, result: PassResult) -> list:
    """The jobs whose stored `gang` is well formed (as submit validates it); one that is not (a
    row edited behind the API's back) fails with `scheduling_error`, alone."""
    kept = []
    for job in jobs:
        try:
            job.gang = validation.job_gang(job.gang)
        except Exception as error:
            result.pending[job.pk] = _scheduling_error(job.pk, error, now)
        else:
            kept.append(job)
    return kept


def _gang_mates(pool_id: int, jobs: list[_Job]) -> list[_Job]:
    """The queued members outside the window of the gangs the window holds: a gang is
    counted over the whole queue and planned whole."""
    gangs = {(job.tenant_id, job.gang["name"]) for job in jobs if job.gang}
    if not gangs:
        return []
    have = {job.pk for job in jobs}
    mates = Job.objects.filter(
        pool_id=pool_id,
        state=JobState.QUEUED,
        tenant_id__in={tenant_id for tenant_id, _ in gangs},
        gang__name__in={name for _, name in gangs},
    ).values_list("id", "tenant_id", "gang__name")
    ids = [pk for pk, tenant_id, name in mates if (tenant_id, name) in gangs and pk not in have]
    return _read_jobs(ids) if ids else []


GANG_INCOMPLETE, GANG_MISMATCH = "gang_incomplete", "gang_mismatch"  # pending codes


class _Gangs:
    """Gangs of jobs (docs/scheduler.md "Gangs of jobs"): a tenant's queued jobs in the pool
    that share a gang name, planned after the other jobs on the nodes their plan left, in the
    queue order of their first members. Members in job-id order make gangs of `size` (a name
    used again makes the next gang); each is placed all or none: `place_gang` places `size`
    replicas, one per member, and every member passes the queue's gate and its tenant's quota
    headroom, or none takes anything."""

    def __init__(self, nodes, policy, queue: _Queue, headroom: dict, admit, refusals: dict):
        self.nodes = list(nodes)
        self.index = {node.name: i for i, node in enumerate(self.nodes)}
        self.policy, self.queue, self.headroom = policy, queue, headroom
        self.admit, self.refusals = admit, refusals

    def plan(self, members: list[_Job], requests: dict) -> list[_Planned]:
        groups: dict[tuple, list[_Job]] = {}
        for job in members:
            groups.setdefault((job.tenant_id, job.gang["name"]), []).append(job)
        planned = []
        for (_, name), group in groups.items():
            group.sort(key=lambda job: job.pk)
            if any(job.gang != group[0].gang for job in group):
                message = f"the members of gang {name} differ in size or topology"
                planned += _waiting(group, GANG_MISMATCH, message)
                continue
            size = group[0].gang["size"]
            for start in range(0, len(group), size):
                planned += self._gang(group[start : start + size], requests)
        return planned

    def _gang(self, gang: list[_Job], requests: dict) -> list[_Planned]:
        name, size, topology = (gang[0].gang[key] for key in ("name", "size", "topology"))
        if len(gang) < size:
            return _waiting(gang, GANG_INCOMPLETE, f"{len(gang)} of {size} members queued")
        request = requests[gang[0].pk]
        if any(_alike(requests[job.pk]) != _alike(request) for job in gang):
            message = f"the members of gang {name} ask for different resources"
            return _waiting(gang, GANG_MISMATCH, message)
        placed = place_gang(replace(request, replicas=size, gang=topology), self.nodes, self.policy)
        if isinstance(placed, Explanation):
            extra = {"gang_reason": placed.gang_reason}
            why = NoCapacity(explanation_dict(placed, **extra)).explanation
            return [_Planned(job, explanation=why) for job in gang]
        if refusal := self._admit(gang, placed.placements):
            return [_Planned(job, explanation=refusal) for job in gang]
        decision = {"policy_version": placed.policy_version, "nodes": len(self.nodes)}
        decision |= {"gang": name, "topology": topology, "domain": placed.domain}
        key = (gang[0].tenant_id, name, gang[0].pk)
        out = []
        for job, placement in zip(gang, placed.placements, strict=True):
            i = self.index[placement.node]
            self.nodes[i] = apply_placement(self.nodes[i], placement)
            out.append(_Planned(job, placement, {**decision, "chosen": placement.node}, gang=key))
        return out

    def _admit(self, gang: list[_Job], placements) -> dict | None:
        """Each member through the gate and its tenant's headroom; one refused: the gate and
        the headroom as they were, and the refusal for all."""
        room = self.headroom.get(gang[0].tenant_id)
        gate, used = copy.deepcopy(self.queue.gate), dict(room.used) if room else None
        for job, placement in zip(gang, placements, strict=True):
            if self.admit(job, placement):
                self.queue.gate = gate
                if room is not None:
                    room.used = used
                return self.refusals[job.pk]
        return None


def _alike(request):
    # members may differ in their own labels (a rank, a role), never in what they ask
    return replace(request, name="", labels=())


def _waiting(gang: list[_Job], code: str, message: str) -> list[_Planned]:
    why = {"code": code, "message": message}
    return [_Planned(job, explanation=why) for job in gang]


GATE_MESSAGES = {
    SHORT_SHARE_RESERVED: "the pool keeps a share of its capacity for short jobs (a declared "
    "maximum runtime under the pool's threshold); long jobs wait for room outside it",
    BACKFILL_WOULD_DELAY_HEAD: "a job ahead of it in the queue waits for this capacity; a job "
    "runs ahead only when it ends before that one can start (declare a shorter maximum runtime)",
}
TENANT_WIDE = ("quota_exceeded", "credit_exhausted")  # every queued job of the tenant waits too


class _Queue:
    """The window in the queue's order (placement.queue: weighted fair share, aging, the
    classes' maximum waits), and the gate the plan admits each job through (short-job share,
    backfill behind the head), both fed by the tenants' standings in the pool."""

    def __init__(self, pool_id: int, jobs: list[_Job], view, now):
        policy = fairshare.pool_queue_policy(pool_id)
        capacity = (
            float(sum(n.cpu_millicores for n in view.nodes)),
            float(sum(n.memory_mib for n in view.nodes)),
            float(sum(len(n.gpus) for n in view.nodes)),
        )
        self.queued = {
            job.pk: fairshare.queued_job(
                (
                    job.pk,
                    job.tenant_id,
                    job.priority,
                    job.max_wait_s,
                    job.state_changed_at,
                    job.resources,
                    job.max_runtime_s,
                ),
                now,
            )
            for job in jobs
        }
        standings = fairshare.standings(
            pool_id, {job.tenant_id for job in jobs}, now, policy=policy
        )
        by_id = {job.pk: job for job in jobs}
        ordered = order(list(self.queued.values()), standings, capacity, policy)
        self.jobs = [by_id[q.id] for q in ordered]
        self.gate = Gate.from_standings(capacity, standings, policy)


def _apply(pool, plan: list[_Planned], view, policy, now, result: PassResult) -> None:
    """The plan written in one transaction (steps 1–4 of the module docstring)."""
    expires_at = now + settings.LEASE_DEFAULT_TTL
    nodes = {node.name: node for node in view.nodes}
    with transaction.atomic():
        locked = _lock_queued([p.job.pk for p in plan])
        plan = [p for p in plan if p.job.pk in locked]  # the rest: another pass or a cancel
        placing = [p for p in plan if p.placement is not None]
        _whole_gangs(placing, "another pass or a cancel holds one of its members")
        _recheck_quotas(pool, placing)
        _whole_gangs(placing, "one of its members is over its tenant's quota")
        digests: dict[str, str] = {}  # equal requests, one digest
        rows = {
            p.job.pk: _lease_row(pool, p, view, nodes, expires_at - now, digests)
            for p in placing
            if p.explanation is None
        }
        taken = _take_capacity(pool, placing, rows)
        conflict = {"code": Reason.PLAN_CONFLICT.value, "message": ""}
        for p in placing:
            row = rows.get(p.job.pk)
            if row is not None and row[0]["node_id"] not in taken:
                p.explanation = {
                    **conflict,
                    "message": f"{p.placement.node} was taken by another writer before this "
                    "pass could apply its plan; the job waits for the next pass",
                }
                del rows[p.job.pk]
        base = ledger.reserved_base(pool=pool, actor=SCHEDULER, now=now, expires_at=expires_at)
        ids = ledger.insert_many(list(rows.values()), base)
        leases = dict(zip(rows, ids, strict=True))  # job id → its lease's id
        event, placed = _jobs_leased([p for p in placing if p.job.pk in leases], leases, now)
        _note_pending([p for p in plan if p.explanation is not None], now)
    for p in plan:
        if p.job.pk in leases:
            result.placed.append(p.job.pk)
        elif p.explanation is not None:
            result.pending[p.job.pk] = p.explanation["code"]
    _publish_later(event, placed)


def _whole_gangs(placing: list[_Planned], why: str) -> None:
    """All or none: the members of a gang that lost one (no longer placeable) wait too, with
    that member's reason when it has one, else plan_conflict."""
    kept = defaultdict(int)
    reasons = {}
    for p in placing:
        if p.gang is not None:
            if p.explanation is None:
                kept[p.gang] += 1
            else:
                reasons.setdefault(p.gang, p.explanation)
    for p in placing:
        if p.gang is not None and p.explanation is None and kept[p.gang] < p.job.gang["size"]:
            p.explanation = reasons.get(p.gang) or {
                "code": Reason.PLAN_CONFLICT.value,
                "message": f"gang {p.job.gang['name']} is not placed: {why}; it waits for the "
                "next pass",
            }


def _take_capacity(pool, placing: list[_Planned], rows: dict) -> set[int]:
    """The guarded capacity writes of the plan's leases (`rows`: job id → (lease, event)); the
    ids of the nodes whose capacity was taken. A gang one of whose nodes was taken meanwhile
    takes nothing: the writes roll back to a savepoint and are redone without its members
    (which wait with plan_conflict), until every gang left is whole."""
    gangs = [p for p in placing if p.gang is not None and p.job.pk in rows]
    savepoint = transaction.savepoint() if gangs else None
    while True:
        taken = ledger.take_capacity_many(
            [lease for lease, _ in rows.values()],
            allow_mixing=pool.allow_tenant_mixing_on_shared_gpus,
        )
        lost = {
            p.gang: p.placement.node for p in gangs if rows[p.job.pk][0]["node_id"] not in taken
        }
        if not lost:
            return taken
        transaction.savepoint_rollback(savepoint)
        for p in gangs:
            if p.gang in lost:
                p.explanation = {
                    "code": Reason.PLAN_CONFLICT.value,
                    "message": f"{lost[p.gang]} was taken by another writer before this pass "
                    f"could apply its plan; no member of gang {p.job.gang['name']} is placed, "
                    "they wait for the next pass",
                }
                del rows[p.job.pk]
        gangs = [p for p in gangs if p.gang not in lost]


def _lock_queued(job_ids: list[int]) -> set[int]:
    """Row locks on the jobs still queued, skipping those another transaction holds (a cancel,
    another pass). One array parameter, typed: psycopg sends a list of small ints as
    smallint[], which the id index cannot serve (20,000 jobs: 0.45 s instead of 0.02 s)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Job._meta.db_table} WHERE id = ANY(CAST(%s AS bigint[])) "
            "AND state = %s FOR UPDATE SKIP LOCKED",
            [job_ids, JobState.QUEUED.value],
        )
        return {row[0] for row in cursor.fetchall()}


def _recheck_quotas(pool, placing: list[_Planned]) -> None:
    """Under the quota rows' locks (lock order: jobs, quotas, nodes), each tenant's headroom
    read afresh takes the planned placements in plan order; one over it waits, explained."""
    pairs = quota.pairs_with_quota({(p.job.tenant_id, pool.pk) for p in placing})
    if not pairs:
        return
    quota.lock_quotas(pairs)
    headroom = quota.quota_headroom(pool.pk, {tenant for tenant, _ in pairs})
    for p in placing:
        room = headroom.get(p.job.tenant_id)
        if room is None or p.explanation is not None:
            continue
        over = room.take(
            cpu_millicores=p.placement.cpu_millicores,
            memory_mib=p.placement.memory_mib,
            gpus=fairshare.request_gpus(p.job.resources),
        )
        if over:
            p.explanation = room.explanation(over)


def _lease_row(pool, p: _Planned, view, nodes, ttl, digests: dict) -> tuple[dict, dict]:
    """The job's lease and its event as `lease_reserve` writes them (ledger.reserved_row)."""
    job, placement = p.job, p.placement
    node_id = view.node_ids[placement.node]
    digest = digests.get(job.key)
    if digest is None:
        digest = digests[job.key] = request_digest(pool, job.resources, ttl)
    return ledger.reserved_row(
        tenant_id=job.tenant_id,
        job_id=job.pk,
        request=job.resources,
        placement=placement,
        node_id=node_id,
        allocations=ledger.gpu_allocations(placement, view, node_id, nodes[placement.node]),
        idempotency_key=f"{SCHEDULER_KEY_PREFIX}{job.pk}-attempt-{job.attempts + 1}",
        digest=digest,
        decision=p.decision,
    )


def _jobs_leased(placing: list[_Planned], leases: dict[int, int], now):
    """queued → leased for the placed jobs, through the jobs' bulk service. Returns the event
    all share and each (job, message), for publishing after commit."""
    placed = [
        (p.job.pk, leases[p.job.pk], p.placement.node, p.placement.policy_version) for p in placing
    ]
    base, messages = jobs_placed_many(placed, actor=SCHEDULER, now=now)
    return base, [(p.job, message) for p, message in zip(placing, messages, strict=True)]


def _note_pending(waiting: list[_Planned], now) -> None:
    """Why each job waits, one UPDATE per distinct explanation (a class of requests shares
    one); the rows are locked by this transaction."""
    groups: dict[int, tuple[dict, list[int]]] = {}
    for p in waiting:
        groups.setdefault(id(p.explanation), (p.explanation, []))[1].append(p.job.pk)
    for explanation, ids in groups.values():
        Job.objects.filter(pk__in=ids, state=JobState.QUEUED).update(
            pending_reason=explanation, pending_checked_at=now
        )


def _publish_later(base, placed: list[tuple]) -> None:
    """The placed jobs' live events, published after commit on a thread of their own with one
    event loop: each costs about a millisecond of Redis round trips, which must not hold up the
    pass (16 s for 16,000 placements). `base`: the event they share, `placed`: (job, message)
    each. A lost event is only a late browser update: the database is the source of truth."""
    layer = get_channel_layer()
    if layer is None or not placed:
        return
    shared = {name: getattr(base, name) for name in ("at", "from_state", "to_state", "reason")}
    shared["actor_label"] = base.actor_label

    async def send_all():
        for job, message in placed:
            event = event_fields(SimpleNamespace(**shared, message=message))
            payload = {"job": job.pk, "name": job.name, "state": JobState.LEASED, **event}
            for group in groups_of(JOB_STREAM, job):
                await layer.group_send(group, {"type": MESSAGE_TYPE, "event": payload})

    def publish():
        try:
            async_to_sync(send_all)()
        except Exception:
            logger.warning("could not publish %d placements", len(placed), exc_info=True)

    threading.Thread(target=publish, name="pass-publish", daemon=True).start()


def _code(p: _Planned) -> str:
    return (p.explanation or {}).get("code", "")


def _holds_reservations(pool_id: int) -> bool:
    """A job that does not fit may still run inside a reservation's hold (backfill): only the
    single path knows how, and only when the pool holds reservations."""
    return Lease.objects.filter(
        pool_id=pool_id,
        state=LeaseState.RESERVED,
        window_start__isnull=False,
        backfill_of__isnull=True,
    ).exists()


def _backfill(waiting: list[_Planned], now, result: PassResult) -> None:
    """The single path for jobs that did not fit while reservations hold capacity; after a
    request that could not backfill, its equals need no attempt (same request, same hold)."""
    failed = set()
    for p in waiting:
        key = (p.job.tenant_id, str(sorted(p.job.resources.items())))
        if key in failed:
            continue
        try:
            outcome = _place_one(p.job.pk, now)
        except Exception as error:
            outcome = _scheduling_error(p.job.pk, error, now)
        if outcome is True:
            result.placed.append(p.job.pk)
            result.pending.pop(p.job.pk, None)
        else:
            failed.add(key)


class _Clock:
    def __init__(self, timings):
        self.timings = timings
        self.start = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[name] = self.timings.get(name, 0.0) + now - self.start
            self.start = now


def _note_tenants_at_quota(now, **scope) -> set[tuple[int, int]]:
    """Every queued job of a tenant without quota left is noted pending with the reason, in one
    UPDATE per tenant and pool instead of a placement attempt per job."""
    blocked = tenants_at_quota(**scope)
    for (tenant_id, pool_id), explanation in blocked.items():
        jobs_note_pending(tenant_id=tenant_id, pool_id=pool_id, explanation=explanation, now=now)
    return set(blocked)


def _scheduling_error(job_id: int, error: Exception, now) -> str:
    """Record an unexpected error on its job, after the job's transaction rolled back: a
    transient database error (lock, timeout, lost connection) leaves the job queued for the next
    pass with the error as its pending reason; anything else (a corrupt stored request, a row
    the database refuses) fails the job with the error, so it stops blocking the queue."""
    logger.exception("scheduling pass: job %s failed", job_id)
    message = error_summary(error)
    explanation = {"code": Reason.SCHEDULING_ERROR.value, "message": message}
    job = Job(pk=job_id)
    try:
        if isinstance(error, OperationalError):
            job_note_pending(job=job, explanation=explanation, now=now)
        else:
            job_transition(
                job=job,
                to=JobState.FAILED,
                actor=SCHEDULER,
                reason=Reason.SCHEDULING_ERROR,
                message=message,
                now=now,
                changes={"pending_reason": explanation},
                check=_still_queued,
            )
    except Exception:
        logger.exception("scheduling pass: could not record the error on job %s", job_id)
    return Reason.SCHEDULING_ERROR.value


def _still_queued(job) -> None:
    if job.state != JobState.QUEUED:  # another pass or the tenant moved it meanwhile
        raise TransitionRefused("transition_not_allowed", f"job {job.pk} is {job.state}")


def _place_one(job_id: int, now) -> bool | str | None:
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
        except TransitionRefused as refusal:  # quota, credit and other policy refusals
            explanation = quota.explanation(refusal)
        else:
            return True
    job_note_pending(job=job, explanation=explanation, now=now)
    return explanation.get("code", "pending")


def _reserve_and_place(job: Job, request: dict, now, gang: str = "") -> None:
    """The single path's placement of one job (its row locked by the caller): a lease through
    `lease_reserve` — the same guarded path as the lease API — and the job queued → leased in
    the same transaction. Refusals (NoCapacity, TransitionRefused) are the caller's."""
    lease = lease_reserve(
        pool=job.pool,
        tenant=job.tenant,
        request=request,
        actor=SCHEDULER,
        duration=settings.LEASE_DEFAULT_TTL,
        job=job,
        idempotency_key=f"{SCHEDULER_KEY_PREFIX}{job.pk}-attempt-{job.attempts + 1}",
        now=now,
    )
    node = lease.placement.get("node", "")
    data = {"lease": lease.pk, "node": node, "policy_version": lease.policy_version}
    job_transition(
        job=job,
        to=JobState.LEASED,
        actor=SCHEDULER,
        reason=Reason.PLACED,
        message=f"placed on {node}{f' with gang {gang}' if gang else ''} (lease {lease.pk})",
        now=now,
        changes={"attempts": job.attempts + 1, "pending_reason": {}},
        data=data | ({"gang": gang} if gang else {}),
    )


def _still_without_lease(job) -> None:
    # Checked under the job's row lock: a pass may have placed it again meanwhile.
    if job.leases.filter(state__in=HOLDING).exists():
        raise TransitionRefused("job_has_lease", f"job {job.pk} holds a lease again")


def requeue_jobs_without_lease(*, now=None) -> list[int]:
    """Jobs whose lease ended under them, so nothing placed is silently lost (returns the ids
    it moved): placed but not yet running → back to the queue (`lease_expired`); running or
    checkpointing → the node went silent past its uncertain deadline (or the lease ran out
    unrenewed), so the job is `lost` (`node_lost`), or queued again by its retry policy."""
    now = now or timezone.now()
    moved = []
    stranded = Job.objects.filter(state__in=(JobState.LEASED, JobState.STARTING)).exclude(
        leases__state__in=HOLDING
    )
    for job in stranded.only("pk", "state"):
        if _handle_stranded(job, now, _requeue):
            moved.append(job.pk)
    lost = Job.objects.filter(state__in=(JobState.RUNNING, JobState.CHECKPOINTING)).exclude(
        leases__state__in=HOLDING
    )
    for job in lost.only("pk", "state"):
        if _handle_stranded(job, now, _lose):
            moved.append(job.pk)
    return moved


def _requeue(job, now) -> None:
    job_transition(
        job=job,
        to=JobState.QUEUED,
        actor=SCHEDULER,
        reason=Reason.LEASE_EXPIRED,
        message="its lease ended before the job started; back in the queue",
        now=now,
        check=_still_without_lease,
    )


def _lose(job, now) -> None:
    job_lost(job=job, actor=SCHEDULER, now=now, check=_still_without_lease)


def _handle_stranded(job, now, handle) -> bool:
    try:
        handle(job, now)
    except TransitionRefused:
        return False  # someone else moved it first
    except Exception as error:  # one bad job never stops the sweep
        record_sweep_failure(
            Job, job.pk, event_model=JobEvent, actor=SCHEDULER, error=error, now=now
        )
        return False
    return True
