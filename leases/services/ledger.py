"""The ledger's one write: new leases take their capacity and are inserted, in one lock order.

The ledger (`Node.*_reserved`, `GpuDevice.milli_reserved`, `GpuDevice.mig_slots_used`) always
equals the sum of the HOLDING leases that are not backfills. It changes only by the guarded
UPDATEs of `capacity` (each guard stated once there), in the same transaction as the lease rows.

`apply(rows)` is every writer's way in: a single reserve is a batch of one, group commit a
batch of one process's concurrent reserves, the scheduling pass a batch of its whole plan
(rows built by `lease_rows.lease_row`). In one transaction, in this order — the lock order of
every writer, so there is no deadlock:

1. the quota rows of the rows' tenants locked in id order, and each tenant's headroom
   re-checked under those locks (`quota.recheck`): a refused row is dropped;
2. (`BEFORE_WRITES`)
3. per node, one guarded UPDATE for the sum of its rows, then the guarded GPU UPDATEs: a node
   another writer took meanwhile, or one no longer ready and reachable, takes nothing and its
   rows are conflicts. Rows of one group (a gang) are taken all or none: a group that lost a
   row takes nothing (a savepoint undoes what it wrote, and the rest is written again);
4. the leases and their events inserted (for a few rows, by the node UPDATE's own statement);
5. (`AFTER_INSERTS`)

A conflict means another writer took the capacity first: the caller re-plans (reserve) or
leaves the job queued with `plan_conflict` (the pass). Capacity goes back by
`capacity.return_capacity`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import transaction

from leases import backend
from nodes.push import push_assignments
from pools.statemachine import TransitionRefused

from . import capacity, lease_rows, quota
from .lease_rows import Row, Shared, copy_rows, gpu_allocations, lease_row

# the ledger's writers build their rows with lease_rows' builders, at hand here beside `apply`
__all__ = [
    "AFTER_INSERTS",
    "BEFORE_WRITES",
    "Applied",
    "Row",
    "Shared",
    "apply",
    "copy_rows",
    "gpu_allocations",
    "lease_row",
    "race_hook",
]

FUSED_MAX = 64  # rows inserted by the node UPDATE's own statement; more go by COPY


@dataclass(slots=True)
class Applied:
    """What `apply` did with each row: inserted (`taken`, `lease_id` set), refused by the quota
    re-check (with the refusal; a group mate of a refused row too), or a conflict (with the id
    of the node another writer took: the row's own, or a group mate's)."""

    taken: list[Row] = field(default_factory=list)
    refused: list[tuple[Row, TransitionRefused]] = field(default_factory=list)
    conflicts: list[tuple[Row, int]] = field(default_factory=list)


def apply(rows: list[Row]) -> Applied:
    """Take the capacity of `rows` and insert them, all in one transaction (the caller's, or
    its own), in the order of the module docstring. Under the quota rows' locks,
    `quota.recheck` re-checks the rows whose tenant has a quota or a credit account, backfills
    too: one takes no node capacity of its own, but its tenant's quota and credit count it."""
    applied = Applied()
    with transaction.atomic():
        rows = _checked(rows, applied)
        _fire(BEFORE_WRITES, rows)
        _take(rows, applied)
        _fire(AFTER_INSERTS, applied.taken)
        # the nodes of new leases of jobs (the pass's, both paths) are nudged once committed;
        # a bare reserve (the lease API's hot path) publishes nothing
        push_assignments({row.node_id for row in applied.taken if row.lease.get("job_id")})
    return applied


def _checked(rows: list[Row], applied: Applied) -> list[Row]:
    """Step 1: the rows left once the quota rows are locked and re-checked (a group whose row
    is refused is refused whole, with that row's refusal)."""
    pairs = {(row.tenant_id, row.shared.pool.pk) for row in rows}
    pairs = quota.pairs_with_quota(pairs) if pairs else set()
    if not pairs:
        return rows
    quota.lock_quotas(pairs)
    limited = [r for r in rows if (r.tenant_id, r.shared.pool.pk) in pairs]
    refused = quota.recheck(limited)
    if not refused:
        return rows
    by_group = {row.group: why for row, why in refused.items() if row.group is not None}
    kept = []
    for row in rows:
        why = refused.get(row)
        if why is None and row.group is not None:
            why = by_group.get(row.group)
        if why is None:
            kept.append(row)
        else:
            applied.refused.append((row, why))
    return kept


def _take(rows: list[Row], applied: Applied) -> None:
    """Steps 3 and 4: the capacity of the rows that hold some taken per node, all or none per
    group, redone without what failed until what is left took whole; then the inserts."""
    postgresql = backend.postgresql()
    fused = postgresql and len(rows) <= FUSED_MAX
    borrowers = [row for row in rows if not row.holds]
    candidates = [row for row in rows if row.holds]
    if postgresql:  # before any savepoint: rolling back to one keeps these locks
        capacity.lock(*capacity.parts(candidates))
    while True:
        batch, inserted, took = candidates + borrowers, [], set()
        nodes, gpus = capacity.parts(candidates)
        # a device, or a group mate's node, may fail after a node took: the attempt is undone
        undo = None
        if gpus or any(row.group is not None for row in candidates):
            undo = transaction.savepoint()
        if nodes or (fused and borrowers):
            took, inserted = capacity.take_nodes(list(nodes.values()), batch if fused else None)
        gpu_took = capacity.take_gpus([part for part in gpus.values() if part.node in took])
        # nodes that took their part but not every device's: written, so the attempt is undone
        half = {p.node for p in gpus.values() if p.node in took and p.gpu not in gpu_took}
        failed = (set(nodes) - took) | half
        lost = {r.group: r.node_id for r in candidates if r.node_id in failed}
        lost.pop(None, None)
        dropped = [r for r in candidates if r.node_id in failed or r.group in lost]
        if not dropped:
            break
        applied.conflicts += [(row, lost.get(row.group, row.node_id)) for row in dropped]
        gone = {id(row) for row in dropped}
        candidates = [row for row in candidates if id(row) not in gone]
        if not half and not any(row.node_id in took for row in dropped):
            break  # nothing was written for what is dropped
        transaction.savepoint_rollback(undo)  # and the rest is written again
    if undo is not None:
        transaction.savepoint_commit(undo)
    if fused:
        for position, lease_id in inserted:
            batch[position - 1].lease_id = lease_id
        applied.taken += [row for row in batch if row.lease_id is not None]
        return
    written = candidates + borrowers
    if written:
        (lease_rows.copy_insert if postgresql else lease_rows.orm_insert)(written)
    applied.taken += written


# --- the race hook (tests) -------------------------------------------------------------------

BEFORE_WRITES = "before_writes"  # quota rows locked and re-checked; no capacity taken yet
AFTER_INSERTS = "after_inserts"  # capacity taken, leases and events inserted; not committed
_HOOKS: dict[str, list[Callable]] = {BEFORE_WRITES: [], AFTER_INSERTS: []}
_running = threading.local()


@contextmanager
def race_hook(point: str, callback: Callable[[list[Row]], None]):
    """The one way a test makes a race happen inside a ledger write (docs/leases.md): while
    the context lasts, every `apply`, in whichever thread, calls `callback(rows)` inside its
    transaction at `point` — `BEFORE_WRITES` (with the rows about to take capacity; another
    writer may take it first here) or `AFTER_INSERTS` (with the rows inserted; the writer
    holds its locks until it commits). Writes the callback makes through the ledger itself
    (another writer, on this connection) call no hook."""
    _HOOKS[point].append(callback)
    try:
        yield
    finally:
        _HOOKS[point].remove(callback)


def _fire(point: str, rows: list[Row]) -> None:
    if not _HOOKS[point] or getattr(_running, "hook", False):
        return
    _running.hook = True
    try:
        for callback in list(_HOOKS[point]):
            callback(rows)
    finally:
        _running.hook = False
