"""The operators' console pages under /console/ops/: capacity, queue and fairness, placement
decisions, scheduler health, and a node's leases (a fragment of the node page, served here
because leases sit above nodes). Thin: reads in scheduling/selectors.py and health.py, chart
geometry in charts.py. Operators only: anyone else gets 403."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET

from jobs.models import Job
from leases.models import Lease
from leases.selectors import CAPACITY_MEASURES
from nodes.models import Node
from pools.actors import Actor
from pools.models import ComputePool

from . import charts, health, selectors

DIMENSION_LABELS = {
    "gpu_milli": "GPU (milli-GPU)",
    "cpu_millicores": "CPU (millicores)",
    "memory_mib": "Memory (MiB)",
    "scratch_mib": "Scratch (MiB)",
}
GROUP_LABELS = {"pool": "Pool", "class": "Shape class", "zone": "Failure domain (region/zone)"}


def operator_page(view):
    """Signed in (else to the login page), an operator (else 403), GET only."""

    @login_required
    @require_GET
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        actor = Actor.from_request(request)
        if not actor.is_operator:
            raise PermissionDenied("Only operators see the operations pages.")
        return view(request, actor, *args, **kwargs)

    return wrapper


def _choice(request, name: str, choices, default):
    """A query parameter that must be one of `choices`; None when it is not (→ 400)."""
    value = request.GET.get(name) or default
    return value if str(value) in {str(c) for c in choices} else None


def _pool(request, actor):
    pools = ComputePool.objects.visible_to(actor).order_by("slug")
    slug = request.GET.get("pool")
    pool = get_object_or_404(pools, slug=slug) if slug else pools.first()
    return pool, pools


@operator_page
def ops_index(request, actor):
    return redirect("ops-capacity")


@operator_page
def capacity(request, actor):
    dim = _choice(request, "dim", DIMENSION_LABELS, "gpu_milli")
    hours = _choice(request, "hours", health.WINDOWS, 1)
    if dim is None or hours is None:
        return HttpResponseBadRequest(
            f"dim must be one of {', '.join(DIMENSION_LABELS)}; hours one of 1, 24",
            content_type="text/plain",
        )
    hours = int(hours)
    pools = list(ComputePool.objects.visible_to(actor).order_by("slug"))
    breakdown = selectors.capacity_breakdown(actor, pools)
    groups = []
    for by, rows in breakdown.items():
        if by == "cell":  # pool × class × zone: the metric's grouping, not drawn here
            continue
        widest = max((t["allocatable"][dim] for t in rows.values()), default=0)
        groups.append(
            {
                "by": by,
                "label": GROUP_LABELS[by],
                "rows": [
                    {
                        "key": key,
                        "nodes": totals["nodes"],
                        "v": {m: totals[m][dim] for m in CAPACITY_MEASURES},
                        "bar": _capacity_bar(totals, dim, widest),
                        "used_w": totals["used"][dim] / widest * charts.WIDTH if widest else 0,
                    }
                    for key, totals in rows.items()
                ],
            }
        )
    trends = []
    for pool in pools:
        use = health.utilisation(pool, hours)
        use["pool"] = pool
        use["charts"] = [
            {
                "dim": DIMENSION_LABELS[d],
                **series,
                "requested_line": charts.line(series["requested"], top=100),
                "measured_line": charts.line(series["measured"], top=100),
            }
            for d, series in use["dimensions"].items()
        ]
        trends.append(use)
    context = {
        "groups": groups,
        "dim": dim,
        "dim_label": DIMENSION_LABELS[dim],
        "dimensions": DIMENSION_LABELS,
        "hours": hours,
        "trends": trends,
    }
    return render(request, "ops/capacity.html", context)


def _capacity_bar(totals: dict, dim: str, widest: float) -> list:
    """Allocatable split into reserved, free, fragmented (free but too small for any shape)
    and unavailable (draining, quarantined, unhealthy, not yet ready), scaled to the widest
    group so bars compare."""
    allocatable = totals["allocatable"][dim]
    reserved, free = totals["reserved"][dim], totals["free"][dim]
    fragmented = totals["fragmented"][dim]
    parts = [
        ("reserved", "seg-reserved", reserved),
        ("free", "seg-free", free - fragmented),
        ("fragmented", "seg-fragmented", fragmented),
        ("unavailable", "seg-unavailable", allocatable - reserved - free),
    ]
    return charts.stacked(parts, widest)


@operator_page
def queue(request, actor):
    pool, pools = _pool(request, actor)
    rows = selectors.fairness(pool) if pool else []
    for row in rows:
        row["share_bar"] = charts.stacked([("held", "seg-reserved", min(row["share"], 1.0))], 1.0)
        row["entitled_x"] = row["entitlement"] * charts.WIDTH
    return render(request, "ops/queue.html", {"pool": pool, "pools": pools, "rows": rows})


@operator_page
def lease_decision(request, actor, pk: int):
    lease = get_object_or_404(
        Lease.objects.visible_to(actor).select_related("pool", "tenant", "node", "job"), pk=pk
    )
    return render(request, "ops/decision.html", {"d": selectors.decision_of(lease)})


@operator_page
def job_decision(request, actor, pk: int):
    """A job's latest placement decision, or why it waits when it has none."""
    job = get_object_or_404(Job.objects.visible_to(actor).select_related("pool", "tenant"), pk=pk)
    lease = (
        Lease.objects.visible_to(actor)
        .filter(job=job)
        .select_related("pool", "tenant", "node", "job")
        .order_by("-created_at", "-id")
        .first()
    )
    if lease is not None:
        return redirect("ops-lease-decision", lease.pk)
    return render(request, "ops/decision.html", {"job": job, "d": None})


@operator_page
def scheduler_health(request, actor):
    hours = _choice(request, "hours", health.WINDOWS, 1)
    if hours is None:
        return HttpResponseBadRequest("hours must be 1 or 24", content_type="text/plain")
    hours = int(hours)
    pool, pools = _pool(request, actor)
    panels = []
    if pool is not None:
        passes = health.pass_series(pool, hours)
        expiries = health.expiry_series(pool, hours)
        for title, unit, values in (
            ("Pass duration (max)", "s", [p["max_s"] or 0 for p in passes]),
            ("Pass duration (mean)", "s", [p["mean_s"] or 0 for p in passes]),
            ("Placements per pass", "", [p["per_pass"] for p in passes]),
            ("Plan conflicts", "", [p["conflicts"] or 0 for p in passes]),
            ("Scheduling errors", "", [p["errors"] or 0 for p in passes]),
            ("Lease expiries", "", [e["expired"] for e in expiries]),
        ):
            panels.append({"title": title, "unit": unit, **charts.line(values)})
        total = {
            "passes": sum(p["passes"] for p in passes),
            "placed": sum(p["placed"] or 0 for p in passes),
            "expired": sum(e["expired"] for e in expiries),
            "phases": health.phase_means(pool, hours),
        }
    else:
        total = {}
    context = {"pool": pool, "pools": pools, "hours": hours, "panels": panels, "total": total}
    return render(request, "ops/health.html", context)


@operator_page
def node_leases(request, actor, pk: int):
    node = get_object_or_404(Node.objects.visible_to(actor), pk=pk)
    leases = selectors.node_leases(actor, node.pk)
    return render(request, "ops/_node_leases.html", {"node": node, "leases": leases})
