"""Reads for the operators' console pages (scheduling/views.py): capacity by pool, shape class
and zone; each tenant's fair-share standing and waiting work; a placement's decision record.
Every read starts from `visible_to(actor)`; the pages are for operators only."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, F
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from leases.choices import HOLDING
from leases.models import Lease
from leases.selectors import AMOUNTS, CAPACITY_MEASURES, FLAGS, pool_capacity
from nodes.models import Node
from placement.queue import RESOURCES, dominant_share
from pools.models import Tenant
from scheduling import fairshare

DIMENSIONS = ("cpu_millicores", "memory_mib", "scratch_mib", "gpu_milli")
CPU_ONLY = "CPU only"


def shape_class(gpus) -> str:
    """A node's shape class: its GPU count, model and sharing mode ("4 × NVIDIA H100 80GB HBM3,
    mig"), or CPU only. Work of one class cannot use another's capacity: each is charted apart."""
    if not gpus:
        return CPU_ONLY
    models = sorted({g.model for g in gpus})
    sharing = sorted({"mig" if g.mig_enabled else g.sharing_mode for g in gpus})
    return f"{len(gpus)} × {' / '.join(models)}, {' / '.join(sharing)}"


def _zero() -> dict:
    return {m: dict.fromkeys(DIMENSIONS, 0) for m in CAPACITY_MEASURES} | {"nodes": 0}


def capacity_breakdown(actor, pools) -> dict:
    """The ledger's capacity (`leases.selectors.pool_capacity`, per node) summed by pool, by
    shape class, by failure domain (region/zone), and by all three at once ("cell", keyed by
    (pool, class, zone): what the `computepool_capacity` metric exposes): {"pool": {name:
    totals}, "class": …, "zone": …, "cell": …}, each totals {measure: {dimension: amount},
    "nodes": n}."""
    groups = {by: defaultdict(_zero) for by in ("pool", "class", "zone", "cell")}
    for pool in pools:
        where = {
            node.name: node
            for node in Node.objects.visible_to(actor)
            .filter(pool=pool)
            .only("name", "region", "zone")
            .prefetch_related("gpus")
        }
        for row in pool_capacity(pool)["nodes"]:
            node = where.get(row["node"])
            if node is None:
                continue
            zone = "/".join(p for p in (node.region, node.zone) if p) or "no zone"
            keys = {"pool": pool.slug, "class": shape_class(node.gpus.all()), "zone": zone}
            keys["cell"] = (keys["pool"], keys["class"], zone)
            for by, key in keys.items():
                totals = groups[by][key]
                totals["nodes"] += 1
                for measure in AMOUNTS:
                    for dim in DIMENSIONS:
                        totals[measure][dim] += row[measure][dim]
                for flag in FLAGS:
                    if row[flag]:
                        for dim in DIMENSIONS:
                            totals[flag][dim] += row["allocatable"][dim]
    return {by: dict(sorted(rows.items())) for by, rows in groups.items()}


def fairness(pool, now=None) -> list[dict]:
    """Each tenant holding capacity in the pool or waiting in its queue: its dominant share of
    the pool now and of its decayed past use, against its entitlement (its weight over the
    weights of the tenants present), and its queued jobs counted by pending reason code."""
    now = now or timezone.now()
    waiting = defaultdict(dict)
    rows = (
        Job.objects.filter(pool=pool, state=JobState.QUEUED)
        .values("tenant_id", "pending_reason__code")
        .annotate(n=Count("id"))
    )
    for row in rows:
        code = row["pending_reason__code"] or "not yet considered"
        waiting[row["tenant_id"]][code] = row["n"]
    holders = set(
        Lease.objects.filter(pool=pool, state__in=HOLDING).values_list("tenant_id", flat=True)
    )
    tenant_ids = holders | set(waiting)
    if not tenant_ids:
        return []
    standings = fairshare.standings(pool.pk, tenant_ids, now)
    capacity = fairshare.pool_capacity(pool.pk)
    total_weight = sum(s.weight for s in standings.values()) or 1.0
    names = dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "slug"))
    result = []
    for tenant_id, standing in standings.items():
        share = dominant_share(standing.held, capacity)
        entitled = standing.weight / total_weight
        result.append(
            {
                "tenant": names.get(tenant_id, tenant_id),
                "weight": standing.weight,
                "held": dict(zip(RESOURCES, standing.held, strict=True)),
                "share": share,
                "usage_share": dominant_share(standing.usage, capacity),
                "entitlement": entitled,
                "ratio": share / entitled if entitled else 0.0,
                "waiting": dict(sorted(waiting.get(tenant_id, {}).items())),
                "waiting_total": sum(waiting.get(tenant_id, {}).values()),
            }
        )
    return sorted(result, key=lambda r: (-r["share"], str(r["tenant"])))


def decision_of(lease: Lease) -> dict:
    """A lease's placement as the scheduler recorded it: node, score and its breakdown, grants,
    policy, and — when the batch pass placed it — the decision record (nodes considered,
    rejections by reason, the top candidates with their score breakdowns, the chosen node)."""
    placement = dict(lease.placement or {})
    decision = placement.pop("decision", None) or {}
    candidates = decision.get("candidates", [])
    terms = sorted({term for c in candidates for term in c.get("breakdown", {})})
    return {
        "lease": lease,
        "placement": placement,
        "policy_version": decision.get("policy_version", lease.policy_version),
        "nodes": decision.get("nodes"),
        "rejected": decision.get("rejected", {}),
        "rejected_total": sum(decision.get("rejected", {}).values()),
        "candidates": candidates,
        "terms": terms,
        "chosen": decision.get("chosen", placement.get("node", "")),
        "has_record": bool(decision),
    }


def node_leases(actor, node_id: int, limit: int = 50):
    """A node's leases, holding ones first, then the latest ended ones."""
    return list(
        Lease.objects.visible_to(actor)
        .filter(node_id=node_id)
        .select_related("tenant", "job")
        .order_by(F("ended_at").desc(nulls_first=True), "-created_at", "-id")[:limit]
    )
