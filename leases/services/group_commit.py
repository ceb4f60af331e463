"""Group commit: concurrent reserves in one server process are combined.

The first caller becomes the leader, takes every reserve queued meanwhile (its own included),
reads ONE snapshot per pool, places the requests in order on it with the scheduling pass's
batch planner (`placement.batch.plan`: each placement taken before the next request is placed,
the decisions `place` makes one by one), and writes them all with ONE `ledger.apply` — the
single reserve's write, for the batch: quotas re-checked, the guarded writes per node, each
lease with its own event. Callers queued while a batch runs form the next batch. A node whose
capacity another process took meanwhile sends its requests back to their own threads to re-plan
on a fresh snapshot, as a single reserve does; a request that does not fit, or any database
error in the batch (the batch rolls back), sends it back to the ordinary path. Only reserves
outside a transaction, without idempotency key and without window are combined.
"""

from __future__ import annotations

import logging
import random
import threading

from django.conf import settings
from django.db import connection

from leases import backend
from leases import snapshot as snap
from placement import make_context
from placement.batch import plan as batch_plan

from . import ledger

logger = logging.getLogger(__name__)
MAX_BATCH = 64
RETRY_CONFLICT = "retry-conflict"  # re-plan on a fresh snapshot
RETRY_ALONE = "retry-alone"  # take the ordinary path: it explains, backfills or retries


def enabled() -> bool:
    return settings.LEASE_GROUP_COMMIT and backend.postgresql() and not connection.in_atomic_block


class Pending:
    """One queued reserve: what it asks, and (once `done`) its outcome — a Lease, a refusal
    to raise, or RETRY_CONFLICT / RETRY_ALONE."""

    __slots__ = (
        "actor",
        "done",
        "expires_at",
        "job",
        "lead",
        "now",
        "outcome",
        "policy",
        "pool",
        "req",
        "request",
        "tenant",
    )

    def __init__(self, pool, tenant, request, actor, req, policy, expires_at, job, now):
        self.pool, self.tenant, self.request, self.actor = pool, tenant, request, actor
        self.req, self.policy, self.expires_at, self.job, self.now = (
            req,
            policy,
            expires_at,
            job,
            now,
        )
        self.done = threading.Event()
        self.lead = False
        self.outcome = RETRY_ALONE


class _Combiner:
    def __init__(self):
        self.lock = threading.Lock()
        self.queue: list[Pending] = []
        self.leading = False

    def submit(self, item: Pending):
        with self.lock:
            self.queue.append(item)
            lead = not self.leading
            self.leading = True
        if not lead:
            item.done.wait()
            if not item.lead:
                return item.outcome
            item.lead = False  # woken to lead: its request is still queued
            item.done.clear()
        # the leader: run batches until its own request is answered, then hand over
        try:
            while not item.done.is_set():
                with self.lock:
                    batch = self.queue[:MAX_BATCH]
                    del self.queue[:MAX_BATCH]
                try:
                    _run_batch(batch)
                finally:
                    for pending in batch:
                        pending.done.set()
        finally:
            with self.lock:
                if self.queue:
                    successor = self.queue[0]
                    successor.lead = True
                    successor.done.set()
                else:
                    self.leading = False
        return item.outcome


_COMBINER = _Combiner()


def submit(item: Pending):
    """Queue a reserve for the next batch and wait for its outcome."""
    return _COMBINER.submit(item)


def _run_batch(batch: list[Pending]) -> None:
    for pending in batch:
        pending.outcome = RETRY_ALONE
    try:
        rows = _plan(batch)
        applied = ledger.apply(rows)
    except Exception:
        # The batch rolled back; each request goes its own way (outcome RETRY_ALONE): an error
        # that is not transient is raised there, to its caller.
        logger.warning("lease reserve batch of %d failed; retried one by one", len(batch))
        return
    for row in applied.taken:
        row.key.outcome = row.instance(tenant=row.key.tenant, job=row.key.job)
    for row, refusal in applied.refused:
        row.key.outcome = refusal
    for row, _ in applied.conflicts:
        row.key.outcome = RETRY_CONFLICT


def _plan(batch: list[Pending]) -> list[ledger.Row]:
    """The batch's requests placed in order with the pass's batch planner, on ONE snapshot per
    pool (the placements of a pool's requests see each other); the lease rows of those placed.
    A request that fits nowhere, or whose planning failed, is left to the ordinary path."""
    by_pool: dict[int, list[Pending]] = {}
    for pending in batch:
        by_pool.setdefault(pending.pool.pk, []).append(pending)
    rows = []
    shared: dict[tuple, ledger.Shared] = {}  # the batch's one write: one per pool and actor
    for pool_id, mine in by_pool.items():
        # the work on the nodes is read only when a request of the pool needs it
        work = any(snap.needs_work(p.req, p.policy) for p in mine)
        zone_work = any(snap.needs_zone_work(p.req) for p in mine)
        view = snap.pool_snapshot(
            pool_id,
            leases=False,
            work=work,
            zone_work=zone_work,
            data_keys=snap.data_keys_of(p.req for p in mine),
        )
        by_name = {node.name: node for node in view.nodes}
        nodes = view.nodes
        for policy, pendings in _by_policy(mine):
            ctx = make_context(nodes, policy, rng=random.Random())
            outcomes, nodes = batch_plan([p.req for p in pendings], nodes, policy, ctx)
            for pending, outcome in zip(pendings, outcomes, strict=True):
                if outcome.placement is not None:
                    rows.append(_row(pending, outcome.placement, view, by_name, shared))
    return rows


def _by_policy(pendings: list[Pending]) -> list[tuple[object, list[Pending]]]:
    # a pool's policy is cached per process, so a batch almost always holds one
    groups: dict[int, tuple[object, list[Pending]]] = {}
    for pending in pendings:
        groups.setdefault(id(pending.policy), (pending.policy, []))[1].append(pending)
    return list(groups.values())


def _row(pending: Pending, placement, view, by_name, shared: dict) -> ledger.Row:
    node_id = view.node_ids[placement.node]
    actor = pending.actor
    key = (pending.pool.pk, actor.kind, actor.label, actor.user_id)
    common = shared.get(key)
    if common is None:
        # the columns every lease of the batch shares (the model's defaults, who, the event's
        # state and reason), built once per batch instead of once per lease
        common = shared[key] = ledger.Shared(
            pool=pending.pool, actor=actor, now=pending.now, expires_at=pending.expires_at
        )
    row = ledger.lease_row(
        common,
        tenant_id=pending.tenant.pk,
        request=pending.request,
        placement=placement,
        node_id=node_id,
        allocations=ledger.gpu_allocations(placement, view, node_id, by_name[placement.node]),
        job_id=pending.job.pk if pending.job is not None else None,
        key=pending,
    )
    # each lease keeps its own request's times (what `Shared` takes from `now`/`expires_at`)
    row.lease.update(
        state_changed_at=pending.now, created_at=pending.now, expires_at=pending.expires_at
    )
    row.event["at"] = pending.now
    return row
