"""Reads of leases and capacity: visibility, the ledger invariant, accounting."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, F, Q, Sum

from nodes.choices import NodeState, Reachability
from nodes.models import GpuDevice, Node
from placement import evaluate, make_context
from pools.models import CreditAccount, Quota, ResourceShape
from storage.selectors import disk_held_by_node

from . import snapshot as snap
from .choices import HOLDING, LeaseState
from .models import Lease
from .services import quota as quotas


def leases_visible_to(actor):
    """People: their tenants' leases (operators: all). A node's agent: its own node's."""
    leases = Lease.objects.visible_to(actor).select_related("pool", "tenant", "node")
    return leases.prefetch_related("reserved_jobs")  # a reservation's jobs, in one query


# --- the ledger invariant --------------------------------------------------------------------


def ledger_problems(pool=None) -> list[str]:
    """Every way the ledger differs from the live leases or exceeds allocatable; [] is healthy.

    Checked: per node CPU, memory and scratch (ledger == sum of HOLDING non-backfill leases, and
    for scratch the persistent volumes whose disk it still holds, and ≤ allocatable); per GPU
    milli (== sum, ≤ 1000) and MIG slots (== OR of the leases' masks,
    no two leases sharing a slot); backfills within their reservation.
    """
    nodes = Node.objects.all() if pool is None else Node.objects.filter(pool=pool)
    problems = []
    sums = defaultdict(lambda: [0, 0, 0])
    gpu_milli: dict[int, int] = defaultdict(int)
    gpu_mask: dict[int, int] = defaultdict(int)
    leases = Lease.objects.filter(state__in=HOLDING)
    if pool is not None:
        leases = leases.filter(pool=pool)
    children = defaultdict(list)
    for lease in leases.values(
        "id",
        "node_id",
        "cpu_millicores",
        "memory_mib",
        "scratch_mib",
        "gpu_allocations",
        "backfill_of_id",
    ):
        if lease["backfill_of_id"]:
            children[lease["backfill_of_id"]].append(lease)
            continue
        row = sums[lease["node_id"]]
        row[0] += lease["cpu_millicores"]
        row[1] += lease["memory_mib"]
        row[2] += lease["scratch_mib"]
        for alloc in lease["gpu_allocations"]:
            gpu_milli[alloc["gpu"]] += alloc["milli"]
            if alloc["mig_slots"] & gpu_mask[alloc["gpu"]]:
                problems.append(f"GPU {alloc['gpu']}: MIG slot held twice")
            gpu_mask[alloc["gpu"]] |= alloc["mig_slots"]
    volume_disk = disk_held_by_node()
    for node in nodes.values(
        "id",
        "name",
        "cpu_millicores_allocatable",
        "memory_mib_allocatable",
        "scratch_mib_allocatable",
        "cpu_millicores_reserved",
        "memory_mib_reserved",
        "scratch_mib_reserved",
    ):
        expected = list(sums.get(node["id"], [0, 0, 0]))
        expected[2] += volume_disk.get(node["id"], 0)  # persistent volumes hold disk too
        for i, dim in enumerate(("cpu_millicores", "memory_mib", "scratch_mib")):
            reserved = node[f"{dim}_reserved"]
            if reserved > node[f"{dim}_allocatable"]:
                problems.append(f"{node['name']}: {dim} overcommitted")
            if reserved != expected[i]:
                problems.append(f"{node['name']}: {dim} ledger {reserved} != leases {expected[i]}")
    for gpu in GpuDevice.objects.filter(node__in=nodes).values(
        "id", "milli_reserved", "mig_slots_used"
    ):
        if gpu["milli_reserved"] > 1000:
            problems.append(f"GPU {gpu['id']}: overcommitted")
        if gpu["milli_reserved"] != gpu_milli.get(gpu["id"], 0):
            problems.append(
                f"GPU {gpu['id']}: milli {gpu['milli_reserved']} != {gpu_milli.get(gpu['id'], 0)}"
            )
        if gpu["mig_slots_used"] != gpu_mask.get(gpu["id"], 0):
            problems.append(f"GPU {gpu['id']}: MIG slots differ from leases")
    if children:
        parents = Lease.objects.in_bulk(list(children))
        for parent_id, kids in children.items():
            parent = parents[parent_id]
            for dim in ("cpu_millicores", "memory_mib", "scratch_mib"):
                if sum(k[dim] for k in kids) > getattr(parent, dim):
                    problems.append(f"reservation {parent_id}: backfills exceed its {dim}")
    return problems


def overcommitted_nodes(pool=None) -> int:
    """Nodes where any dimension (CPU, memory, scratch, a GPU) holds more than allocatable."""
    nodes = Node.objects.all() if pool is None else Node.objects.filter(pool=pool)
    over = set(
        nodes.filter(
            Q(cpu_millicores_reserved__gt=F("cpu_millicores_allocatable"))
            | Q(memory_mib_reserved__gt=F("memory_mib_allocatable"))
            | Q(scratch_mib_reserved__gt=F("scratch_mib_allocatable"))
        ).values_list("id", flat=True)
    )
    over |= set(
        GpuDevice.objects.filter(node__in=nodes, milli_reserved__gt=1000).values_list(
            "node_id", flat=True
        )
    )
    return len(over)


# --- accounting ------------------------------------------------------------------------------


def tenant_accounting(tenant, pool=None) -> dict:
    """Capacity held (reserved/committed/uncertain) vs consumed (measured on running leases).
    A tenant's backfills count as its own (what a reservation lends is the borrower's use, and
    never the reservation owner's: its reservation counts once, as it holds)."""
    leases = Lease.objects.filter(tenant=tenant)
    if pool is not None:
        leases = leases.filter(pool=pool)
    holding = leases.filter(state__in=HOLDING)
    held = holding.aggregate(
        leases=Count("id"),
        cpu_millicores=Sum("cpu_millicores"),
        memory_mib=Sum("memory_mib"),
        scratch_mib=Sum("scratch_mib"),
    )
    held_gpu = sum(
        sum(a["milli"] for a in allocs)
        for allocs in holding.values_list("gpu_allocations", flat=True)
    )
    consumed = holding.filter(state=LeaseState.COMMITTED).aggregate(
        leases=Count("id", filter=Q(usage_reported_at__isnull=False)),
        cpu_millicores=Sum("used_cpu_millicores"),
        memory_mib=Sum("used_memory_mib"),
        gpu_milli=Sum("used_gpu_milli"),
    )
    return {
        "tenant": tenant.slug,
        "held": {k: v or 0 for k, v in held.items()} | {"gpu_milli": held_gpu},
        "consumed": {k: v or 0 for k, v in consumed.items()},
    }


# A node's amounts, and its flags (a flagged node's allocatable counts under the flag).
AMOUNTS = ("allocatable", "schedulable", "reserved", "used", "free", "fragmented")
FLAGS = ("draining", "unhealthy", "unreachable")
CAPACITY_MEASURES = AMOUNTS + FLAGS


def pool_capacity(pool) -> dict:
    """Per node and for the pool: allocatable, schedulable, reserved, used, free, fragmented,
    draining, unhealthy, unreachable. Schedulable = the allocatable of nodes new work can go to:
    ready (neither draining nor quarantined) and reachable; free counts only on those.
    Fragmented = free capacity on a schedulable node where no catalogue shape of the pool fits
    any more (free, but in pieces no queued shape can use)."""
    shapes = [snap.core_request(s.as_request()) for s in ResourceShape.objects.filter(pool=pool)]
    view = snap.all_nodes_snapshot(pool.pk)
    policy = snap.pool_policy(pool)
    ctx = make_context(view.nodes, policy)
    used = {
        row["node_id"]: row
        for row in Lease.objects.filter(
            node__pool=pool, state=LeaseState.COMMITTED, backfill_of__isnull=True
        )
        .values("node_id")
        .annotate(
            cpu=Sum("used_cpu_millicores"),
            memory=Sum("used_memory_mib"),
            gpu_milli=Sum("used_gpu_milli"),
        )
    }
    unreachable = set(
        Node.objects.filter(pool=pool, reachability=Reachability.UNREACHABLE).values_list(
            "name", flat=True
        )
    )
    dims = ("cpu_millicores", "memory_mib", "scratch_mib", "gpu_milli")
    totals = {k: dict.fromkeys(dims, 0) for k in CAPACITY_MEASURES}
    nodes = []
    for node in view.nodes:
        node_id = view.node_ids[node.name]
        gpu_total = 1000 * len(node.gpus)
        allocatable = {
            "cpu_millicores": node.cpu_millicores,
            "memory_mib": node.memory_mib,
            "scratch_mib": node.scratch_mib,
            "gpu_milli": gpu_total,
        }
        free = {
            "cpu_millicores": node.free_cpu_millicores,
            "memory_mib": node.free_memory_mib,
            "scratch_mib": node.free_scratch_mib,
            "gpu_milli": node.free_gpu_milli,
        }
        reserved = {k: allocatable[k] - free[k] for k in dims}
        u = used.get(node_id, {})
        used_row = {
            "cpu_millicores": u.get("cpu") or 0,
            "memory_mib": u.get("memory") or 0,
            "scratch_mib": 0,
            "gpu_milli": u.get("gpu_milli") or 0,
        }
        unhealthy = node.state == NodeState.QUARANTINED or any(not g.healthy for g in node.gpus)
        reachable = node.name not in unreachable
        # new work can go here: ready (so neither draining nor quarantined) and heard from
        schedulable = node.state == NodeState.READY and reachable
        fragmented = dict.fromkeys(dims, 0)
        if schedulable and shapes and any(free.values()):
            fits = any(isinstance(evaluate(shape, node, ctx), tuple) for shape in shapes)
            if not fits:
                fragmented = dict(free)
        row = {
            "node": node.name,
            "state": node.state,
            "allocatable": allocatable,
            "schedulable": allocatable if schedulable else dict.fromkeys(dims, 0),
            "reserved": reserved,
            "used": used_row,
            "free": free if schedulable else dict.fromkeys(dims, 0),
            "fragmented": fragmented,
            "draining": node.state == NodeState.DRAINING,
            "unhealthy": unhealthy,
            "unreachable": not reachable,
        }
        nodes.append(row)
        for key in AMOUNTS:
            for dim in dims:
                totals[key][dim] += row[key][dim]
        for flag in FLAGS:
            if row[flag]:
                for dim in dims:
                    totals[flag][dim] += allocatable[dim]
    return {"pool": pool.slug, "nodes": nodes, "totals": totals}


# --- quotas and credit, as people see them -----------------------------------------------------


def quota_rows(actor, now, pairs_limit: int | None = None) -> list[dict]:
    """Each (tenant, pool) with a quota or a credit account the actor sees, in (tenant, pool)
    slug order: the period, each dimension's limit (None: unlimited) and what is used of it
    now (the ledger's own count), and the credit balance (None: not credit-limited). The one
    read behind `GET /api/v1/quotas/` and the console's quota bars."""
    limits = {
        (q.tenant.slug, q.pool.slug): q
        for q in Quota.objects.visible_to(actor).select_related("tenant", "pool")
    }
    accounts = {
        (a.tenant.slug, a.pool.slug): a
        for a in CreditAccount.objects.visible_to(actor).select_related("tenant", "pool")
    }
    keys = sorted(set(limits) | set(accounts))[:pairs_limit]
    owners = {key: limits.get(key) or accounts[key] for key in keys}
    ids = {key: (owner.tenant_id, owner.pool_id) for key, owner in owners.items()}
    used = quotas.usage({ids[key]: limits.get(key) for key in keys}, now, every=True)
    rows = []
    for key in keys:
        quota, account, owner = limits.get(key), accounts.get(key), owners[key]
        days = quota.period_days if quota else 30
        start, end = quotas.quota_period(days, now)
        caps = quotas.quota_limits(quota)
        rows.append(
            {
                "tenant": owner.tenant,
                "pool": owner.pool,
                "period_days": days,
                "period_start": start,
                "period_end": end,
                "dimensions": {
                    name: {"limit": caps[name], "used": round(used[ids[key]][name], 4)}
                    for name in quotas.DIMENSIONS
                },
                "account": account,
                "balance": account.balance if account else None,
            }
        )
    return rows
