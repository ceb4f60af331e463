"""Group commit: concurrent reserves in one server process are combined.

The first caller becomes the leader, takes every reserve queued meanwhile (its own included),
reads ONE snapshot per pool, places the requests one after another on that in-memory snapshot
(the core's `apply_placement` after each, so they see each other), and applies them all in ONE
transaction — the same guarded compare-and-set statements as a single reserve, in node-id order
(the lock order), each lease with its own event. Callers queued while a batch runs form the
next batch. A guarded statement that matches 0 rows (another process took the capacity) sends
that request back to its own thread to re-plan on a fresh snapshot, as a single reserve does; a
request that does not fit, or any database error in the batch (the batch rolls back), sends it
back to the ordinary path. Only reserves outside a transaction, without idempotency key and
without window are combined.
"""

from __future__ import annotations

import logging
import random
import threading

from django.conf import settings
from django.db import connection, transaction

from leases import snapshot as snap
from placement import apply_placement, make_context, place
from placement import types as core
from pools.statemachine import TransitionRefused

from . import ledger, quota

logger = logging.getLogger(__name__)
MAX_BATCH = 64
RETRY_CONFLICT = "retry-conflict"  # re-plan on a fresh snapshot
RETRY_ALONE = "retry-alone"  # take the ordinary path: it explains, backfills or retries


def enabled() -> bool:
    return settings.LEASE_GROUP_COMMIT and ledger.postgresql() and not connection.in_atomic_block


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
    views: dict[int, snap.Snapshot] = {}
    # One scoring context per pool and policy: its evaluation cache is keyed by node identity,
    # and `apply_placement` replaces only the node it placed on, so a batch of similar requests
    # re-evaluates one node per placement instead of every node.
    contexts: dict[tuple, object] = {}
    planned = []
    try:
        for pending in batch:
            view = views.get(pending.pool.pk)
            if view is None:
                work = any(  # read the work on the nodes only when a request of the pool needs it
                    snap.needs_work(p.req, p.policy) for p in batch if p.pool.pk == pending.pool.pk
                )
                view = views[pending.pool.pk] = snap.pool_snapshot(
                    pending.pool.pk, leases=False, work=work
                )
            ctx = contexts.get((pending.pool.pk, id(pending.policy)))
            if ctx is None:
                ctx = contexts[(pending.pool.pk, id(pending.policy))] = make_context(
                    view.nodes, pending.policy, rng=random.Random()
                )
            result = place(pending.req, view.nodes, pending.policy, ctx)
            if isinstance(result, core.Explanation):
                continue  # the ordinary path explains the refusal or backfills
            at = next(i for i, n in enumerate(view.nodes) if n.name == result.node)
            node_id = view.node_ids[result.node]
            allocations = ledger.gpu_allocations(result, view, node_id)
            view.nodes[at] = apply_placement(view.nodes[at], result)
            planned.append((node_id, pending, result, allocations))
        outcomes = {}
        with transaction.atomic():
            quotas = quota.pairs_with_quota({(p.tenant.pk, p.pool.pk) for _, p, _, _ in planned})
            if quotas:  # lock order: quota rows before node rows, as a single reserve does
                quota.lock_quotas(quotas)
            # Per node, in node-id order (the lock order): first one statement for the leases
            # without GPUs and quota, then one by one those with GPUs (a savepoint each: a GPU
            # conflict undoes its node update) or a quota (checked under the quota row lock,
            # counting what this transaction already inserted).
            by_node: dict[int, tuple[list, list]] = {}
            for node_id, pending, result, allocations in planned:
                lease, event = ledger.build_reserved(
                    pool=pending.pool,
                    tenant=pending.tenant,
                    request=pending.request,
                    actor=pending.actor,
                    placement=result,
                    node_id=node_id,
                    allocations=allocations,
                    expires_at=pending.expires_at,
                    window=None,
                    job=pending.job,
                    idempotency_key="",
                    now=pending.now,
                    attempts=1,
                )
                simple, one_by_one = by_node.setdefault(node_id, ([], []))
                has_quota = (pending.tenant.pk, pending.pool.pk) in quotas
                (one_by_one if allocations or has_quota else simple).append((pending, lease, event))
            for node_id in sorted(by_node):
                simple, one_by_one = by_node[node_id]
                if simple:
                    taken = ledger.insert_group_taking_node_capacity(
                        [(le, ev) for _, le, ev in simple]
                    )
                    for pending, lease, _ in simple:
                        outcomes[id(pending)] = lease if taken else RETRY_CONFLICT
                for pending, lease, event in one_by_one:
                    pool, tenant = pending.pool, pending.tenant
                    try:
                        if (tenant.pk, pool.pk) in quotas:
                            quota.check_quota(
                                pool,
                                tenant,
                                lease.cpu_millicores,
                                lease.memory_mib,
                                lease.gpu_share,
                            )
                        with transaction.atomic():
                            ledger.insert_taking_node_capacity(lease, event)
                            ledger.take_gpus(
                                lease, allow_mixing=pool.allow_tenant_mixing_on_shared_gpus
                            )
                        outcomes[id(pending)] = lease
                    except ledger.Conflict:
                        outcomes[id(pending)] = RETRY_CONFLICT
                    except TransitionRefused as refused:
                        outcomes[id(pending)] = refused
    except Exception:
        # The batch rolled back; each request goes its own way (outcome RETRY_ALONE): an error
        # that is not transient is raised there, to its caller.
        logger.warning("lease reserve batch of %d failed; retried one by one", len(batch))
        return
    for pending in batch:
        pending.outcome = outcomes.get(id(pending), RETRY_ALONE)
