"""Preemption for priority: queued jobs the pass could not place ask lower-priority running
work to checkpoint (docs/scheduler.md, "Preemption").

`preempt_for(pool_id, job_ids)` takes the pool's queued jobs that did not fit, keeps those whose
priority class `may_preempt`, and handles them highest priority first on one snapshot of the pool.
In that snapshot the leases of work already checkpointing are counted as ended: capacity on its
way. A job that fits once they end waits for them and claims its room, so no other work is
stopped for it; otherwise the core (`placement.preemption`) chooses victims, and in one
transaction, with the rows locked and re-checked, each victim goes running → checkpointing
(`preempted`) and the preemptor gets a `preempting` event and a pending reason saying it waits.
The checkpoint itself is the data plane's (`jobs.lifecycle.job_request_checkpoint`): the agent
stops the job after its grace period and reports `checkpointed`, the job is queued again (its
attempt was counted when it was placed; the next placement counts the next) and its lease
released, and the next pass places the preemptor. An agent that never reports loses its lease
with its node: the job is `lost` or retried, as any job there. One bad job never stops the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from jobs.assignments import CHECKPOINT_OUTPUT
from jobs.choices import JobState
from jobs.events import publish_job_event
from jobs.lifecycle import job_request_checkpoint
from jobs.models import Job, JobEvent, JobOutput
from jobs.services import job_note_pending
from leases.choices import HOLDING
from leases.models import Lease
from leases.snapshot import core_request, pool_policy, pool_snapshot
from placement import Placement, apply_to_nodes, place
from placement.preemption import (
    Candidate,
    Preemption,
    choose_victims,
    free_leases,
    lost_seconds,
)
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.reasons import Reason
from pools.statemachine import error_summary

PREEMPTION = Actor.system("preemption")
logger = logging.getLogger(__name__)
# A job without a priority class has priority 0, as the pass orders it, and may be preempted
# as a class's jobs may by default (PriorityClass.preemptible).
UNCLASSED_PRIORITY = 0
ORDER = (F("priority_class__value").desc(nulls_last=True), F("created_at").asc(), F("id").asc())


def preempt_for(pool_id: int, job_ids, now=None) -> dict:
    """Preempt for the queued jobs `job_ids` of the pool that could not be placed for capacity.
    Returns job id → what happened: `preempting` (victims asked to checkpoint), `waiting` (room
    is being freed for it), `fits` (room is free now), `none` (nothing may be preempted for it),
    `aborted` (a victim ended meanwhile) or `error`."""
    now = now or timezone.now()
    jobs = list(
        Job.objects.filter(
            pk__in=list(job_ids),
            pool_id=pool_id,
            state=JobState.QUEUED,
            priority_class__may_preempt=True,
        )
        .select_related("priority_class", "pool")
        .order_by(*ORDER)
    )
    if not jobs:
        return {}
    pool = jobs[0].pool
    policy = pool_policy(pool)
    min_runtime = knobs_for(pool).preemption_min_runtime_s
    view = _View.of(pool_id)
    outcome = {}
    for job in jobs:
        try:
            outcome[job.pk] = _preempt_for_one(job, view, policy, min_runtime, now)
        except Exception as error:  # one bad job never stops the others
            logger.exception("preemption: job %s failed", job.pk)
            outcome[job.pk] = "error"
            explanation = {"code": Reason.SCHEDULING_ERROR.value, "message": error_summary(error)}
            job_note_pending(job=job, explanation=explanation, now=now)
    return outcome


@dataclass
class _View:
    """The pool as one call sees it: nodes with the leases of checkpointing work ended (capacity
    on its way, `in_flight` names their nodes) and the running work that could be preempted.
    Each job handled claims its room in it, so the next one does not count on the same."""

    nodes: list
    in_flight: set[str]
    candidates: list[Candidate]

    @classmethod
    def of(cls, pool_id: int) -> _View:
        checkpointing = dict(
            Lease.objects.filter(
                pool_id=pool_id, state__in=HOLDING, job__state=JobState.CHECKPOINTING
            ).values_list("pk", "node__name")
        )
        nodes = free_leases(pool_snapshot(pool_id).nodes, checkpointing)
        return cls(nodes, set(checkpointing.values()), running_candidates(pool_id, nodes))

    def claim(self, request, policy, on=None) -> Placement | None:
        nodes = [n for n in self.nodes if on is None or n.name == on]
        found = place(request, nodes, policy)
        if not isinstance(found, Placement):
            return None
        self.nodes = apply_to_nodes(self.nodes, found)
        return found


def _preempt_for_one(job: Job, view: _View, policy, min_runtime: int, now) -> str:
    request = replace(
        core_request(job.resources, job.tenant_id, job.image_platforms),
        priority=job.priority_class.value,
    )
    found = view.claim(request, policy)
    if found is not None:  # room is free, or being freed: nothing more is stopped for it
        if found.node not in view.in_flight:
            return "fits"
        message = f"waits for preempted work on {found.node} to checkpoint"
        explanation = {"code": Reason.PREEMPTING.value, "message": message}
        job_note_pending(job=job, explanation=explanation, now=now)
        return "waiting"
    choice = choose_victims(
        request, view.nodes, view.candidates, policy, now=now.timestamp(), min_runtime_s=min_runtime
    )
    if choice is None:
        return "none"
    if not _preempt(job, choice, now):
        return "aborted"
    ended = {v.job for v in choice.victims}
    view.candidates = [c for c in view.candidates if c.job not in ended]
    view.nodes = free_leases(view.nodes, [v.lease.lease_id for v in choice.victims])
    view.in_flight.add(choice.node)
    view.claim(request, policy, on=choice.node)
    return "preempting"


def running_candidates(pool_id: int, nodes) -> list[Candidate]:
    """The running jobs of the pool on the snapshot's nodes, as the core sees them: what their
    lease holds there (the snapshot's lease end), priority, class, when they started running
    and when they last checkpointed."""
    ends = {x.lease_id: (n.name, x) for n in nodes for x in n.leases}
    rows = list(
        Lease.objects.filter(
            pool_id=pool_id, state__in=HOLDING, job__state=JobState.RUNNING
        ).values_list(
            "pk",
            "job_id",
            "job__tenant_id",
            "job__checkpointable",
            "job__priority_class__value",
            "job__priority_class__preemptible",
        )
    )
    job_ids = [row[1] for row in rows]
    started = dict(
        JobEvent.objects.filter(job_id__in=job_ids, to_state=JobState.RUNNING)
        .values("job_id")
        .annotate(at=Max("at"))
        .values_list("job_id", "at")
    )
    checkpointed = dict(
        JobOutput.objects.filter(job_id__in=job_ids, name=CHECKPOINT_OUTPUT)
        .values("job_id")
        .annotate(at=Max("created_at"))
        .values_list("job_id", "at")
    )
    candidates = []
    for lease_id, job_id, tenant_id, checkpointable, value, preemptible in rows:
        if str(lease_id) not in ends or job_id not in started:
            continue
        node, lease = ends[str(lease_id)]
        at = checkpointed.get(job_id)
        candidates.append(
            Candidate(
                job=job_id,
                node=node,
                lease=lease,
                priority=UNCLASSED_PRIORITY if value is None else value,
                preemptible=True if preemptible is None else preemptible,
                checkpointable=checkpointable,
                started_at=started[job_id].timestamp(),
                checkpointed_at=at.timestamp() if at else None,
                tenant=str(tenant_id),
            )
        )
    return candidates


def _preempt(job: Job, choice: Preemption, now) -> bool:
    """Victims running → checkpointing (`preempted`) and the preemptor's `preempting` event, in
    one transaction; False, changing nothing, when the preemptor is no longer queued or a victim
    is no longer running on its lease."""
    with transaction.atomic():
        locked = Job.objects.select_for_update(of=("self",))
        if locked.filter(pk=job.pk, state=JobState.QUEUED).first() is None:
            return False
        ids = sorted(v.job for v in choice.victims)
        victims = {
            v.pk: v
            for v in locked.filter(pk__in=ids).select_related("priority_class").order_by("pk")
        }
        for v in choice.victims:
            row = victims.get(v.job)
            if row is None or row.state != JobState.RUNNING:
                return False
            held = Lease.objects.filter(pk=v.lease.lease_id, job_id=v.job, state__in=HOLDING)
            if not held.exists():  # ended meanwhile: this preemption is off
                return False
        own = str(job.tenant_id)
        klass = job.priority_class.name
        for v in choice.victims:
            same = v.tenant == own
            lost = round(lost_seconds(v, now.timestamp()))
            data = {"preemptor_class": klass, "node": choice.node, "lost_work_s": lost}
            data |= {"preemptor": job.pk} if same else {}
            by = f"a {klass} job" + (f" ({job.pk})" if same else "")
            job_request_checkpoint(
                job=victims[v.job],
                actor=PREEMPTION,
                reason=Reason.PREEMPTED,
                message=f"preempted for {by} on {choice.node}: checkpoint, then re-queue",
                now=now,
                data=data,
            )
        classes = sorted({_class_name(victims[v.job]) for v in choice.victims})
        mine = [v.job for v in choice.victims if v.tenant == own]
        data = {"node": choice.node, "victims": len(choice.victims), "classes": classes}
        data |= {"victim_jobs": mine} if mine else {}
        count = f"{len(choice.victims)} job{'s' if len(choice.victims) > 1 else ''}"
        message = f"preempting {count} of {', '.join(classes)} on {choice.node}"
        event = JobEvent.record(
            job,
            actor=PREEMPTION,
            from_state=JobState.QUEUED,
            to_state=JobState.QUEUED,
            reason=Reason.PREEMPTING,
            message=message,
            at=now,
            data=data,
        )
        transaction.on_commit(lambda: publish_job_event(job, event))
        waits = {"code": Reason.PREEMPTING.value, "message": f"{message}; waits for them"}
        job_note_pending(job=job, explanation=waits, now=now)
    return True


def _class_name(job: Job) -> str:
    return job.priority_class.name if job.priority_class else "no class"
