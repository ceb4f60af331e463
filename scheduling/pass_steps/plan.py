"""Read and plan: the window's jobs, their core requests, ONE snapshot of the pool, and every
job planned on it in the pure core (`placement.batch.plan`: the decisions `place` would make
one by one), each placement admitted by the pass's `Admission`; gangs after the other jobs,
each whole, on the nodes the batch plan left."""

from __future__ import annotations

import gc
import threading
from contextlib import ContextDecorator
from dataclasses import dataclass, replace

from leases import snapshot as snap
from leases.explain import NoCapacity, explanation_dict
from placement import (
    Explanation,
    Placement,
    Policy,
    Request,
    apply_placement,
    batch,
    place,
    place_gang,
)
from placement.bookkeeping import emptied
from placement.fragmentation import Workload
from placement.types import schedulable
from pools import knobs
from pools.reasons import Reason

from . import volumes
from .admission import Admission, order_window
from .gangs import Gang, GangWaits, form_gangs, well_formed
from .outcomes import PassResult, scheduling_error
from .window import JobRow, gang_mates, read_rows


@dataclass(slots=True)
class Planned:
    job: JobRow
    placement: Placement | None = None
    decision: dict | None = None
    explanation: dict | None = None  # why it waits (pending_reason), when not placed
    gang: Gang | None = None  # the gang it is placed with, whole


@dataclass(slots=True)
class Reading:
    """What a pool's plan reads: the window's jobs in the queue's order (with the members of
    their gangs), each one's core request, the policy, the snapshot and the Admission."""

    pool: object
    jobs: list[JobRow]
    core_requests: dict[int, Request]  # job id → its core request; equal requests share one
    policy: Policy
    view: object  # leases.snapshot's pool snapshot
    admission: Admission


def core_request(job) -> Request:
    """A job's core request, as `lease_reserve` builds it: placed only where its image's
    architectures run (image_arch filter), preferring nodes that have its pinned digest
    cached (warm_image)."""
    core = snap.core_request(job.resources, job.tenant_id, job.image_platforms or ())
    if "@" in (job.image or ""):
        core = replace(core, image=job.image.rsplit("@", 1)[1])
    if inputs := snap.input_keys(getattr(job, "inputs", None)):  # data_locality
        core = replace(core, inputs=inputs)
    return core


def read(pool, job_ids: list[int], now, result: PassResult) -> Reading:
    jobs = well_formed(read_rows(job_ids), now, result)
    # a gang is planned whole: its members outside the window too
    if mates := gang_mates(pool.pk, jobs):
        jobs += well_formed(read_rows(mates), now, result)
    core_requests, shared = {}, {}  # equal requests share one core Request
    for job in jobs:
        key = (
            job.key,
            job.tenant_id,
            tuple(job.image_platforms or ()),
            job.image,
            getattr(job, "inputs_key", "[]"),
        )
        try:
            if key not in shared:
                shared[key] = core_request(job)
            core_requests[job.pk] = shared[key]
        except Exception as error:  # a corrupt stored request fails its own job only
            result.pending[job.pk] = scheduling_error(job.pk, error, now)
    jobs = [job for job in jobs if job.pk in core_requests]
    # Fragmentation is measured against the mix of work asking for the pool: this window's
    # requests (FGD's "typical tasks"; the memory-coupled default needs their memory).
    policy = knobs.pool_policy(pool)
    if core_requests:
        policy = policy.with_workload(Workload.from_requests(core_requests.values()))
    # with the nodes' lease ends: a job that does not fit is told when capacity frees up
    work = any(snap.needs_work(r, policy) for r in core_requests.values())
    zone_work = any(snap.needs_zone_work(r) for r in core_requests.values())
    view = snap.pool_snapshot(
        pool.pk,
        work=work,
        zone_work=zone_work,
        data_keys=snap.data_keys_of(core_requests.values()),
        # a volume's export runs on its node while that node drains: only then is it read
        draining=snap.draining_pins(core_requests.values()),
    )
    jobs, admission = order_window(pool.pk, jobs, view, now)
    return Reading(pool, jobs, core_requests, policy, view, admission)


def plan(reading: Reading, now, result: PassResult) -> list[Planned]:
    """Every job of the reading planned: placed, or with the explanation it waits with."""
    members = [job for job in reading.jobs if job.gang]  # planned after the others
    jobs = [job for job in reading.jobs if not job.gang]
    positions = _ByPosition(reading, jobs)
    outcomes, nodes = batch.plan(
        [reading.core_requests[job.pk] for job in jobs],
        reading.view.nodes,
        reading.policy,
        admit=positions.admit,
        waited=positions.waited,
    )
    planned = []
    explained: dict[int, dict] = {}  # a class of requests shares one explanation: one UPDATE
    for job, outcome in zip(jobs, outcomes, strict=True):
        if outcome.error is not None:
            result.pending[job.pk] = scheduling_error(job.pk, outcome.error, now)
            continue
        p = Planned(job, outcome.placement, outcome.decision)
        if outcome.refusal:
            p.explanation = reading.admission.refusals[job.pk]
        elif outcome.explanation is not None:
            key = id(outcome.explanation)
            if key not in explained:
                explanation = explanation_dict(outcome.explanation, now=now)
                explained[key] = NoCapacity(explanation).explanation
            p.explanation = explained[key]
            if job.pk in positions.not_ready:
                p.explanation = {**p.explanation, **NO_READY_NODE}
            elif job.pk in positions.holds:  # the queue's gate holds capacity for it
                p.explanation = {**p.explanation, HEAD_OF_LINE: True}
        planned.append(p)
    volumes.node_words(reading.pool.pk, planned)  # a volume-bound wait, in its words
    if members:
        result.gangs.update(job.pk for job in members)
        formed = form_gangs(members, reading.core_requests)
        planned += _plan_gangs(formed, nodes, reading.policy, reading.admission)
    return planned


# in the pending_reason of a job the queue's gate holds capacity for (EASY backfill's head):
# later jobs run before it only when they cannot delay it (the queue pages show it)
HEAD_OF_LINE = "head_of_line"
NO_READY_NODE = {
    "code": Reason.NO_READY_NODE.value,
    "message": "It fits only on nodes that are not ready (not yet ready, draining, quarantined,"
    " unhealthy or unreachable): it waits for one, and no other job waits for it.",
}


class _ByPosition:
    """`batch.plan` names each job by its position in the list it plans. A job that waits
    holds the queue's gate only when it could run on a node that is schedulable now, were
    that node empty: capacity that may never come (nodes registered but never ready, a runtime
    no node offers any more) must not stall the pool (an idle `lab` stayed idle 16 minutes
    behind such a head). One that would fit a registered node that is not schedulable waits
    with `no_ready_node`; one that fits no node at all now keeps its explanation."""

    __slots__ = ("_empty", "_fits", "admission", "holds", "jobs", "not_ready", "reading")

    def __init__(self, reading: Reading, jobs: list[JobRow]):
        self.admission, self.jobs, self.reading = reading.admission, jobs, reading
        self.not_ready: set[int] = set()  # job ids that fit only on nodes not schedulable
        self.holds: set[int] = set()  # job ids the gate holds capacity for
        self._empty: dict[bool, list] = {}  # schedulable only? → those nodes, emptied
        self._fits: dict[tuple[int, bool], bool] = {}  # (id(core request), ready only) → fits

    def admit(self, position: int, placement: Placement) -> str:
        refusal = self.admission.admit(self.jobs[position], placement)
        return refusal["code"] if refusal else ""

    def waited(self, position: int, explanation: Explanation) -> None:
        job = self.jobs[position]
        req = self.reading.core_requests[job.pk]
        if self._could_run(req, ready_only=True):
            self.admission.blocked(job, explanation)
            gate = self.admission.gate
            if gate is not None and any(r.job == job.pk for r in gate.reservations):
                self.holds.add(job.pk)
        elif self._could_run(req, ready_only=False):
            self.not_ready.add(job.pk)

    def _could_run(self, req: Request, *, ready_only: bool) -> bool:
        key = (id(req), ready_only)
        if key not in self._fits:
            if ready_only not in self._empty:
                self._empty[ready_only] = self._emptied(ready_only)
            # NUMA aside: a view does not know its NUMA nodes' totals (the cautious reading)
            loose = replace(req, require_numa=False)
            fits = place(loose, self._empty[ready_only], self.reading.policy)
            self._fits[key] = isinstance(fits, Placement)
        return self._fits[key]

    def _emptied(self, ready_only: bool) -> list:
        if ready_only:
            return [emptied(n) for n in self.reading.view.nodes if schedulable(n)]
        return snap.registered_empty(self.reading.pool.pk).nodes  # one read, at most, a pass


def _plan_gangs(formed: list, nodes, policy: Policy, admission: Admission) -> list[Planned]:
    """The formed gangs, in order, on the nodes the batch plan left: `place_gang` places one
    replica per member, and every member passes the Admission, or none takes anything."""
    nodes = list(nodes)
    index = {node.name: i for i, node in enumerate(nodes)}
    planned = []
    for gang in formed:
        if isinstance(gang, GangWaits):
            planned += [Planned(job, explanation=gang.explanation) for job in gang.members]
            continue
        placed = place_gang(gang.replicas, nodes, policy)
        if isinstance(placed, Explanation):
            extra = {"gang_reason": placed.gang_reason}
            why = NoCapacity(explanation_dict(placed, **extra)).explanation
            planned += [Planned(job, explanation=why) for job in gang.members]
            continue
        if refusal := admission.admit_all(gang.members, placed.placements):
            planned += [Planned(job, explanation=refusal) for job in gang.members]
            continue
        decision = {"policy_version": placed.policy_version, "nodes": len(nodes)}
        decision |= {"gang": gang.name, "topology": gang.topology, "domain": placed.domain}
        for job, placement in zip(gang.members, placed.placements, strict=True):
            i = index[placement.node]
            nodes[i] = apply_placement(nodes[i], placement)
            chosen = {**decision, "chosen": placement.node}
            planned.append(Planned(job, placement, chosen, gang=gang))
    return planned


class PausedCollector(ContextDecorator):
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
