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
from django.utils import timezone
from django.views.decorators.http import require_GET

from jobs.models import Job
from leases.choices import HOLDING
from leases.models import Lease
from leases.selectors import CAPACITY_MEASURES
from nodes.models import Node
from pools.actors import Actor
from pools.models import ComputePool

from . import charts, health, queue_selectors, selectors

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


def _range(request):
    """The chart range of ?range= (15m, 1h, 6h, 24h, 7d; or the first pages' ?hours=1|24);
    None when it is none of them (→ 400)."""
    value = request.GET.get("range") or request.GET.get("hours") or health.DEFAULT_RANGE
    try:
        return health.as_range(value)
    except KeyError:
        return None


RANGE_ERROR = "range must be one of " + ", ".join(health.RANGES)
REFRESH_S = 30  # the charts' polling


def _default_dim(pools_totals) -> str:
    """The resource the fleet has: GPUs where it has any, else CPU."""
    gpus = sum(t["allocatable"]["gpu_milli"] for t in pools_totals)
    return "gpu_milli" if gpus else "cpu_millicores"


def _utilisation_chart(pool, dim, rng) -> dict | None:
    use = health.utilisation(pool, rng)
    series = use["dimensions"].get(dim)
    chart, summary = None, ""
    if series:
        chart = charts.timeseries(
            series["points"],
            [("requested", "Requested", "requested"), ("measured", "Measured", "measured")],
            unit="%",
            floor=100,
        )
        f = charts.fmt
        summary = (
            f"requested peak {f(series['requested_peak'], '%')}, "
            f"average {f(series['requested_average'], '%')}; "
            f"measured peak {f(series['measured_peak'], '%')}, "
            f"average {f(series['measured_average'], '%')}"
        )
    return {
        "pool": pool,
        "use": use,
        "chart": chart,
        "summary": summary,
        "id": f"trend-{pool.pk}",
        "title": f"{DIMENSION_LABELS[dim]} utilisation of {pool.slug}",
    }


@operator_page
def capacity(request, actor):
    rng = _range(request)
    if rng is None:
        return HttpResponseBadRequest(RANGE_ERROR, content_type="text/plain")
    pools = list(ComputePool.objects.visible_to(actor).order_by("slug"))
    breakdown = selectors.capacity_breakdown(actor, pools)
    dim = _choice(request, "dim", DIMENSION_LABELS, _default_dim(breakdown["pool"].values()))
    if dim is None:
        return HttpResponseBadRequest(
            f"dim must be one of {', '.join(DIMENSION_LABELS)}", content_type="text/plain"
        )
    trends = [_utilisation_chart(pool, dim, rng) for pool in pools]
    context = {
        "dim": dim,
        "dim_label": DIMENSION_LABELS[dim],
        "dimensions": DIMENSION_LABELS,
        "range": rng,
        "ranges": health.RANGES.values(),
        "trends": trends,
        "refresh_s": REFRESH_S,
    }
    if request.htmx and request.GET.get("part") == "trends":
        return render(request, "ops/_capacity_trends.html", context)
    groups = []
    for by, rows in breakdown.items():
        if by == "cell":  # pool × class × zone: the metric's grouping, not drawn here
            continue
        widest = max((t["allocatable"][dim] for t in rows.values()), default=0)
        groups.append(
            {
                "by": by,
                "label": GROUP_LABELS[by],
                "rows": [_capacity_row(key, totals, dim, widest) for key, totals in rows.items()],
            }
        )
    context["groups"] = groups
    return render(request, "ops/capacity.html", context)


def _capacity_row(key, totals: dict, dim: str, widest: float) -> dict:
    v = {m: totals[m][dim] for m in CAPACITY_MEASURES}
    schedulable = v["schedulable"]
    v["unavailable"] = v["allocatable"] - schedulable
    v["requested"] = schedulable - v["free"]  # held on schedulable nodes
    return {
        "key": key,
        "nodes": totals["nodes"],
        "v": v,
        "requested_pct": 100 * v["requested"] / schedulable if schedulable else None,
        "bar": _capacity_bar(totals, dim, widest),
        "used_w": min(v["used"], widest) / widest * charts.WIDTH if widest else 0,
    }


def _capacity_bar(totals: dict, dim: str, widest: float) -> list:
    """Allocatable split into reserved (on schedulable nodes), free, fragmented (free but too
    small for any shape) and unavailable (grey: not schedulable — not ready, draining,
    quarantined or unreachable — whatever it holds), scaled to the widest group so bars
    compare."""
    allocatable, schedulable = totals["allocatable"][dim], totals["schedulable"][dim]
    free, fragmented = totals["free"][dim], totals["fragmented"][dim]
    parts = [
        ("reserved", "seg-reserved", schedulable - free),
        ("free", "seg-free", free - fragmented),
        ("fragmented", "seg-fragmented", fragmented),
        ("unavailable", "seg-unavailable", allocatable - schedulable),
    ]
    return charts.stacked(parts, widest)


def _depth_chart(depth) -> dict | None:
    """The queue depth over the last hour as a time series with axes (jobs queued, and those
    waiting for capacity), or None without samples."""
    if not depth:
        return None
    chart = charts.timeseries(
        depth,
        [("queued", "Queued", "current"), ("backlog", "Waiting for capacity", "used")],
        unit="jobs",
        floor=5,
        ticks=5,  # whole jobs on the y axis: its top is 5, 10, 20, 25, 50 … jobs
    )
    queued = [d["queued"] for d in depth]
    summary = (
        f"last {charts.fmt(queued[-1], 'jobs')}, peak {charts.fmt(max(queued), 'jobs')}; "
        f"waiting for capacity now {charts.fmt(depth[-1]['backlog'], 'jobs')}"
    )
    return {"chart": chart, "summary": summary}


@operator_page
def queue(request, actor):
    """The pool's queue in the scheduler's order, its health conditions, its depth over the
    last hour, and each tenant's fair-share standing."""
    pool, pools = _pool(request, actor)
    rows = selectors.fairness(pool) if pool else []
    for row in rows:
        row["share_bar"] = charts.stacked([("held", "seg-reserved", min(row["share"], 1.0))], 1.0)
        row["entitled_x"] = row["entitlement"] * charts.WIDTH
    context = {"pool": pool, "pools": pools, "rows": rows}
    if pool is not None:
        depth = queue_selectors.queue_depth(pool, 1)
        context |= {
            "queue": queue_selectors.pool_queue(pool),
            "health": queue_selectors.pool_conditions(pool, actor),
            "depth": depth,
            "depth_chart": _depth_chart(depth),
        }
    return render(request, "ops/queue.html", context)


@login_required
@require_GET
def tenant_queue(request):
    """A tenant's view of a pool's queue: its own queued jobs in the scheduler's order, other
    tenants' work only as a count per priority class."""
    actor = Actor.from_request(request)
    pool, pools = _pool(request, actor)
    view = queue_selectors.tenant_queue(pool, actor) if pool is not None else None
    return render(request, "console/queue.html", {"pool": pool, "pools": pools, "q": view})


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


HEALTH_PANELS = (  # title, unit, the pass series' key (or the expiries')
    ("Pass duration (max)", "s", "max_s"),
    ("Pass duration (mean)", "s", "mean_s"),
    ("Passes", "", "passes"),
    ("Placements per pass", "", "per_pass"),
    ("Plan conflicts", "", "conflicts"),
    ("Scheduling errors", "", "errors"),
    ("Lease expiries", "", "expired"),
)


@operator_page
def scheduler_health(request, actor):
    rng = _range(request)
    if rng is None:
        return HttpResponseBadRequest(RANGE_ERROR, content_type="text/plain")
    pool, pools = _pool(request, actor)
    panels = []
    if pool is not None:
        passes = health.pass_series(pool, rng)
        expiries = health.expiry_series(pool, rng)
        for p, e in zip(passes, expiries, strict=True):
            p["expired"] = e["expired"]
        for i, (title, unit, key) in enumerate(HEALTH_PANELS):
            values = [p[key] or 0 for p in passes]
            chart = charts.timeseries(
                [{"at": p["at"], "value": p[key] or 0} for p in passes],
                [("value", title, "current")],
                unit=unit,
            )
            summary = f"last {charts.fmt(values[-1], unit)}, peak {charts.fmt(max(values), unit)}"
            panels.append(
                {"id": f"h-chart-{i}", "title": title, "chart": chart, "summary": summary}
            )
        total = {
            "passes": sum(p["passes"] for p in passes),
            "placed": sum(p["placed"] or 0 for p in passes),
            "expired": sum(e["expired"] for e in expiries),
            "phases": health.phase_means(pool, rng),
        }
    else:
        total = {}
    context = {
        "pool": pool,
        "pools": pools,
        "range": rng,
        "ranges": health.RANGES.values(),
        "panels": panels,
        "total": total,
        "refresh_s": REFRESH_S,
    }
    if request.htmx and request.GET.get("part") == "charts":
        return render(request, "ops/_health_charts.html", context)
    return render(request, "ops/health.html", context)


@operator_page
def node_leases(request, actor, pk: int):
    """A node's leases (with each one's measured use), and a draining node's progress: the
    leases left and its deadline."""
    node = get_object_or_404(Node.objects.visible_to(actor), pk=pk)
    leases = selectors.node_leases(actor, node.pk)
    holding = [lease for lease in leases if lease.state in HOLDING]
    context = {"node": node, "leases": leases, "left": len(holding), "now": timezone.now()}
    return render(request, "ops/_node_leases.html", context)


NODE_USAGE = (  # dimension, title, unit
    ("cpu_millicores", "CPU", "m"),
    ("memory_mib", "Memory", "MiB"),
    ("gpu_milli", "GPU", "‰"),
)


@operator_page
def node_usage(request, actor, pk: int):
    """A node's usage over a range (15 min to 24 h) from its pool's capacity samples: reserved
    by leases and used as the agent measures it, against its allocatable (the y axis' top)."""
    node = get_object_or_404(Node.objects.visible_to(actor), pk=pk)
    rng = _range(request)
    if rng is None or rng.rollup:
        return HttpResponseBadRequest(
            "range must be one of 15m, 1h, 6h, 24h", content_type="text/plain"
        )
    usage = health.node_usage(node, rng)
    panels = []
    for dim, title, unit in NODE_USAGE:
        series = usage.get(dim)
        if not series:
            continue
        chart = charts.timeseries(
            series["points"],
            [("reserved", "Reserved", "reserved"), ("used", "Used", "used")],
            unit=unit,
            top=series["allocatable"],
        )
        last = next((p for p in reversed(series["points"]) if p["reserved"] is not None), None)
        f = charts.fmt
        summary = (
            f"now reserved {f(last['reserved'], unit)}, used {f(last['used'], unit)}"
            f" of {f(series['allocatable'], unit)}"
            if last
            else ""
        )
        panels.append(
            {"id": f"usage-{dim}", "title": f"{title} ({unit})", "chart": chart, "summary": summary}
        )
    context = {
        "node": node,
        "panels": panels,
        "range": rng,
        "ranges": [r for r in health.RANGES.values() if not r.rollup],
    }
    return render(request, "ops/_node_usage.html", context)
