"""Who may take what in one pool's pass: the window in the queue's order, and `Admission`.

`order_window` puts the window in the queue's order (placement.queue: weighted fair share,
aging, the classes' maximum waits) and builds the `Admission` the plan admits each job through:
the queue's gate (short-job share, backfill behind the head), both fed by the tenants'
standings in the pool, and each tenant's quota `Headroom`. The single path admits its gangs
through an `Admission` too, with the headroom alone (it has no queue gate).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

from leases.services import quota
from placement import Explanation, Placement
from placement.explain import coarse_floor
from placement.queue import BACKFILL_WOULD_DELAY_HEAD, SHORT_SHARE_RESERVED, Gate, order
from placement.types import schedulable
from scheduling import fairshare

from .volumes import VolumeWriters

GATE_MESSAGES = {
    SHORT_SHARE_RESERVED: "the pool keeps a share of its capacity for short jobs (a declared "
    "maximum runtime under the pool's threshold); long jobs wait for room outside it",
    BACKFILL_WOULD_DELAY_HEAD: "{ahead}, ahead of it in the queue, waits for this capacity; a "
    "job runs before it only when it ends before that one can start",
}


def gate_refusal(code: str, job, gate: Gate, policy) -> dict:
    """A gate's refusal as the job's pending_reason, true and useful to its tenant: the job it
    waits behind is named only when it is the tenant's own (another tenant's work is neither
    named nor timed, docs/security.md), and advice is given only when following it would get
    the job admitted: a maximum runtime under the head's start when that start is known, a
    short job's runtime when the pool keeps a share for short jobs."""
    refusal = {"code": code}
    if code == BACKFILL_WOULD_DELAY_HEAD:
        head = gate.blocker
        own = head is not None and str(head.tenant) == str(job.tenant_id)
        ahead = f"your job {head.job}" if own else "a job of another tenant"
        refusal["message"] = GATE_MESSAGES[code].format(ahead=ahead)
        if own:
            refusal["blocker_job"] = head.job
        start_s = head.start_s if head is not None else None
        # what the tenant may know of when the head starts: its own job's exactly, another
        # tenant's as the coarse window's lower bound (a runtime under it surely runs first)
        known = start_s if own else coarse_floor(start_s)
        if known and known >= 1:
            refusal["advice"] = (
                f"declare a maximum runtime under {int(known)} s: it then ends before the job "
                "ahead can start, and may run before it"
            )
        else:  # when the head starts is unknown (or too soon): no runtime is surely short enough
            refusal["advice"] = "wait: it runs once the job ahead of it has started"
        return refusal
    refusal["message"] = GATE_MESSAGES[code]
    threshold = policy.short_job_max_runtime_s if policy is not None else None
    if threshold:
        refusal["advice"] = (
            f"declare a maximum runtime of at most {threshold} s to count as a short job, or "
            "wait for long jobs' room"
        )
    return refusal


class Admission:
    """What the jobs of one pass may still take: the queue's gate (None: no gate), each
    tenant's quota headroom (tenant id → `quota.Headroom`, for the tenants with a quota or a
    credit account), and why each job it refused was refused. `queued`: job id → the core's
    QueuedJob, which the gate reads (the jobs the gate orders)."""

    def __init__(self, headroom: dict, *, gate: Gate | None = None, queued=None, now=None):
        self.gate, self.headroom, self.queued, self.now = gate, headroom, queued or {}, now
        self.refusals: dict[int, dict] = {}  # job id → its refusal, as its pending_reason
        self.volumes: VolumeWriters | None = None  # set by order_window: who writes a volume

    @classmethod
    def for_tenants(cls, pool_id: int, tenant_ids) -> Admission:
        """Quota headroom only, read now (the single path's gangs)."""
        return cls(quota.quota_headroom(pool_id, set(tenant_ids)))

    def admit(self, job, placement: Placement) -> dict | None:
        """None when `job` may take `placement` (then taken from the gate and its tenant's
        headroom); else the refusal, as the job's pending_reason (nothing taken)."""
        queued = self.queued.get(job.pk)
        if self.volumes is not None and (refusal := self.volumes.refusal(job)):
            self.refusals[job.pk] = refusal
            return refusal
        if self.gate is not None and (code := self.gate.admits(queued)):
            refusal = self.refusals[job.pk] = gate_refusal(code, job, self.gate, self.gate.policy)
            return refusal
        room = self.headroom.get(job.tenant_id)
        if room is not None:
            gpus = queued.demand[2] if queued else fairshare.request_gpus(job.resources)
            over = room.take(
                cpu_millicores=placement.cpu_millicores,
                memory_mib=placement.memory_mib,
                gpus=gpus,
            )
            if over:
                refusal = self.refusals[job.pk] = room.explanation(over)
                return refusal
        if self.gate is not None:
            self.gate.took(queued)
        return None

    def blocked(self, job, explanation: Explanation) -> None:
        """`job` fits nowhere now: the gate holds its capacity for it, from when the nearest
        miss frees up (when known)."""
        if self.gate is None:
            return
        near = explanation.nearest_miss
        fits_at = getattr(near, "fits_at", None) if near else None
        start_s = (fits_at - self.now).total_seconds() if hasattr(fits_at, "tzinfo") else None
        self.gate.blocked(self.queued[job.pk], start_s)

    @contextmanager
    def trial(self) -> Iterator[Trial]:
        """All or none: what is admitted inside is taken back on exit unless `commit()`ed."""
        trial = Trial()
        saved = copy.deepcopy((self.gate, self.headroom))
        # the volumes its writers claimed go back too (a gang tried and not placed)
        writers = self.volumes.claims() if self.volumes is not None else None
        try:
            yield trial
        finally:
            if not trial.committed:
                self.gate, self.headroom = saved
                if self.volumes is not None:
                    self.volumes.restore(writers)

    def admit_all(self, jobs, placements) -> dict | None:
        """Each job through `admit` with its placement, all or none: the first refusal, or
        None when every one was admitted."""
        with self.trial() as trial:
            for job, placement in zip(jobs, placements, strict=True):
                if refusal := self.admit(job, placement):
                    return refusal
            trial.commit()
        return None


class Trial:
    committed = False

    def commit(self) -> None:
        self.committed = True


def schedulable_capacity(nodes) -> tuple[float, float, float]:
    """What the queue's order and gate count as the pool's size: the snapshot's nodes (ready,
    reachable) that are healthy too; a node that cannot take work is no share of anyone's and
    no room to hold for a head."""
    ready = [n for n in nodes if schedulable(n)]
    return (
        float(sum(n.cpu_millicores for n in ready)),
        float(sum(n.memory_mib for n in ready)),
        float(sum(len(n.gpus) for n in ready)),
    )


def queue_order(pool_id: int, queued: list, capacity, now):
    """The core's QueuedJobs in the queue's order, with the standings and the policy it was
    ordered by: the pass's order (`order_window`) and the queue pages' (scheduling/selectors.py
    `pool_queue`) are this one."""
    policy = fairshare.pool_queue_policy(pool_id)
    standings = fairshare.standings(pool_id, {q.tenant for q in queued}, now, policy=policy)
    return order(list(queued), standings, capacity, policy), standings, policy


def order_window(pool_id: int, jobs: list, view, now) -> tuple[list, Admission]:
    """The window's jobs in the queue's order, and the Admission that admits them (its gate
    and every tenant's quota headroom, read now)."""
    capacity = schedulable_capacity(view.nodes)
    queued = {
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
    ordered, standings, policy = queue_order(pool_id, list(queued.values()), capacity, now)
    by_id = {job.pk: job for job in jobs}
    gate = Gate.from_standings(capacity, standings, policy)
    headroom = quota.quota_headroom(pool_id, {job.tenant_id for job in jobs})
    admission = Admission(headroom, gate=gate, queued=queued, now=now)
    admission.volumes = VolumeWriters(pool_id)
    return [by_id[q.id] for q in ordered], admission
