"""Leases: the capacity ledger. Every state change writes a LeaseEvent with a reason code.

The ledger (`Node.*_reserved`, `GpuDevice.milli_reserved`, `GpuDevice.mig_slots_used`) always
equals the sum of the HOLDING leases that are not backfills. It changes only here, and only by
guarded compare-and-set UPDATEs in the same transaction as the lease row:

    UPDATE node SET cpu_reserved = cpu_reserved + x ...
     WHERE id = n AND cpu_reserved <= cpu_allocatable - x AND ... AND state = 'ready'
       AND reachability = 'reachable'   -- a node lost since the snapshot gets nothing new

Reserve = read a snapshot without locks → the pure core places → one short transaction that
inserts the lease and its event and then applies the guarded UPDATEs (node row first, then its
GPUs in id order; every path locks lease → node → GPUs in that order, so there is no deadlock).
"0 rows updated" means another writer took the capacity first: the transaction rolls back and
the request is re-planned on a fresh snapshot, a bounded number of times. The database CHECK
constraints are the last line of defence; an IntegrityError from them is a retry, never a 500.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, Count, F, Q, Sum, Value, When
from django.db.models.lookups import Exact
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from nodes.choices import NodeState, Reachability
from nodes.models import GpuDevice, Node
from pools.actors import Actor
from pools.models import Quota
from pools.reasons import Reason
from pools.statemachine import Refusal, TransitionRefused, record_sweep_failure, transition
from scheduling.core import types as core
from scheduling.core.planner import apply_placement, make_context, place

from . import snapshot as snap
from .choices import HOLDING, LEASE_TRANSITIONS, TERMINAL, LeaseState
from .models import Lease, LeaseEvent

S = LeaseState
logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 6  # plans per reserve; after 2 conflicts the choice among fitting nodes is random

# Reservation policy defaults; a pool overrides them in its scheduling policy knobs.
RESERVATION_DEFAULTS = {
    "reservation_max_horizon_s": 7 * 24 * 3600,  # how far ahead a window may start
    "reservation_max_hold_s": 24 * 3600,  # how long a window may last
    "reservation_max_tolerance_s": 3600,  # how late a reservation may be claimed
}


class NoCapacity(Refusal):
    """Nothing fits now (409): reason codes with node counts and the nearest miss."""

    status = 409
    code = "no_capacity"

    def __init__(self, explanation: dict):
        super().__init__(explanation.get("message", "no capacity"))
        # what a queued job keeps as its pending_reason; the API body adds `detail`
        self.explanation = {"code": self.code, **explanation}
        self.extra = self.explanation


class NeverFits(NoCapacity):
    """The shape cannot fit in the pool even on an empty node (422)."""

    status = 422
    code = "never_fits"


# The scheduling pass reserves with keys `job-<id>-attempt-<n>` (scheduling/passes.py). Clients
# may not use keys with this prefix (the API answers 400), or a tenant could pre-claim the key
# of its own job's next placement and have the job "placed" on a lease of its choosing.
SCHEDULER_KEY_PREFIX = "job-"


class IdempotencyKeyReused(Refusal):
    """The key names an earlier reserve of the tenant that asked for something else (422)."""

    status = 422
    code = "idempotency_key_reused"


def _request_digest(pool, request: dict, hold) -> str:
    """What a keyed reserve asked for: the pool, the resources, and its window or duration
    (`hold`). Stored with the lease; a retry with the same key must ask the same."""
    if isinstance(hold, Window):
        hold = [hold.start.timestamp(), hold.end.timestamp(), hold.tolerance.total_seconds()]
    else:
        hold = hold.total_seconds()
    body = orjson.dumps([pool.pk, request, hold], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(body).hexdigest()


def _replayed(lease: Lease, digest: str) -> Lease:
    """The lease an earlier reserve with the same key made, if it asked the same (`digest`;
    "" when no key was given). Leases keyed before digests were stored are returned as is."""
    if digest and lease.idempotency_digest and lease.idempotency_digest != digest:
        raise IdempotencyKeyReused(
            f"Idempotency key {lease.idempotency_key!r} was used for lease {lease.pk}, "
            "which asked for something else; use a new key for a new request."
        )
    return lease


@dataclass(frozen=True)
class Window:
    """A reservation window: capacity is held for [start, end) and must be claimed by
    start + tolerance."""

    start: datetime
    end: datetime
    tolerance: timedelta = timedelta(minutes=5)

    @classmethod
    def coerce(cls, value) -> Window | None:
        if value is None or isinstance(value, Window):
            return value
        if isinstance(value, dict):
            tolerance = value.get("tolerance", value.get("tolerance_s", 300))
            return cls(value["start"], value["end"], _as_timedelta(tolerance))
        start, end, *rest = value
        return cls(start, end, _as_timedelta(rest[0]) if rest else timedelta(minutes=5))


class _Conflict(Exception):
    """A guarded UPDATE matched 0 rows: someone else took the capacity first."""


def _as_timedelta(value) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=float(value))


def _nearest_miss_dict(near: core.NearMiss | None) -> dict | None:
    if near is None:
        return None
    return {
        "node": near.node,
        "reason": near.reason,
        "lacking": dict(near.lacking),
        "message": near.message,
        # when capacity frees up: the leases that must end first, and where it would then fit
        "fits_at": near.fits_at.isoformat() if near.fits_at else None,
        "fits_on": near.fits_on or None,
        "after_leases": list(near.after_leases),
    }


def _explanation_dict(explanation: core.Explanation, **extra) -> dict:
    return {
        "message": explanation.message,
        "total_nodes": explanation.total_nodes,
        "reasons": dict(explanation.reasons),
        "nearest_miss": _nearest_miss_dict(explanation.nearest_miss),
        "policy_version": explanation.policy_version,
        **extra,
    }


def _authorize(lease: Lease, actor: Actor) -> None:
    """A node's credential acts only on leases of that node."""
    if actor.kind == "node" and getattr(actor.node, "pk", None) != lease.node_id:
        raise TransitionRefused("not_your_lease", "This node does not hold that lease.")


# --- reserve ---------------------------------------------------------------------------------


def lease_reserve(
    *,
    pool,
    tenant,
    request: dict,
    actor: Actor,
    duration,
    job=None,
    idempotency_key: str = "",
    window=None,
    now=None,
) -> Lease:
    """Atomically select a node, reserve capacity on it and return the lease.

    Raises NoCapacity (409) when nothing fits now, NeverFits (422) when nothing ever could,
    TransitionRefused("quota_exceeded" | "reservation_*") when policy refuses.
    """
    now = now or timezone.now()
    duration = _as_timedelta(duration)
    window = Window.coerce(window)
    digest = _request_digest(pool, request, window or duration) if idempotency_key else ""
    if idempotency_key:
        existing = Lease.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replayed(existing, digest)
    if duration <= timedelta(0):
        raise TransitionRefused("invalid_duration", "A lease lasts a positive duration.")
    expires_at = now + duration
    if window is not None:
        expires_at = _check_window(pool, window, now)
    req = snap.core_request(request, tenant.pk)
    policy = snap.pool_policy(pool)
    conflicts = first_attempt = 0
    if window is None and not idempotency_key and _group_commit_enabled():
        outcome = _COMBINER.submit(
            _Pending(pool, tenant, request, actor, req, policy, expires_at, job, now)
        )
        if isinstance(outcome, Lease):
            return outcome
        if isinstance(outcome, Exception):
            raise outcome
        # _RETRY_CONFLICT: re-plan here on a fresh snapshot; _RETRY_ALONE: nothing fit in the
        # batch (or the batch failed): the ordinary path explains, backfills or retries.
        if outcome is _RETRY_CONFLICT:
            conflicts = first_attempt = 1
    for attempt in range(first_attempt, MAX_ATTEMPTS):
        view = snap.pool_snapshot(pool.pk, leases=False)
        chosen_policy = policy
        if attempt >= 2:  # spread: pick at random among the nodes that fit
            chosen_policy = replace(policy, weights={"random": 1.0})
        ctx = make_context(view.nodes, chosen_policy, rng=random.Random())
        result = place(req, view.nodes, chosen_policy, ctx)
        if isinstance(result, core.Explanation):
            if window is None:
                lease = _try_backfill(
                    pool, tenant, req, request, actor, now, expires_at, job, idempotency_key
                )
                if lease is not None:
                    return _replayed(lease, digest)  # another request may have won the key
            raise _refusal(pool, req, policy, result, conflicts)
        try:
            return _apply_reserve(
                pool=pool,
                tenant=tenant,
                request=request,
                actor=actor,
                placement=result,
                view=view,
                expires_at=expires_at,
                window=window,
                job=job,
                idempotency_key=idempotency_key,
                now=now,
                attempts=attempt + 1,
            )
        except _Conflict:
            conflicts += 1
        except IntegrityError:
            if idempotency_key:
                existing = Lease.objects.filter(
                    tenant=tenant, idempotency_key=idempotency_key
                ).first()
                if existing is not None:
                    return _replayed(existing, digest)
            conflicts += 1
    raise NoCapacity(
        {
            "message": f"capacity contended: {conflicts} conflicting writers in {MAX_ATTEMPTS} "
            "attempts; retry",
            "total_nodes": len(view.nodes),
            "reasons": {"capacity_contention": conflicts},
            "nearest_miss": None,
            "policy_version": policy.version,
            "conflicts": conflicts,
        }
    )


# --- group commit ----------------------------------------------------------------------------
#
# Concurrent reserves in one server process are combined: the first caller becomes the leader,
# takes every reserve queued meanwhile (its own included), reads ONE snapshot per pool, places
# the requests one after another on that in-memory snapshot (the core's `apply_placement` after
# each, so they see each other), and applies them all in ONE transaction — the same guarded
# compare-and-set statements as a single reserve, in node-id order (the lock order), each lease
# with its own event. Callers queued while a batch runs form the next batch. A guarded statement
# that matches 0 rows (another process took the capacity) sends that request back to its own
# thread to re-plan on a fresh snapshot, as a single reserve does; a request that does not fit,
# or any database error in the batch (the batch rolls back), sends it back to the ordinary path.
# Only reserves outside a transaction, without idempotency key and without window are combined.

MAX_BATCH = 64
_RETRY_CONFLICT = "retry-conflict"
_RETRY_ALONE = "retry-alone"


def _postgresql() -> bool:
    """The hot paths are PostgreSQL statements; other databases (SQLite for `make run`) take
    plain ORM paths with the same guards."""
    return connection.vendor == "postgresql"


def _group_commit_enabled() -> bool:
    return settings.LEASE_GROUP_COMMIT and _postgresql() and not connection.in_atomic_block


class _Pending:
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
        self.outcome = _RETRY_ALONE


class _Combiner:
    def __init__(self):
        self.lock = threading.Lock()
        self.queue: list[_Pending] = []
        self.leading = False

    def submit(self, item: _Pending):
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


def _run_batch(batch: list[_Pending]) -> None:
    for pending in batch:
        pending.outcome = _RETRY_ALONE
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
                view = views[pending.pool.pk] = snap.pool_snapshot(pending.pool.pk, leases=False)
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
            allocations = _gpu_allocations(result, view, node_id)
            view.nodes[at] = apply_placement(view.nodes[at], result)
            planned.append((node_id, pending, result, allocations))
        outcomes = {}
        with transaction.atomic():
            quotas = _tenants_with_quota(planned)
            if quotas:  # lock order: quota rows before node rows, as a single reserve does
                _lock_quotas(quotas)
            # Per node, in node-id order (the lock order): first one statement for the leases
            # without GPUs and quota, then one by one those with GPUs (a savepoint each: a GPU
            # conflict undoes its node update) or a quota (checked under the quota row lock,
            # counting what this transaction already inserted).
            by_node: dict[int, tuple[list, list]] = {}
            for node_id, pending, result, allocations in planned:
                lease, event = _build_reserved(
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
                quota = (pending.tenant.pk, pending.pool.pk) in quotas
                (one_by_one if allocations or quota else simple).append((pending, lease, event))
            for node_id in sorted(by_node):
                simple, one_by_one = by_node[node_id]
                if simple:
                    taken = _insert_group_taking_node_capacity([(le, ev) for _, le, ev in simple])
                    for pending, lease, _ in simple:
                        outcomes[id(pending)] = lease if taken else _RETRY_CONFLICT
                for pending, lease, event in one_by_one:
                    pool, tenant = pending.pool, pending.tenant
                    try:
                        if (tenant.pk, pool.pk) in quotas:
                            _check_quota(
                                pool,
                                tenant,
                                lease.cpu_millicores,
                                lease.memory_mib,
                                len(lease.gpu_allocations),
                            )
                        with transaction.atomic():
                            _insert_taking_node_capacity(lease, event)
                            _take_gpus(lease, allow_mixing=pool.allow_tenant_mixing_on_shared_gpus)
                        outcomes[id(pending)] = lease
                    except _Conflict:
                        outcomes[id(pending)] = _RETRY_CONFLICT
                    except TransitionRefused as refused:
                        outcomes[id(pending)] = refused
    except Exception:
        # The batch rolled back; each request goes its own way (outcome _RETRY_ALONE): an error
        # that is not transient is raised there, to its caller.
        logger.warning("lease reserve batch of %d failed; retried one by one", len(batch))
        return
    for pending in batch:
        pending.outcome = outcomes.get(id(pending), _RETRY_ALONE)


# Whether a (tenant, pool) HAS a quota row is configuration: cached per process for a few
# seconds (a quota created or deleted takes effect within QUOTA_CACHE_SECONDS in other
# processes, at once in this one). Usage against an existing quota is always checked under the
# quota row's lock (`_check_quota`), never cached.
QUOTA_CACHE_SECONDS = 5.0
_has_quota: dict[tuple[int, int], tuple[float, bool]] = {}


@receiver([post_save, post_delete], sender=Quota)
def _forget_quotas(sender, instance, **kwargs):
    _has_quota.clear()


def _lock_quotas(pairs: set[tuple[int, int]]) -> None:
    tenants, pools = zip(*pairs, strict=True)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Quota._meta.db_table} "
            "WHERE tenant_id = ANY(%s) AND pool_id = ANY(%s) ORDER BY id FOR UPDATE",
            [list(set(tenants)), list(set(pools))],
        )


def _tenants_with_quota(planned) -> set[tuple[int, int]]:
    """(tenant id, pool id) of the batch that have a quota row."""
    pairs = {(p.tenant.pk, p.pool.pk) for _, p, _, _ in planned}
    now = time.monotonic()
    known = {pair: _has_quota.get(pair) for pair in pairs}
    if all(hit is not None and now - hit[0] < QUOTA_CACHE_SECONDS for hit in known.values()):
        return {pair for pair, hit in known.items() if hit[1]}
    tenants, pools = zip(*pairs, strict=True)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tenant_id, pool_id FROM {Quota._meta.db_table} "
            "WHERE tenant_id = ANY(%s) AND pool_id = ANY(%s)",
            [list(set(tenants)), list(set(pools))],
        )
        found = {tuple(row) for row in cursor.fetchall()} & pairs
    if len(_has_quota) > 10_000:
        _has_quota.clear()
    for pair in pairs:
        _has_quota[pair] = (now, pair in found)
    return found


def check_ever_fits(*, pool, tenant, request: dict) -> None:
    """Raises NeverFits (422) when no node of the pool could ever hold `request` (see
    `_never_fits`): job submission refuses such a job instead of queueing it forever."""
    refusal = _never_fits(pool, snap.core_request(request, tenant.pk), snap.pool_policy(pool))
    if refusal is not None:
        raise refusal


def _never_fits(pool, req, policy, conflicts: int = 0) -> NeverFits | None:
    """The one definition of "never fits": no node of the pool that is not retired, viewed
    ready and empty, could hold the request. A pool without any node yet is "not now" (409):
    capacity may still be enrolled."""
    empty = snap.pool_snapshot(
        pool.pk, states=[s for s in NodeState.values if s != NodeState.RETIRED], empty=True
    )
    ever = place(req, empty.nodes, policy) if empty.nodes else None
    if isinstance(ever, core.Explanation):
        return NeverFits(_explanation_dict(ever, conflicts=conflicts))
    return None


def _refusal(pool, req, policy, explanation, conflicts) -> NoCapacity:
    """422 when the request never fits, else 409 with counts over every non-retired node."""
    never = _never_fits(pool, req, policy, conflicts)
    if never is not None:
        return never
    everything = snap.all_nodes_snapshot(pool.pk)
    now_result = place(req, everything.nodes, policy)
    if isinstance(now_result, core.Explanation):  # else capacity appeared meanwhile
        explanation = now_result
    return NoCapacity(_explanation_dict(explanation, conflicts=conflicts))


def _check_window(pool, window: Window, now) -> datetime:
    knobs = {**RESERVATION_DEFAULTS, **snap.pool_knobs(pool)}
    if window.end <= window.start:
        raise TransitionRefused("reservation_window_invalid", "The window ends before it starts.")
    if window.start < now:
        raise TransitionRefused("reservation_window_invalid", "The window starts in the past.")
    if (window.start - now).total_seconds() > knobs["reservation_max_horizon_s"]:
        raise TransitionRefused(
            "reservation_horizon_exceeded",
            f"Windows may start at most {knobs['reservation_max_horizon_s']} s ahead.",
        )
    if (window.end - window.start).total_seconds() > knobs["reservation_max_hold_s"]:
        raise TransitionRefused(
            "reservation_hold_exceeded",
            f"Windows may last at most {knobs['reservation_max_hold_s']} s.",
        )
    if window.tolerance.total_seconds() > knobs["reservation_max_tolerance_s"]:
        raise TransitionRefused(
            "reservation_tolerance_exceeded",
            f"Tolerance may be at most {knobs['reservation_max_tolerance_s']} s.",
        )
    return min(window.start + window.tolerance, window.end)


def _check_quota(pool, tenant, cpu: int, memory: int, gpus: int) -> None:
    """Inside the apply transaction; the quota row lock serialises a tenant's reserves."""
    # Plain SQL (the ORM's query compilation was a measurable share of a reserve's CPU).
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT max_leases, cpu_millicores, memory_mib, gpus FROM {Quota._meta.db_table} "
            "WHERE tenant_id = %s AND pool_id = %s" + lock,
            [tenant.pk, pool.pk],
        )
        row = cursor.fetchone()
    if row is None:
        return
    quota = Quota(max_leases=row[0], cpu_millicores=row[1], memory_mib=row[2], gpus=row[3])
    held = list(
        Lease.objects.filter(
            tenant=tenant, pool=pool, state__in=HOLDING, backfill_of__isnull=True
        ).values_list("cpu_millicores", "memory_mib", "gpu_allocations")
    )
    over = _over_quota(
        quota,
        leases=len(held) + 1,
        cpu=sum(r[0] for r in held) + cpu,
        memory=sum(r[1] for r in held) + memory,
        gpus=sum(len(r[2]) for r in held) + gpus,
    )
    if over:
        raise TransitionRefused("quota_exceeded", over)


def _over_quota(quota: Quota, *, leases: int, cpu: int, memory: int, gpus: int) -> str:
    """What the tenant would hold with one more lease, where it exceeds the quota ("" if not)."""
    limits = (
        ("leases", leases, quota.max_leases),
        ("cpu_millicores", cpu, quota.cpu_millicores),
        ("memory_mib", memory, quota.memory_mib),
        ("gpus", gpus, quota.gpus),
    )
    over = [f"{name} {used} > {limit}" for name, used, limit in limits if used > limit]
    return "Quota exceeded: " + ", ".join(over) if over else ""


def tenants_at_quota(*, pool_id=None, tenant_id=None) -> dict[tuple[int, int], dict]:
    """(tenant id, pool id) → the `quota_exceeded` explanation, for every quota without room for
    even the smallest lease (one more, of 1 millicore and 1 MiB and no GPU: every request asks
    at least that). The scheduling pass skips their queued jobs without a placement attempt."""
    quotas = Quota.objects.all()
    if pool_id is not None:
        quotas = quotas.filter(pool_id=pool_id)
    if tenant_id is not None:
        quotas = quotas.filter(tenant_id=tenant_id)
    quotas = list(quotas)
    if not quotas:
        return {}
    held = {
        (row["tenant_id"], row["pool_id"]): row
        for row in Lease.objects.filter(
            state__in=HOLDING,
            backfill_of__isnull=True,
            tenant_id__in={q.tenant_id for q in quotas},
            pool_id__in={q.pool_id for q in quotas},
        )
        .order_by()
        .values("tenant_id", "pool_id")
        .annotate(leases=Count("id"), cpu=Sum("cpu_millicores"), memory=Sum("memory_mib"))
    }
    blocked = {}
    for quota in quotas:
        used = held.get((quota.tenant_id, quota.pool_id), {})
        over = _over_quota(
            quota,
            leases=used.get("leases", 0) + 1,
            cpu=(used.get("cpu") or 0) + 1,
            memory=(used.get("memory") or 0) + 1,
            gpus=0,
        )
        if over:
            blocked[(quota.tenant_id, quota.pool_id)] = {"code": "quota_exceeded", "message": over}
    return blocked


def _gpu_allocations(placement: core.Placement, view: snap.Snapshot, node_id: int) -> list[dict]:
    node = view.node(placement.node)
    by_index = {g.index: g for g in node.gpus}
    out = []
    for share in placement.devices:
        gpu_id = view.gpu_ids[(node_id, share.index)]
        if share.mig_profile:
            g = by_index[share.index]
            mask = snap.mig_mask(g.model, g.memory_mib, share.mig_profile, share.mig_start)
            out.append(
                {
                    "gpu": gpu_id,
                    "index": share.index,
                    "milli": 0,
                    "mig_slots": mask,
                    "mig_profile": share.mig_profile,
                }
            )
        else:
            out.append({"gpu": gpu_id, "index": share.index, "milli": share.milli, "mig_slots": 0})
    return sorted(out, key=lambda a: a["gpu"])


def _placement_record(placement: core.Placement) -> dict:
    return {
        "node": placement.node,
        "score": placement.score,
        "score_breakdown": dict(placement.score_breakdown),
        "grants": {
            k: {"minimum": g.minimum, "preferred": g.preferred, "granted": g.granted}
            for k, g in placement.grants.items()
        },
        "policy": placement.policy_name,
    }


def _apply_reserve(
    *,
    pool,
    tenant,
    request,
    actor,
    placement,
    view,
    expires_at,
    window,
    job,
    idempotency_key,
    now,
    attempts=1,
) -> Lease:
    node_id = view.node_ids[placement.node]
    allocations = _gpu_allocations(placement, view, node_id)
    with transaction.atomic():
        _check_quota(pool, tenant, placement.cpu_millicores, placement.memory_mib, len(allocations))
        lease, event = _build_reserved(
            pool=pool,
            tenant=tenant,
            request=request,
            actor=actor,
            placement=placement,
            node_id=node_id,
            allocations=allocations,
            expires_at=expires_at,
            window=window,
            job=job,
            idempotency_key=idempotency_key,
            now=now,
            attempts=attempts,
        )
        _insert_taking_node_capacity(lease, event)
        _take_gpus(lease, allow_mixing=pool.allow_tenant_mixing_on_shared_gpus)
    return lease


def _build_reserved(
    *,
    pool,
    tenant,
    request,
    actor,
    placement,
    node_id,
    allocations,
    expires_at,
    window,
    job,
    idempotency_key,
    now,
    attempts,
    backfill_of: Lease | None = None,
) -> tuple[Lease, LeaseEvent]:
    """The new lease (reserved) and its `reserved` event, not saved yet."""
    record = {**_placement_record(placement), "attempts": attempts}
    message = f"reserved on {placement.node}"
    data = {"node": placement.node, "score": placement.score}
    if window:
        message += f" for the window from {window.start:%Y-%m-%d %H:%M}"
    if backfill_of is not None:
        record["backfill_of"] = data["backfill_of"] = backfill_of.pk
        message = (
            f"backfilled into reservation {backfill_of.pk} on {placement.node}, "
            f"ends before {backfill_of.window_start:%Y-%m-%d %H:%M}"
        )
    lease = Lease(
        pool=pool,
        tenant=tenant,
        node_id=node_id,
        job=job,
        state=S.RESERVED,
        state_changed_at=now,
        cpu_millicores=placement.cpu_millicores,
        memory_mib=placement.memory_mib,
        scratch_mib=placement.scratch_mib,
        gpu_allocations=allocations,
        request=request,
        placement=record,
        policy_version=placement.policy_version,
        expires_at=expires_at,
        idempotency_key=idempotency_key,
        idempotency_digest=(
            _request_digest(pool, request, window or expires_at - now) if idempotency_key else ""
        ),
        created_by=actor.user,
        created_at=now,
        window_start=window.start if window else None,
        window_end=window.end if window else None,
        tolerance_s=int(window.tolerance.total_seconds()) if window else 0,
        backfill_of=backfill_of,
    )
    event = LeaseEvent.build(
        lease,
        actor=actor,
        from_state="",
        to_state=S.RESERVED,
        reason=Reason.RESERVED,
        message=message,
        at=now,
        data=data,
    )
    return lease, event


def _insert_taking_node_capacity(lease: Lease, event: LeaseEvent) -> None:
    """The guarded node UPDATE, then the lease and its event inserted only when it matched
    (one statement on PostgreSQL). Raises _Conflict when another writer took the capacity."""
    if not _postgresql():
        _take_node_capacity_portably(lease, event)
    elif not _insert_group_taking_node_capacity([(lease, event)]):
        raise _Conflict


def _take_node_capacity_portably(lease: Lease, event: LeaseEvent) -> None:
    """The same guarded UPDATE through the ORM, then the inserts (same transaction)."""
    cpu, mem, scratch = lease.cpu_millicores, lease.memory_mib, lease.scratch_mib
    taken = Node.objects.filter(
        pk=lease.node_id,
        state=NodeState.READY,
        reachability=Reachability.REACHABLE,
        cpu_millicores_reserved__lte=F("cpu_millicores_allocatable") - cpu,
        memory_mib_reserved__lte=F("memory_mib_allocatable") - mem,
        scratch_mib_reserved__lte=F("scratch_mib_allocatable") - scratch,
    ).update(
        cpu_millicores_reserved=F("cpu_millicores_reserved") + cpu,
        memory_mib_reserved=F("memory_mib_reserved") + mem,
        scratch_mib_reserved=F("scratch_mib_reserved") + scratch,
    )
    if not taken:
        raise _Conflict
    _save_with_event(lease, event)


def _save_with_event(lease: Lease, event: LeaseEvent) -> None:
    lease.save()
    event.lease = lease
    event.save()


def _insert_fields(model, *, without: str = "") -> list:
    """A model's concrete fields for an INSERT: no primary key (and not `without`)."""
    return [f for f in model._meta.concrete_fields if not f.primary_key and f.attname != without]


_GROUP_INSERT_SQL: list[str] = []


def _group_insert_sql() -> str:
    """The statement of `_insert_group_taking_node_capacity`, built once from the models.

    The rows travel as ONE json parameter ([{"l": lease row, "e": event row}, ...]) and
    json_populate_record types each column from the table itself, so the statement text is the
    same for every batch size (psycopg and PostgreSQL parse it once) and no per-value quoting
    happens in Python."""
    if not _GROUP_INSERT_SQL:
        q = connection.ops.quote_name
        lease_cols = [q(f.column) for f in _insert_fields(Lease)]
        event_cols = [q(f.column) for f in _insert_fields(LeaseEvent, without="lease_id")]
        lease_t, event_t = Lease._meta.db_table, LeaseEvent._meta.db_table
        _GROUP_INSERT_SQL.append(
            f"WITH taken AS (UPDATE {Node._meta.db_table} SET "
            "cpu_millicores_reserved = cpu_millicores_reserved + %(cpu)s, "
            "memory_mib_reserved = memory_mib_reserved + %(mem)s, "
            "scratch_mib_reserved = scratch_mib_reserved + %(scratch)s "
            "WHERE id = %(node)s AND state = %(ready)s AND reachability = %(reachable)s "
            "AND cpu_millicores_reserved <= cpu_millicores_allocatable - %(cpu)s "
            "AND memory_mib_reserved <= memory_mib_allocatable - %(mem)s "
            "AND scratch_mib_reserved <= scratch_mib_allocatable - %(scratch)s RETURNING id), "
            f"src AS MATERIALIZED (SELECT nextval(pg_get_serial_sequence('{lease_t}', 'id')) "
            "AS id, d.o, d.doc FROM taken, "
            "json_array_elements(CAST(%(rows)s AS json)) WITH ORDINALITY AS d(doc, o)), "
            f"ins AS (INSERT INTO {lease_t} (id, {', '.join(lease_cols)}) "
            f"SELECT src.id, {', '.join('r.' + c for c in lease_cols)} FROM src, "
            f"json_populate_record(NULL::{lease_t}, src.doc -> 'l') AS r), "
            f"ev AS (INSERT INTO {event_t} ({', '.join(event_cols)}, {q('lease_id')}) "
            f"SELECT {', '.join('r.' + c for c in event_cols)}, src.id FROM src, "
            f"json_populate_record(NULL::{event_t}, src.doc -> 'e') AS r) "
            "SELECT id FROM src ORDER BY o"
        )
    return _GROUP_INSERT_SQL[0]


def _insert_group_taking_node_capacity(pairs: list[tuple[Lease, LeaseEvent]]) -> bool:
    """Leases on ONE node (their GPUs are taken afterwards) in one statement: one guarded node
    UPDATE for their sum, then the leases and their events, inserted only when it matched.
    False (nothing written) when the node no longer has room for all of them."""
    lease_fields = _insert_fields(Lease)
    event_fields = _insert_fields(LeaseEvent, without="lease_id")
    rows = [
        {
            "l": {f.column: getattr(lease, f.attname) for f in lease_fields},
            "e": {f.column: getattr(event, f.attname) for f in event_fields},
        }
        for lease, event in pairs
    ]
    params = {
        "cpu": sum(lease.cpu_millicores for lease, _ in pairs),
        "mem": sum(lease.memory_mib for lease, _ in pairs),
        "scratch": sum(lease.scratch_mib for lease, _ in pairs),
        "node": pairs[0][0].node_id,
        "ready": NodeState.READY.value,
        "reachable": Reachability.REACHABLE.value,
        # orjson writes datetimes as RFC 3339 with their microseconds (DjangoJSONEncoder would
        # cut them to milliseconds) and is ~5x faster than json.dumps here
        "rows": orjson.dumps(rows).decode(),
    }
    with connection.cursor() as cursor:
        cursor.execute(_group_insert_sql(), params)
        ids = [row[0] for row in cursor.fetchall()]
    if len(ids) != len(pairs):
        return False
    for (lease, event), pk in zip(pairs, ids, strict=True):
        lease.pk = pk
        lease._state.adding = False
        lease._state.db = "default"
        event.lease_id = pk
    return True


def _take_gpus(lease: Lease, *, allow_mixing: bool) -> None:
    """Guarded GPU increments, in GPU id order, after the node row. Raises _Conflict."""
    for alloc in lease.gpu_allocations:  # sorted by GPU id
        gpus = GpuDevice.objects.filter(pk=alloc["gpu"], node_id=lease.node_id, healthy=True)
        if alloc["mig_slots"]:
            mask = alloc["mig_slots"]
            updated = gpus.filter(
                Exact(F("mig_slots_used").bitand(mask), 0), mig_enabled=True
            ).update(mig_slots_used=F("mig_slots_used") + mask)
        elif alloc["milli"] >= 1000:
            updated = gpus.filter(milli_reserved=0, mig_enabled=False, mig_slots_used=0).update(
                milli_reserved=1000
            )
        else:
            milli = alloc["milli"]
            gpus = gpus.filter(milli_reserved__lte=1000 - milli, mig_enabled=False)
            if allow_mixing:
                updated = gpus.update(milli_reserved=F("milli_reserved") + milli)
            else:
                updated = gpus.filter(
                    Q(share_tenant__isnull=True) | Q(share_tenant_id=lease.tenant_id)
                ).update(milli_reserved=F("milli_reserved") + milli, share_tenant=lease.tenant_id)
        if not updated:
            raise _Conflict


def _return_capacity(lease: Lease) -> None:
    """Guarded decrements in the same lock order; a backfill holds nothing on the ledger."""
    if lease.backfill_of_id is not None:
        return
    cpu, mem, scratch = lease.cpu_millicores, lease.memory_mib, lease.scratch_mib
    updated = Node.objects.filter(
        pk=lease.node_id,
        cpu_millicores_reserved__gte=cpu,
        memory_mib_reserved__gte=mem,
        scratch_mib_reserved__gte=scratch,
    ).update(
        cpu_millicores_reserved=F("cpu_millicores_reserved") - cpu,
        memory_mib_reserved=F("memory_mib_reserved") - mem,
        scratch_mib_reserved=F("scratch_mib_reserved") - scratch,
    )
    if not updated:
        raise RuntimeError(f"ledger of node {lease.node_id} is below lease {lease.pk}")
    for alloc in sorted(lease.gpu_allocations, key=lambda a: a["gpu"]):
        gpus = GpuDevice.objects.filter(pk=alloc["gpu"])
        if alloc["mig_slots"]:
            mask = alloc["mig_slots"]
            updated = gpus.filter(Exact(F("mig_slots_used").bitand(mask), mask)).update(
                mig_slots_used=F("mig_slots_used") - mask
            )
        else:
            milli = alloc["milli"]
            updated = gpus.filter(milli_reserved__gte=milli).update(
                milli_reserved=F("milli_reserved") - milli,
                share_tenant=Case(
                    When(milli_reserved=milli, then=Value(None)), default=F("share_tenant")
                ),
            )
        if not updated:
            raise RuntimeError(f"ledger of GPU {alloc['gpu']} is below lease {lease.pk}")


# --- backfill --------------------------------------------------------------------------------


def _try_backfill(pool, tenant, req, request, actor, now, expires_at, job, idempotency_key):
    """Short work declared to end before a reservation's window may run on its held capacity."""
    candidates = list(
        Lease.objects.filter(
            pool=pool,
            state=S.RESERVED,
            window_start__gte=expires_at,
            backfill_of__isnull=True,
        ).order_by("window_start", "id")[:20]
    )
    if not candidates:
        return None
    policy = snap.pool_policy(pool)
    for parent in candidates:
        view = snap.reservation_view(parent)
        if view is None:
            continue
        result = place(req, [view], policy)
        if isinstance(result, core.Explanation):
            continue
        try:
            with transaction.atomic():
                locked = Lease.objects.select_for_update().get(pk=parent.pk)
                if locked.state != S.RESERVED or locked.window_start < expires_at:
                    continue
                fresh = snap.reservation_view(locked)
                if fresh is None or isinstance(place(req, [fresh], policy), core.Explanation):
                    continue
                by_index = {a["index"]: a for a in locked.gpu_allocations}
                allocations = sorted(
                    (
                        {
                            "gpu": by_index[d.index]["gpu"],
                            "index": d.index,
                            "milli": d.milli,
                            "mig_slots": 0,
                        }
                        for d in result.devices
                    ),
                    key=lambda a: a["gpu"],
                )
                # A backfill holds nothing on the node ledger: it runs inside its reservation.
                lease, event = _build_reserved(
                    pool=pool,
                    tenant=tenant,
                    request=request,
                    actor=actor,
                    placement=result,
                    node_id=locked.node_id,
                    allocations=allocations,
                    expires_at=expires_at,
                    window=None,
                    job=job,
                    idempotency_key=idempotency_key,
                    now=now,
                    attempts=1,
                    backfill_of=locked,
                )
                _save_with_event(lease, event)
                return lease
        except IntegrityError:
            if idempotency_key:
                return Lease.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
            raise
    return None


# --- lifecycle -------------------------------------------------------------------------------


def _fencing_check(token, now, *, allow_expired: bool = False):
    def check(obj: Lease):
        if int(token) != obj.fencing_token:
            raise TransitionRefused(
                "fencing_token_mismatch", "Stale fencing token: another attempt holds this lease."
            )
        if not allow_expired and obj.expires_at <= now:
            raise TransitionRefused("lease_expired", f"The lease expired at {obj.expires_at}.")

    return check


def lease_commit(*, lease: Lease, fencing_token, actor: Actor, now=None) -> Lease:
    """Startup began: reserved → committed. A reservation is claimed within its tolerance."""
    now = now or timezone.now()
    _authorize(lease, actor)
    token_check = _fencing_check(fencing_token, now)

    def check(obj: Lease):
        token_check(obj)
        if obj.window_start is not None and now < obj.window_start:
            raise TransitionRefused(
                "reservation_window_not_open",
                f"The reservation's window opens at {obj.window_start}.",
            )

    with transaction.atomic():
        lease = lease_transition(
            lease=lease,
            to=S.COMMITTED,
            actor=actor,
            reason=Reason.COMMITTED,
            now=now,
            check=check,
            changes={"committed_at": now},
        )
        if lease.window_start is not None:
            # The claim holds the capacity until the window's end, not longer.
            lease.expires_at = lease.window_end
            lease.save(update_fields=["expires_at"])
            _close_backfills(lease, actor, now)
    return lease


def _close_backfills(parent: Lease, actor: Actor, now) -> None:
    for child in parent.backfills.filter(state__in=HOLDING).order_by("id"):
        lease_transition(
            lease=child,
            to=S.EXPIRED,
            actor=actor,
            reason=Reason.BACKFILL_WINDOW_CLOSED,
            message=f"reservation {parent.pk} was claimed",
            now=now,
            changes={"ended_at": now},
        )


def lease_renew(*, lease: Lease, fencing_token, actor: Actor, duration, now=None) -> Lease:
    """Extend a live lease to now + duration (capped by its window or backfill deadline).
    A lease whose job has ended is not renewed (`job_ended`): it runs out."""
    from jobs.choices import TERMINAL as JOB_ENDED  # jobs import scheduling, not the reverse

    now = now or timezone.now()
    _authorize(lease, actor)
    duration = _as_timedelta(duration)
    if duration <= timedelta(0):
        raise TransitionRefused("invalid_duration", "A renewal lasts a positive duration.")
    with transaction.atomic():
        obj = (
            Lease.objects.select_for_update(of=("self",))
            .select_related("backfill_of", "job")
            .get(pk=lease.pk)
        )
        if obj.state not in (S.RESERVED, S.COMMITTED):
            raise TransitionRefused(
                "transition_not_allowed", f"A {obj.state} lease cannot be renewed."
            )
        _fencing_check(fencing_token, now)(obj)
        if obj.job is not None and obj.job.state in JOB_ENDED:
            raise TransitionRefused(
                "job_ended", f"Job {obj.job_id} is {obj.job.state}: its lease is not renewed."
            )
        cap = None
        if obj.window_start is not None:
            cap = obj.window_end if obj.state == S.COMMITTED else obj.expires_at
        if obj.backfill_of_id is not None:
            cap = obj.backfill_of.window_start
        wanted = now + duration
        new_expiry = min(wanted, cap) if cap else wanted
        if new_expiry <= obj.expires_at and cap is not None and wanted > cap:
            raise TransitionRefused(
                "hold_cap_reached", f"This lease cannot be held beyond {cap} (policy cap)."
            )
        previous = obj.expires_at
        obj.expires_at = max(new_expiry, obj.expires_at)
        obj.save(update_fields=["expires_at"])
        LeaseEvent.record(
            obj,
            actor=actor,
            from_state=obj.state,
            to_state=obj.state,
            reason=Reason.RENEWED,
            message=f"expires at {obj.expires_at:%Y-%m-%d %H:%M:%S}",
            at=now,
            data={"previous_expires_at": previous.isoformat()},
        )
    return obj


def _end(lease: Lease, *, to: str, actor: Actor, reason: str, message: str, now, check=None):
    """A transition out of HOLDING with the capacity returned in the same transaction."""
    with transaction.atomic():
        lease = lease_transition(
            lease=lease,
            to=to,
            actor=actor,
            reason=reason,
            message=message,
            now=now,
            check=check,
            changes={"ended_at": now},
        )
        _return_capacity(lease)
        if lease.window_start is not None:
            _close_backfills(lease, actor, now)
    return lease


def lease_release(*, lease: Lease, actor: Actor, reason: str, message: str = "", now=None):
    """Explicit and idempotent: releasing an ended lease returns it unchanged."""
    now = now or timezone.now()
    _authorize(lease, actor)
    with transaction.atomic():
        current = Lease.objects.select_for_update().get(pk=lease.pk)
        if current.state in TERMINAL:
            return current
        return _end(current, to=S.RELEASED, actor=actor, reason=reason, message=message, now=now)


def lease_mark_uncertain(*, lease: Lease, actor: Actor, now=None) -> Lease:
    """committed → uncertain: the node's agent stopped answering; capacity stays held."""
    now = now or timezone.now()
    return lease_transition(
        lease=lease,
        to=S.UNCERTAIN,
        actor=actor,
        reason=Reason.NODE_SILENT,
        now=now,
        changes={"uncertain_since": now},
    )


def lease_reconcile(*, lease: Lease, running: bool, actor: Actor, now=None) -> Lease:
    """uncertain → committed when the workload still runs, else released (capacity back)."""
    now = now or timezone.now()
    _authorize(lease, actor)
    if running:
        with transaction.atomic():
            current = Lease.objects.select_for_update().get(pk=lease.pk)
            expires_at = max(current.expires_at, now + settings.LEASE_DEFAULT_TTL)
            if current.window_end is not None:
                expires_at = min(expires_at, max(current.window_end, current.expires_at))
            return lease_transition(
                lease=current,
                to=S.COMMITTED,
                actor=actor,
                reason=Reason.RECONCILED_RUNNING,
                now=now,
                changes={"uncertain_since": None, "expires_at": expires_at},
            )
    return _end(
        lease,
        to=S.RELEASED,
        actor=actor,
        reason=Reason.RECONCILED_GONE,
        message="reconciliation found no running workload",
        now=now,
        check=_require_state(S.UNCERTAIN),
    )


def _require_state(state):
    def check(obj):
        if obj.state != state:
            raise TransitionRefused(
                "transition_not_allowed", f"Only a {state} lease can do this, not {obj.state}."
            )

    return check


def lease_report_usage(
    *,
    lease: Lease,
    actor: Actor,
    cpu_millicores: int,
    memory_mib: int,
    gpu_milli: int = 0,
    now=None,
) -> Lease:
    """The agent's measured consumption of a committed lease (accounting: held vs consumed),
    within what can be true, else ValidationError with field errors (400): CPU up to the
    node's raw CPU (a CPU request is a share, not a cap: a container may burst to the whole
    node), memory up to the lease's (the container's hard limit), GPU up to 1000 per device
    the lease holds (a time-sliced share may use its whole device while others idle)."""
    now = now or timezone.now()
    _authorize(lease, actor)
    bounds = {
        "cpu_millicores": (cpu_millicores, lease.node.cpu_millicores_raw, "the node's CPU"),
        "memory_mib": (memory_mib, lease.memory_mib, "the lease's memory"),
        "gpu_milli": (gpu_milli, 1000 * len(lease.gpu_allocations), "the lease's GPUs"),
    }
    errors = {
        field: f"Must be between 0 and {limit} ({what})."
        for field, (value, limit, what) in bounds.items()
        if not 0 <= value <= limit
    }
    if errors:
        raise ValidationError(errors)
    updated = Lease.objects.filter(pk=lease.pk, state=S.COMMITTED).update(
        used_cpu_millicores=cpu_millicores,
        used_memory_mib=memory_mib,
        used_gpu_milli=gpu_milli,
        usage_reported_at=now,
    )
    if not updated:
        raise TransitionRefused("transition_not_allowed", "Usage is reported on committed leases.")
    lease.refresh_from_db()
    return lease


# --- sweeps ----------------------------------------------------------------------------------


def _sweep(queryset, *, to: str, reason_for, actor: Actor, now, batch: int = 500) -> int:
    """Each lease in its own short transaction; SKIP LOCKED lets several sweepers share. A lease
    that fails is rolled back and recorded (`record_sweep_failure`); the others go on."""
    count = 0
    ids = list(queryset.order_by("id").values_list("id", flat=True)[:batch])
    for pk in ids:
        try:
            with transaction.atomic():
                lease = queryset.select_for_update(skip_locked=True).filter(pk=pk).first()
                if lease is None:
                    continue  # someone else ended it, or holds it right now
                _end(
                    lease,
                    to=to,
                    actor=actor,
                    reason=reason_for(lease),
                    message=f"swept at {now:%Y-%m-%d %H:%M:%S}",
                    now=now,
                )
        except Exception as error:
            record_sweep_failure(
                Lease, pk, event_model=LeaseEvent, actor=actor, error=error, now=now
            )
            continue
        count += 1
    return count


def expire_leases(*, now) -> int:
    """Reserved or committed leases past their expiry → expired, capacity returned."""
    due = Lease.objects.filter(state__in=(S.RESERVED, S.COMMITTED), expires_at__lte=now).exclude(
        state=S.RESERVED, window_start__isnull=False
    )
    return _sweep(
        due,
        to=S.EXPIRED,
        reason_for=lambda lease: (
            Reason.EXPIRED_UNCOMMITTED if lease.state == S.RESERVED else Reason.EXPIRED_NOT_RENEWED
        ),
        actor=Actor.system("lease-expiry"),
        now=now,
    )


def expire_uncertain(*, now, deadline) -> int:
    """Uncertain longer than `deadline` (a timedelta or seconds) → expired, capacity returned."""
    cutoff = now - _as_timedelta(deadline)
    due = Lease.objects.filter(state=S.UNCERTAIN, uncertain_since__lte=cutoff)
    return _sweep(
        due,
        to=S.EXPIRED,
        reason_for=lambda lease: Reason.UNCERTAIN_DEADLINE,
        actor=Actor.system("lease-uncertain"),
        now=now,
    )


def release_unclaimed_reservations(*, now) -> int:
    """Reservations not claimed within their tolerance → released with a reason."""
    due = Lease.objects.filter(state=S.RESERVED, window_start__isnull=False, expires_at__lte=now)
    return _sweep(
        due,
        to=S.RELEASED,
        reason_for=lambda lease: Reason.RESERVATION_UNCLAIMED,
        actor=Actor.system("reservations"),
        now=now,
    )


# --- the one transition helper ---------------------------------------------------------------


def lease_transition(
    *,
    lease: Lease,
    to: str,
    actor: Actor,
    reason: str,
    message: str = "",
    now=None,
    changes: dict | None = None,
    check=None,
    data: dict | None = None,
) -> Lease:
    return transition(
        Lease,
        lease.pk,
        to=to,
        allowed=LEASE_TRANSITIONS,
        event_model=LeaseEvent,
        actor=actor,
        reason=reason,
        message=message,
        now=now or timezone.now(),
        changes=changes,
        check=check,
        data=data,
    )
