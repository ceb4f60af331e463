"""Reserve: a snapshot read without locks → the pure core places → the ledger's one write
(`ledger.apply`, a batch of one): quota re-checked, capacity taken by guarded UPDATEs, the
lease and its event inserted, in one short transaction.

A guarded write that matches 0 rows means another writer took the capacity first: nothing is
written and the request is re-planned on a fresh snapshot, a bounded number of times. The
database CHECK constraints are the last line of defence; an IntegrityError from them is a
retry, never a 500. Concurrent plain reserves are combined (`group_commit`); what does not
fit now may run inside a reservation's hold (`backfill`), else the refusal explains why.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta

from django.db import IntegrityError
from django.utils import timezone

from leases import snapshot as snap
from leases.explain import IdempotencyKeyReused, NeverFits, NoCapacity, explanation_dict
from leases.models import Lease
from leases.window import Window, as_timedelta, request_digest
from placement import make_context, place
from placement import types as core
from placement.mig import carvable
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.statemachine import TransitionRefused

from . import group_commit, ledger
from .backfill import try_backfill

MAX_ATTEMPTS = 6  # plans per reserve; after 2 conflicts the choice among fitting nodes is random

# The scheduling pass reserves with keys `job-<id>-attempt-<n>` (scheduling/passes.py). Clients
# may not use keys with this prefix (the API answers 400), or a tenant could pre-claim the key
# of its own job's next placement and have the job "placed" on a lease of its choosing.
SCHEDULER_KEY_PREFIX = "job-"


def _replayed(lease: Lease, digest: str) -> Lease:
    """The lease an earlier reserve with the same key made, if it asked the same (`digest`;
    "" when no key was given). Leases keyed before digests were stored are returned as is."""
    if digest and lease.idempotency_digest and lease.idempotency_digest != digest:
        raise IdempotencyKeyReused(
            f"Idempotency key {lease.idempotency_key!r} was used for lease {lease.pk}, "
            "which asked for something else; use a new key for a new request."
        )
    return lease


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
    TransitionRefused("quota_exceeded" (with its dimension) | "credit_exhausted" |
    "reservation_*") when policy refuses.
    """
    now = now or timezone.now()
    duration = as_timedelta(duration)
    window = Window.coerce(window)
    digest = request_digest(pool, request, window or duration) if idempotency_key else ""
    if idempotency_key:
        existing = Lease.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replayed(existing, digest)
    if duration <= timedelta(0):
        raise TransitionRefused("invalid_duration", "A lease lasts a positive duration.")
    expires_at = now + duration
    if window is not None:
        expires_at = _check_window(pool, window, now)
    # a job is placed only where its image's architectures run (image_arch filter)
    req = snap.core_request(request, tenant.pk, getattr(job, "image_platforms", ()))
    if job is not None and "@" in (job.image or ""):
        # a job's pinned digest: nodes whose agent has it cached are preferred (warm_image)
        req = replace(req, image=job.image.rsplit("@", 1)[1])
    if job is not None and (inputs := snap.input_keys(getattr(job, "inputs", None))):
        req = replace(req, inputs=inputs)  # data_locality: nodes that cache them preferred
    policy = snap.pool_policy(pool)
    conflicts = first_attempt = 0
    # a drain-exempt request (a volume's export) is rare: placed here, on its own snapshot
    if window is None and not idempotency_key and not req.drain_exempt and group_commit.enabled():
        outcome = group_commit.submit(
            group_commit.Pending(pool, tenant, request, actor, req, policy, expires_at, job, now)
        )
        if isinstance(outcome, Lease):
            return outcome
        if isinstance(outcome, Exception):
            raise outcome
        # RETRY_CONFLICT: re-plan here on a fresh snapshot; RETRY_ALONE: nothing fit in the
        # batch (or the batch failed): the ordinary path explains, backfills or retries.
        if outcome is group_commit.RETRY_CONFLICT:
            conflicts = first_attempt = 1
    shared = ledger.Shared(pool=pool, actor=actor, now=now, expires_at=expires_at)
    for attempt in range(first_attempt, MAX_ATTEMPTS):
        view = snap.pool_snapshot(
            pool.pk,
            leases=False,
            work=snap.needs_work(req, policy),
            zone_work=snap.needs_zone_work(req),
            data_keys=snap.data_keys_of((req,)),
            draining=snap.draining_pins((req,)),
        )
        chosen_policy = policy
        if attempt >= 2:  # spread: pick at random among the nodes that fit
            chosen_policy = replace(policy, weights={"random": 1.0})
        ctx = make_context(view.nodes, chosen_policy, rng=random.Random())
        result = place(req, view.nodes, chosen_policy, ctx)
        if isinstance(result, core.Explanation):
            if window is None:
                lease = try_backfill(
                    pool, tenant, req, request, actor, now, expires_at, job, idempotency_key
                )
                if lease is not None:
                    return _replayed(lease, digest)  # another request may have won the key
            raise _refusal(pool, req, policy, result, conflicts)
        node_id = view.node_ids[result.node]
        row = ledger.lease_row(
            shared,
            tenant_id=tenant.pk,
            request=request,
            placement=result,
            node_id=node_id,
            allocations=ledger.gpu_allocations(result, view, node_id),
            job_id=job.pk if job is not None else None,
            idempotency_key=idempotency_key,
            digest=digest,
            window=window,
            attempts=attempt + 1,
        )
        try:
            applied = ledger.apply([row])  # a batch of one
        except IntegrityError:
            if idempotency_key:
                existing = Lease.objects.filter(
                    tenant=tenant, idempotency_key=idempotency_key
                ).first()
                if existing is not None:
                    return _replayed(existing, digest)
            conflicts += 1
            continue
        if applied.refused:
            raise applied.refused[0][1]
        if applied.taken:
            return row.instance(tenant=tenant, job=job)
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


# --- refusals --------------------------------------------------------------------------------


def check_ever_fits(*, pool, tenant, request: dict, image_platforms=(), gang=None) -> None:
    """Raises NeverFits (422) when no node of the pool could ever hold `request` (see
    `_never_fits`): job submission refuses such a job instead of queueing it forever. With
    `gang` ({size, topology}): when the gang could never be placed whole, `size` members of
    this one's request (a gang's members ask alike, or wait with `gang_mismatch`)."""
    req = snap.core_request(request, tenant.pk, image_platforms)
    if gang:
        req = replace(req, replicas=gang["size"], gang=gang["topology"])
    refusal = _never_fits(pool, req, snap.pool_policy(pool))
    if refusal is not None:
        raise refusal


def explain_request(*, pool, tenant, request: dict, image_platforms=()) -> dict:
    """What the scheduler would answer for `request` now, without reserving anything: where it
    would go, with the score breakdown, or why not (the same reasons a reserve gives; a request
    that can never fit says so). Read-only: one snapshot, no locks."""
    req = snap.core_request(request, tenant.pk, image_platforms)
    policy = snap.pool_policy(pool)
    result = place(req, snap.pool_snapshot(pool.pk).nodes, policy)
    if isinstance(result, core.Placement):
        return {
            "fits_now": True,
            "node": result.node,
            "score": result.score,
            "score_breakdown": dict(result.score_breakdown),
            "policy_version": policy.version,
        }
    refusal = _refusal(pool, req, policy, result, conflicts=0)
    return {"fits_now": False, "never_fits": isinstance(refusal, NeverFits), **refusal.explanation}


def _never_fits(pool, req, policy, conflicts: int = 0) -> NeverFits | None:
    """The one definition of "never fits": no node of the pool that is not retired, viewed
    ready and empty, could hold the request. A pool without any node yet is "not now" (409):
    capacity may still be enrolled."""
    empty = snap.registered_empty(pool.pk)
    nodes = empty.nodes
    if req.sharing == core.MIG and nodes and knobs_for(pool).mig_reconfiguration:
        nodes = carvable(nodes)  # the layout plan carves what waits (scheduling/mig_plan.py)
    ever = place(req, nodes, policy) if nodes else None
    if isinstance(ever, core.Explanation):
        return NeverFits(explanation_dict(ever, conflicts=conflicts))
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
    return NoCapacity(explanation_dict(explanation, conflicts=conflicts))


def _check_window(pool, window: Window, now) -> datetime:
    knobs = knobs_for(pool)
    if window.end <= window.start:
        raise TransitionRefused("reservation_window_invalid", "The window ends before it starts.")
    if window.start < now:
        raise TransitionRefused("reservation_window_invalid", "The window starts in the past.")
    if (window.start - now).total_seconds() > knobs.reservation_max_horizon_s:
        raise TransitionRefused(
            "reservation_horizon_exceeded",
            f"Windows may start at most {knobs.reservation_max_horizon_s} s ahead.",
        )
    if (window.end - window.start).total_seconds() > knobs.reservation_max_hold_s:
        raise TransitionRefused(
            "reservation_hold_exceeded",
            f"Windows may last at most {knobs.reservation_max_hold_s} s.",
        )
    if window.tolerance.total_seconds() > knobs.reservation_max_tolerance_s:
        raise TransitionRefused(
            "reservation_tolerance_exceeded",
            f"Tolerance may be at most {knobs.reservation_max_tolerance_s} s.",
        )
    return min(window.start + window.tolerance, window.end)
