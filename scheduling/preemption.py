"""Preemption for priority: queued jobs the pass could not place ask lower-priority running
work to checkpoint, after a notice (docs/scheduler.md, "Preemption").

`preempt_for(pool_id, job_ids)` first settles the pool's pending notices (`settle`), then takes
the pool's queued jobs that did not fit, keeps those whose priority class `may_preempt`, and
handles them highest priority first on one snapshot of the pool. In that snapshot the leases of
work already checkpointing, and of the victims of pending notices, are counted as ended:
capacity on its way. A job that fits once they end waits for them and claims its room, so no
other work is stopped for it; a job with a pending notice waits for it and chooses nothing new;
otherwise the core (`placement.preemption`) chooses victims among the running work no notice
names, and in one transaction, with the rows locked and re-checked, the decision is recorded
(`PreemptionNotice`, the preemptor's `preempting` event and pending reason) and the victims are
not touched. A later pass, once the pool's `preemption_notice_s` has passed, carries it out if
the preemptor is still queued, still does not fit anywhere without it, and the victims still run
on their leases (and their end still makes room): each victim goes running → checkpointing
(`preempted`). Otherwise the notice is called off (`preemption_called_off` on the preemptor) and
no victim ever hears of it; cancelling the preemptor calls it off at once (`jobs.signals`). A
notice of 0 s carries the preemption out in the deciding transaction.
The checkpoint itself is the data plane's (`jobs.lifecycle.job_request_checkpoint`): the agent
stops the job after its grace period and reports `checkpointed`, the job is queued again (its
attempt was counted when it was placed; the next placement counts the next) and its lease
released, and the next pass places the preemptor. An agent that never reports loses its lease
with its node: the job is `lost` or retried, as any job there. One bad job never stops the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone

from jobs.assignments import CHECKPOINT_OUTPUT
from jobs.choices import TERMINAL, JobState
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
from scheduling.models import NoticedVictim, PreemptionNotice

PREEMPTION = Actor.system("preemption")
logger = logging.getLogger(__name__)
# A job without a priority class has priority 0, as the pass orders it, and may be preempted
# as a class's jobs may by default (PriorityClass.preemptible).
UNCLASSED_PRIORITY = 0
ORDER = (F("priority_class__value").desc(nulls_last=True), F("created_at").asc(), F("id").asc())


def preempt_for(pool_id: int, job_ids, now=None) -> dict:
    """Settle the pool's pending notices (`settle`), then preempt for the queued jobs `job_ids`
    of the pool that could not be placed for capacity. Returns job id → what happened:
    `noticed` (victims chosen, nothing touched: the notice runs, or still runs), `preempting`
    (victims asked to checkpoint: its notice ended, or the pool gives none), `called_off` (by
    `settle`), `waiting` (room is being freed for it), `fits` (room is free now), `none`
    (nothing may be preempted for it), `aborted` (the choice was stale: a victim ended or
    another preemptor took it meanwhile) or `error`."""
    now = now or timezone.now()
    settled = settle(pool_id, now)
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
        return settled
    pool = jobs[0].pool
    policy = pool_policy(pool)
    knobs = knobs_for(pool)
    notices = {
        n.preemptor_id: n
        for n in PreemptionNotice.objects.filter(pool_id=pool_id, preemptor__in=jobs)
    }
    view = _View.of(pool_id)
    outcome = dict(settled)
    for job in jobs:
        try:
            done = _preempt_for_one(job, view, policy, knobs, notices.get(job.pk), now)
        except Exception as error:  # one bad job never stops the others
            logger.exception("preemption: job %s failed", job.pk)
            done = "error"
            explanation = {"code": Reason.SCHEDULING_ERROR.value, "message": error_summary(error)}
            job_note_pending(job=job, explanation=explanation, now=now)
        if settled.get(job.pk) != "preempting":  # confirmed now, it then waits for its room
            outcome[job.pk] = done
    return outcome


@dataclass
class _View:
    """The pool as one call sees it: nodes with the leases of checkpointing work and of the
    victims of pending notices ended (capacity on its way, `in_flight` names their nodes) and
    the running work that could be preempted (a pending notice's victims are not: no other
    preemptor may choose them). Each job handled claims its room in it, so the next one does
    not count on the same."""

    nodes: list
    in_flight: set[str]
    candidates: list[Candidate]

    @classmethod
    def of(cls, pool_id: int) -> _View:
        ending = dict(
            Lease.objects.filter(
                pool_id=pool_id, state__in=HOLDING, job__state=JobState.CHECKPOINTING
            ).values_list("pk", "node__name")
        )
        ending |= dict(
            NoticedVictim.objects.filter(notice__pool_id=pool_id).values_list(
                "lease_id", "lease__node__name"
            )
        )
        nodes = free_leases(pool_snapshot(pool_id).nodes, ending)
        return cls(nodes, set(ending.values()), running_candidates(pool_id, nodes))

    def claim(self, request, policy, on=None) -> Placement | None:
        nodes = [n for n in self.nodes if on is None or n.name == on]
        found = place(request, nodes, policy)
        if not isinstance(found, Placement):
            return None
        self.nodes = apply_to_nodes(self.nodes, found)
        return found


def _core_request(job: Job):
    return replace(
        core_request(job.resources, job.tenant_id, job.image_platforms),
        priority=_priority(job),
    )


def _preempt_for_one(job: Job, view: _View, policy, knobs, notice, now) -> str:
    request = _core_request(job)
    if notice is not None:  # its notice runs: it chooses nothing new and claims the room
        view.claim(request, policy, on=notice.node)
        waits = _waits_for_notice(notice, knobs.preemption_notice_s)
        job_note_pending(job=job, explanation=waits, now=now)
        return "noticed"
    found = view.claim(request, policy)
    if found is not None:  # room is free, or being freed: nothing more is stopped for it
        if found.node not in view.in_flight:
            return "fits"
        message = f"waits for preempted work on {found.node} to checkpoint"
        explanation = {"code": Reason.PREEMPTING.value, "message": message}
        job_note_pending(job=job, explanation=explanation, now=now)
        return "waiting"
    choice = choose_victims(
        request,
        view.nodes,
        view.candidates,
        policy,
        now=now.timestamp(),
        min_runtime_s=knobs.preemption_min_runtime_s,
    )
    if choice is None:
        return "none"
    done = _decide(job, choice, now, knobs.preemption_notice_s)
    if not done:
        return "aborted"
    ended = {v.job for v in choice.victims}
    view.candidates = [c for c in view.candidates if c.job not in ended]
    view.nodes = free_leases(view.nodes, [v.lease.lease_id for v in choice.victims])
    view.in_flight.add(choice.node)
    view.claim(request, policy, on=choice.node)
    return done


def _waits_for_notice(notice: PreemptionNotice, notice_s: int) -> dict:
    until = notice.decided_at + timedelta(seconds=notice_s)
    message = f"preempting on {notice.node}: waits for its notice (until {until:%H:%M:%S} UTC)"
    return {"code": Reason.PREEMPTING.value, "message": message}


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
    started, checkpointed = _work_times([row[1] for row in rows])
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


def _work_times(job_ids) -> tuple[dict, dict]:
    """job id → when it last started running, and → when it last wrote a checkpoint."""
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
    return started, checkpointed


def _decide(job: Job, choice: Preemption, now, notice_s: int) -> str:
    """The preemption chosen for `job`, in one transaction with the preemptor and the victims
    locked and re-checked: with a notice, recorded (`PreemptionNotice`, the preemptor's
    `preempting` event and pending reason; the victims untouched) → "noticed"; without one
    (`notice_s` 0), carried out at once (`_carry_out`) → "preempting". "" changing nothing when
    the preemptor is no longer queued or already has a notice, or a victim is no longer running
    on its lease or is another notice's victim (a worker deciding at the same time)."""
    try:
        with transaction.atomic():
            locked = Job.objects.select_for_update(of=("self",))
            if locked.filter(pk=job.pk, state=JobState.QUEUED).first() is None:
                return ""
            victims = _locked_victims([(v.job, v.lease.lease_id) for v in choice.victims])
            if victims is None:
                return ""
            taken = NoticedVictim.objects.filter(job_id__in=victims).exists()
            if taken or PreemptionNotice.objects.filter(preemptor_id=job.pk).exists():
                return ""
            if notice_s == 0:
                _carry_out(job, choice.node, choice.victims, victims, 0, now)
                return "preempting"
            notice = PreemptionNotice.objects.create(
                preemptor=job, pool_id=job.pool_id, node=choice.node, decided_at=now
            )
            NoticedVictim.objects.bulk_create(
                NoticedVictim(notice=notice, job_id=v.job, lease_id=v.lease.lease_id)
                for v in choice.victims
            )
            data, what = _summary(job, choice.node, choice.victims, victims)
            message = f"preempting {what} after a notice of {notice_s} s"
            _record(job, Reason.PREEMPTING, message, data | {"notice_s": notice_s}, now)
            job_note_pending(job=job, explanation=_waits_for_notice(notice, notice_s), now=now)
    except IntegrityError:  # another worker noticed the same preemptor or victim first
        return ""
    return "noticed"


def _locked_victims(victims) -> dict[int, Job] | None:
    """The victims' job rows locked in id order, or None when one is no longer running on
    its lease. `victims`: (job id, lease id) pairs."""
    ids = sorted(job_id for job_id, _ in victims)
    locked = Job.objects.select_for_update(of=("self",))
    rows = {
        v.pk: v for v in locked.filter(pk__in=ids).select_related("priority_class").order_by("pk")
    }
    for job_id, lease_id in victims:
        row = rows.get(job_id)
        if row is None or row.state != JobState.RUNNING:
            return None
        held = Lease.objects.filter(pk=lease_id, job_id=job_id, state__in=HOLDING)
        if not held.exists():  # ended meanwhile
            return None
    return rows


def _summary(job: Job, node: str, victims, rows: dict[int, Job]) -> tuple[dict, str]:
    """The preemptor's event data and words for its victims: their count and classes, their
    ids only when they are its own tenant's."""
    own = str(job.tenant_id)
    classes = sorted({_class_name(rows[v.job]) for v in victims})
    mine = [v.job for v in victims if v.tenant == own]
    data = {"node": node, "victims": len(victims), "classes": classes}
    data |= {"victim_jobs": mine} if mine else {}
    count = f"{len(victims)} job{'s' if len(victims) > 1 else ''}"
    return data, f"{count} of {', '.join(classes)} on {node}"


def _record(job: Job, reason: Reason, message: str, data: dict, now) -> None:
    """An event on the preemptor, its state unchanged, published once committed."""
    event = JobEvent.record(
        job,
        actor=PREEMPTION,
        from_state=job.state,
        to_state=job.state,
        reason=reason,
        message=message,
        at=now,
        data=data,
    )
    transaction.on_commit(lambda: publish_job_event(job, event))


def _carry_out(job: Job, node: str, victims, rows: dict[int, Job], notice_s: int, now) -> None:
    """Inside the caller's transaction, victims and preemptor locked: each victim running →
    checkpointing (`preempted`), and the preemptor's `preempting` event and pending reason."""
    own = str(job.tenant_id)
    klass = _class_name(job)
    for v in victims:
        same = v.tenant == own
        lost = round(lost_seconds(v, now.timestamp()))
        data = {"preemptor_class": klass, "node": node, "lost_work_s": lost}
        data |= {"preemptor": job.pk} if same else {}
        by = f"a {klass} job" + (f" ({job.pk})" if same else "")
        job_request_checkpoint(
            job=rows[v.job],
            actor=PREEMPTION,
            reason=Reason.PREEMPTED,
            message=f"preempted for {by} on {node}: checkpoint, then re-queue",
            now=now,
            data=data,
        )
    data, what = _summary(job, node, victims, rows)
    message = f"preempting {what}" + (f": its notice of {notice_s} s is over" if notice_s else "")
    _record(job, Reason.PREEMPTING, message, data | {"notice_s": notice_s, "confirmed": True}, now)
    waits = {"code": Reason.PREEMPTING.value, "message": f"{message}; waits for them"}
    job_note_pending(job=job, explanation=waits, now=now)


# --- the notice: confirmed, or called off ----------------------------------------------------

# why a notice is called off → the message's words
CALLED_OFF = {
    "cancelled": "the job was cancelled",
    "placed": "the job was placed without preemption",
    "ended": "the job ended",
    "fits": "the job fits without preemption",
    "victim_ended": "a victim ended or no longer runs",
    "no_room": "its victims' end would no longer make room",
}


def noticed_pools(pool_id: int | None = None) -> set[int]:
    """The pools (or just `pool_id`) with a pending preemption notice."""
    notices = PreemptionNotice.objects.all()
    if pool_id is not None:
        notices = notices.filter(pool_id=pool_id)
    return set(notices.values_list("pool_id", flat=True).distinct())


def settle(pool_id: int, now=None) -> dict:
    """Each pending notice of the pool, highest priority first, in its own transaction with the
    preemptor, the notice and the victims locked: called off (`preemption_called_off`, the
    victims never signalled) when the preemptor is no longer queued, fits on a fresh snapshot
    of the pool without preemption (it then claims that room, so the next notice does not count
    on it), or a victim no longer runs on its lease; else, once the pool's
    `preemption_notice_s` has passed since the decision and the victims' end still makes room
    for it on their node, carried out (`_carry_out`). Returns preemptor id → `called_off`,
    `preempting` or `noticed` (its notice runs on). A preemptor another transaction holds (a
    cancel, another worker settling it) is left to it."""
    now = now or timezone.now()
    notices = list(
        PreemptionNotice.objects.filter(pool_id=pool_id)
        .select_related("preemptor__priority_class", "pool")
        .order_by(F("preemptor__priority_class__value").desc(nulls_last=True), "decided_at", "pk")
    )
    if not notices:
        return {}
    pool = notices[0].pool
    policy = pool_policy(pool)
    notice_s = knobs_for(pool).preemption_notice_s
    nodes = pool_snapshot(pool_id).nodes  # as it is now: nothing on its way counts
    outcome = {}
    for notice in notices:
        try:
            done, nodes = _settle_one(notice, nodes, policy, notice_s, now)
        except Exception:  # one bad notice never stops the others; it is settled next pass
            logger.exception("preemption: settling the notice of job %s failed", notice.pk)
            done = "error"
        if done:
            outcome[notice.preemptor_id] = done
    return outcome


def _settle_one(notice: PreemptionNotice, nodes, policy, notice_s: int, now) -> tuple[str, list]:
    request = _core_request(notice.preemptor)
    with transaction.atomic():
        locked = Job.objects.select_for_update(of=("self",), skip_locked=True)
        job = locked.filter(pk=notice.preemptor_id).select_related("priority_class").first()
        if job is None:  # a cancel or another worker holds it, and settles it
            return "", nodes
        notice = PreemptionNotice.objects.select_for_update().filter(pk=notice.pk).first()
        if notice is None:  # settled meanwhile
            return "", nodes
        pairs = list(notice.victims.values_list("job_id", "lease_id"))
        why = ""
        if job.state != JobState.QUEUED:
            why = "ended" if job.state in TERMINAL else "placed"
            why = "cancelled" if job.state == JobState.CANCELLED else why
        elif isinstance(found := place(request, nodes, policy), Placement):
            why, nodes = "fits", apply_to_nodes(nodes, found)
        if why:
            _call_off(job, notice, why, now)
            return "called_off", nodes
        rows = _locked_victims(pairs)
        if rows is None:
            _call_off(job, notice, "victim_ended", now)
            return "called_off", nodes
        if now < notice.decided_at + timedelta(seconds=notice_s):
            return "noticed", nodes
        on = [n for n in nodes if n.name == notice.node]
        victims = _victims_as_candidates(pairs, rows, notice.node, on)
        freed = free_leases(on, [lease_id for _, lease_id in pairs])
        if victims is None or not isinstance(place(request, freed, policy), Placement):
            _call_off(job, notice, "no_room", now)
            return "called_off", nodes
        notice.delete()
        _carry_out(job, notice.node, victims, rows, notice_s, now)
    return "preempting", nodes


def _victims_as_candidates(pairs, rows: dict[int, Job], node: str, on) -> list[Candidate] | None:
    """The noticed victims as the core's Candidates, for their events (lost work, tenant); None
    when one's lease is not on the node in the snapshot (the node is no longer schedulable)."""
    leases = {x.lease_id: x for n in on for x in n.leases}
    started, checkpointed = _work_times([job_id for job_id, _ in pairs])
    victims = []
    for job_id, lease_id in sorted(pairs):
        row = rows[job_id]
        if str(lease_id) not in leases or job_id not in started:
            return None
        at = checkpointed.get(job_id)
        victims.append(
            Candidate(
                job=job_id,
                node=node,
                lease=leases[str(lease_id)],
                priority=_priority(row),
                preemptible=True,
                checkpointable=row.checkpointable,
                started_at=started[job_id].timestamp(),
                checkpointed_at=at.timestamp() if at else None,
                tenant=str(row.tenant_id),
            )
        )
    return victims


def _priority(job: Job) -> int:
    return job.priority_class.value if job.priority_class else UNCLASSED_PRIORITY


def _call_off(job: Job, notice: PreemptionNotice, why: str, now, actor: Actor = PREEMPTION) -> None:
    """Inside the caller's transaction, the preemptor and the notice locked: the notice goes,
    the victims were never signalled, and the preemptor's `preemption_called_off` says why."""
    victims = notice.victims.count()
    notice.delete()
    message = f"preemption on {notice.node} called off: {CALLED_OFF[why]}; no work was stopped"
    data = {"node": notice.node, "why": why, "victims": victims}
    _record(job, Reason.PREEMPTION_CALLED_OFF, message, data, now)


def call_off_for_cancelled(job: Job, now=None) -> bool:
    """In the cancel's transaction, the job's row locked (jobs.services.job_cancel, through
    `jobs.signals.job_cancelled`): its pending notice, if any, is called off at once."""
    notice = PreemptionNotice.objects.select_for_update().filter(preemptor_id=job.pk).first()
    if notice is None:
        return False
    _call_off(job, notice, "cancelled", now or timezone.now())
    return True


def _class_name(job: Job) -> str:
    return job.priority_class.name if job.priority_class else "no class"
