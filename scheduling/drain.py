"""Drain enforcement: what happens to the work on a draining node. The node's own states
(draining, drained) are nodes.services'; the jobs and their leases are the control loop's.

At the deadline, once per drain: checkpointable running jobs are asked to checkpoint (and
re-queued when the agent reports the checkpoint), jobs not yet started are re-queued, the rest
follow the pool's `drain_noncheckpointable` knob. A drain-exempt job (a volume's export, let
on the draining node on purpose: jobs/volume_export.py) is never re-queued, since it could only
come back to this node: started or not, it follows the knob (`fail`: it fails, its lease
released; `wait`: it runs to its end, at most its `max_runtime_s`); one placed after the
deadline runs to its end. A draining node that holds no lease any more is recorded drained: an
export holds the drain while it runs, no longer.
"""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from jobs.choices import ACTIVE, JobState
from jobs.lifecycle import job_request_checkpoint
from jobs.models import Job, JobEvent
from jobs.services import job_transition
from leases.choices import HOLDING
from leases.models import Lease
from leases.services import lease_release
from nodes.choices import NodeState
from nodes.errors import NodeScopeRefused
from nodes.models import Node, NodeEvent
from nodes.services import node_event, node_mark_drained
from pools.actors import Actor
from pools.choices import DrainPolicy
from pools.knobs import knobs_for
from pools.models import ComputePool
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from pools.sweeps import sweep


def _drain_step(job: Job, policy: str):
    """(to, what, outcome bucket, whether its leases end now) for one job, or None: it runs on.
    A drain-exempt job (a volume's export) is not re-queued to come back here: the knob says."""
    if job.state == JobState.RUNNING and job.checkpointable:
        return JobState.CHECKPOINTING, "checkpoint, then re-queue", "checkpointing", False
    exempt = (job.resources or {}).get("drain_exempt") is True
    if job.state in (JobState.LEASED, JobState.STARTING) and not exempt:
        return JobState.QUEUED, "not started, re-queued", "requeued", True
    if job.state in _HOLDING_WORK and policy == DrainPolicy.FAIL:
        return JobState.FAILED, "not checkpointable, stopped (pool policy: fail)", "failed", True
    return None


# the states of a job whose work on the node the knob may stop (the others: not started)
_HOLDING_WORK = frozenset({JobState.LEASED, JobState.STARTING, JobState.RUNNING})


def node_drain_enforce(*, node: Node, actor: Actor, now=None) -> dict[str, list[int]]:
    """At the drain deadline, each job holding a lease on the node takes its step. Guarded:
    runs once per drain."""
    now = now or timezone.now()
    outcome = {"checkpointing": [], "requeued": [], "failed": [], "left_running": []}
    with transaction.atomic():
        claimed = Node.objects.filter(
            pk=node.pk,
            state=NodeState.DRAINING,
            drain_deadline__lte=now,
            drain_enforced_at__isnull=True,
        ).update(drain_enforced_at=now)
        if not claimed:
            return outcome
        node.refresh_from_db()
        policy = knobs_for(node.pool).drain_noncheckpointable
        jobs = Job.objects.filter(
            leases__node=node, leases__state__in=HOLDING, state__in=ACTIVE
        ).distinct()
        why = f"drain deadline of node {node.name} passed"
        for job in jobs:
            step = _drain_step(job, policy)
            if step is None:
                outcome["left_running"].append(job.pk)
                continue
            to, what, bucket, end_leases = step
            details = {"reason": Reason.DRAIN_DEADLINE, "message": f"{why}: {what}", "now": now}
            if to == JobState.CHECKPOINTING:
                job_request_checkpoint(job=job, actor=actor, **details)
            else:
                job_transition(job=job, to=to, actor=actor, **details)
            if end_leases:
                end_job_leases(node, job, actor=actor, now=now)
            outcome[bucket].append(job.pk)
        node_event(
            node,
            actor=actor,
            reason=Reason.DRAIN_DEADLINE,
            message=f"{why}; policy for non-checkpointable work: {policy}; "
            + ", ".join(f"{k}: {len(v)}" for k, v in outcome.items()),
            now=now,
            data=outcome | {"policy": policy},
        )
    return outcome


def end_job_leases(node: Node, job: Job, *, actor: Actor, now) -> None:
    """Release the job's leases on this node: its work there is over."""
    for lease in Lease.objects.filter(node=node, job=job, state__in=HOLDING):
        lease_release(
            lease=lease,
            actor=actor,
            reason=Reason.RELEASED_JOB_ENDED,
            message="drain deadline",
            now=now,
        )


def node_drain_complete(*, node: Node, actor: Actor, now=None) -> bool:
    """Record that a draining node holds no leases any more (once)."""
    now = now or timezone.now()
    with transaction.atomic():
        if Lease.objects.filter(node=node, state__in=HOLDING).exists():
            return False
        return node_mark_drained(node=node, actor=actor, now=now)


def node_drain_sweep(*, now=None) -> dict[str, list[int]]:
    """Enforce passed drain deadlines and record drains that have completed."""
    now = now or timezone.now()
    actor = Actor.system("drain-sweep")
    due = Node.objects.filter(
        state=NodeState.DRAINING, drain_deadline__lte=now, drain_enforced_at__isnull=True
    ).select_related("pool")
    enforced = sweep(
        due,
        lambda node: node_drain_enforce(node=node, actor=actor, now=now),
        event_model=NodeEvent,
        actor=actor,
        now=now,
    )
    completed = sweep(
        Node.objects.filter(state=NodeState.DRAINING, drained_at__isnull=True),
        lambda node: node_drain_complete(node=node, actor=actor, now=now),
        event_model=NodeEvent,
        actor=actor,
        now=now,
    )
    return {"enforced": list(enforced), "completed": [pk for pk, done in completed.items() if done]}


def agent_job_checkpointed(
    *, node: Node, job: Job, actor: Actor, fencing_token: int, now=None
) -> Job:
    """The agent wrote the checkpoint a drain asked for: re-queue the job, end its lease here.
    `fencing_token` is the job's lease's: a stale attempt on the node cannot re-queue its
    successor (409 fencing_token_mismatch)."""
    now = now or timezone.now()
    lease = job.leases.filter(node=node, state__in=HOLDING).first()
    if lease is None:
        raise NodeScopeRefused(f"job {job.pk} holds no lease on this node")
    if lease.fencing_token != fencing_token:
        raise TransitionRefused(
            "fencing_token_mismatch", f"lease {lease.pk} is held by another attempt"
        )
    with transaction.atomic():
        job = job_transition(
            job=job,
            to=JobState.QUEUED,
            actor=actor,
            reason=Reason.CHECKPOINT_DONE,
            message=f"checkpoint written on {node.name}; re-queued",
            now=now,
        )
        end_job_leases(node, job, actor=actor, now=now)
    return job


# A checkpoint asked for (a drain or a preemption) that the agent has not reported within its
# stop grace plus this margin is given up: an agent that is alive but stuck must not keep the
# capacity forever. The margin covers the checkpoint's upload.
CHECKPOINT_REPORT_MARGIN = timedelta(minutes=10)


def checkpoint_deadline_sweep(*, now=None) -> list[int]:
    """Jobs checkpointing past their pool's `stop_grace_s` + CHECKPOINT_REPORT_MARGIN go back to
    the queue without a new checkpoint (`checkpoint_timed_out`; the next attempt restores the
    last one it has) and their leases are released, so the agent stops the container (a job
    gone from its assignments is stopped). Returns the jobs moved; one failing job is recorded
    on its row and the others go on (pools.sweeps.sweep)."""
    now = now or timezone.now()
    actor = Actor.system("checkpoint-sweep")
    overdue = Job.objects.filter(
        state=JobState.CHECKPOINTING, state_changed_at__lte=now - CHECKPOINT_REPORT_MARGIN
    )
    moved = []
    for pool in ComputePool.objects.filter(pk__in=overdue.values("pool_id")).order_by("pk"):
        grace = timedelta(seconds=knobs_for(pool).stop_grace_s)
        due = overdue.filter(
            pool=pool, state_changed_at__lte=now - grace - CHECKPOINT_REPORT_MARGIN
        )
        moved += sweep(
            due,
            lambda job: _checkpoint_given_up(job, actor=actor, now=now),
            event_model=JobEvent,
            actor=actor,
            now=now,
        )
    return moved


def _checkpoint_given_up(job: Job, *, actor: Actor, now) -> None:
    job_transition(
        job=job,
        to=JobState.QUEUED,
        actor=actor,
        reason=Reason.CHECKPOINT_TIMED_OUT,
        message="the agent did not report the checkpoint in time; re-queued, its lease released",
        now=now,
    )
    for lease in Lease.objects.filter(job=job, state__in=HOLDING):
        lease_release(
            lease=lease,
            actor=actor,
            reason=Reason.RELEASED_JOB_ENDED,
            message="checkpoint timed out",
            now=now,
        )
