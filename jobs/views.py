"""The tenant console's job pages (server-rendered; htmx swaps the live parts). Thin: reads go
through `visible_to` (another tenant's job is a 404), writes through jobs.services, and a
submit is checked by the API's own JobSubmitSerializer."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import Throttled

from leases.choices import HOLDING
from leases.models import Lease
from leases.selectors import quota_rows
from leases.services import explain_request
from nodes.choices import NodeState
from nodes.models import Node
from placement.types import GANG_TOPOLOGIES
from pools.actors import Actor
from pools.api.throttles import check_placement_rate
from pools.choices import GpuSharingClass, TenantRole
from pools.models import ComputePool, PriorityClass
from pools.roles import tenant_roles
from pools.selectors import (
    pools_visible_to,
    shapes_visible_to,
    tenant_data_readable,
    tenants_visible_to,
)
from pools.statemachine import Refusal

from . import artifacts, display, selectors, services
from .api.serializers import JobSubmitSerializer
from .choices import ACTIVE, TERMINAL, JobState
from .forms import RETRY_REASONS, field_errors, submit_body
from .images import admit_image
from .models import Job

PAGE_SIZE = 25
RECENT = 10  # jobs on the dashboard
LOG_TAIL_LINES = 200
TIMELINE_MAX = 1000
# What each quota dimension is called on the dashboard's bars, and how its figures read.
DIMENSION_LABELS = {
    "leases": ("Concurrent jobs and leases", lambda v: f"{v:g}"),
    "cpu_millicores": ("CPU", display.cores),
    "memory_mib": ("Memory", display.gib),
    "gpus": ("GPUs", lambda v: f"{v:g}"),
    "gpu_hours": ("GPU-hours this period", lambda v: f"{round(v, 2):g}"),
    "storage_mib": ("Output storage", display.gib),
    "egress_mib": ("Egress this period", display.gib),
}


def _actor(request) -> Actor:
    return Actor.from_request(request)


def _job_or_404(request, pk):
    return get_object_or_404(selectors.jobs_visible_to(_actor(request)), pk=pk)


def _page(request, queryset, size=PAGE_SIZE):
    return Paginator(queryset, size).get_page(request.GET.get("page"))


# --- dashboard and job list -----------------------------------------------------------------


def quota_bars(actor, now=None, used_pools=None) -> list[dict]:
    """Each (tenant, pool) with a quota or a credit account the actor sees: a bar per dimension
    (used against limit, in human units) and the credit balance. `used_pools`: a set of
    (tenant id, pool id) the actor's tenants use; the others are marked `unused`."""
    rows = []
    for row in quota_rows(actor, now or timezone.now(), pairs_limit=50):
        bars = []
        for name, (label, unit) in DIMENSION_LABELS.items():
            value, limit = row["dimensions"][name]["used"], row["dimensions"][name]["limit"]
            percent = min(100, round(100 * value / limit)) if limit else (100 if value else 0)
            bars.append(
                {
                    "label": label,
                    "used": unit(value),
                    "limit": unit(limit) if limit is not None else None,
                    "percent": percent,
                }
            )
        in_use = used_pools is None or (row["tenant"].pk, row["pool"].pk) in used_pools
        rows.append(
            {
                "tenant": row["tenant"],
                "pool": row["pool"],
                "bars": bars,
                "account": row["account"],
                "unused": not in_use,
            }
        )
    return rows


def _used_pools(jobs) -> set[tuple[int, int]]:
    """(tenant, pool) pairs with a job of the actor's tenants, or a lease held now."""
    pairs = set(jobs.order_by().values_list("tenant_id", "pool_id").distinct())
    held = Lease.objects.filter(tenant_id__in={t for t, _ in pairs} or [0], state__in=HOLDING)
    return pairs | set(held.order_by().values_list("tenant_id", "pool_id").distinct())


def _dashboard_context(actor) -> dict:
    jobs = selectors.jobs_visible_to(actor)
    counts = dict(jobs.order_by().values_list("state").annotate(n=Count("id")))
    quotas = quota_bars(actor, used_pools=_used_pools(jobs))
    return {
        "by_state": [(state, label, counts.get(state, 0)) for state, label in JobState.choices],
        "queued": jobs.filter(state=JobState.QUEUED)
        .select_related("pool")
        .order_by("created_at")[:10],
        "quotas": [row for row in quotas if not row["unused"]],
        "unused_quotas": [row for row in quotas if row["unused"]],
    }


def fleet_overview() -> list[dict]:
    """Per pool, for operators: nodes by state (an unreachable node counted apart, never as
    ready), jobs queued and running."""
    nodes = (
        Node.objects.order_by()
        .values_list("pool_id", "state", "reachability")
        .annotate(n=Count("id"))
    )
    jobs = (
        Job.objects.filter(state__in=[JobState.QUEUED, JobState.RUNNING])
        .order_by()
        .values_list("pool_id", "state")
        .annotate(n=Count("id"))
    )
    pools = {
        p.pk: {"pool": p, "nodes": {}, "unreachable": 0, "jobs": {}}
        for p in ComputePool.objects.order_by("slug")
    }
    for pool_id, state, reachability, n in nodes:
        if pool_id not in pools:
            continue
        if reachability != "reachable" and state != "retired":
            pools[pool_id]["unreachable"] += n
            continue
        pools[pool_id]["nodes"][state] = pools[pool_id]["nodes"].get(state, 0) + n
    for pool_id, state, n in jobs:
        if pool_id in pools:
            pools[pool_id]["jobs"][state] = n
    for row in pools.values():
        row["not_ready"] = sum(row["nodes"].get(s, 0) for s in ("registered", "verified"))
    return list(pools.values())


@login_required
def dashboard(request):
    actor = _actor(request)
    if actor.is_operator and not request.GET.get("mine"):
        context = {"fleet": fleet_overview()}
        return render(request, "console/fleet.html", context)
    context = _dashboard_context(actor) | {
        "jobs": selectors.jobs_for_console(actor, limit=RECENT),
        "tenants": tenants_visible_to(actor),
    }
    return render(request, "console/dashboard.html", context)


@login_required
@require_GET
def dashboard_live(request):
    """The dashboard's state tiles, quota bars and queued work again (htmx, on a live event)."""
    return render(request, "console/_dashboard_live.html", _dashboard_context(_actor(request)))


def _job_list(request):
    jobs = selectors.jobs_for_console(_actor(request), limit=None)
    state = request.GET.get("state", "")
    if state in JobState.values:
        jobs = jobs.filter(state=state)
    return _page(request, jobs), state


@login_required
def jobs_page(request):
    page, state = _job_list(request)
    context = {"page": page, "jobs": page.object_list, "state": state, "states": JobState.choices}
    return render(request, "console/jobs.html", context)


@login_required
def job_table(request):
    """The job table again (htmx, on a live event): a page of the list, or the dashboard's
    `?recent=1` newest few."""
    if request.GET.get("recent"):
        jobs = selectors.jobs_for_console(_actor(request), limit=RECENT)
        return render(request, "console/_job_table.html", {"jobs": jobs})
    page, state = _job_list(request)
    context = {"page": page, "jobs": page.object_list, "state": state}
    return render(request, "console/_job_table.html", context)


# --- submit ----------------------------------------------------------------------------------


def _submit_tenants(request):
    """The tenants whose jobs this person may submit (a member or an admin)."""
    roles = tenant_roles(request.user)
    allowed = [t for t, role in roles.items() if role in (TenantRole.MEMBER, TenantRole.ADMIN)]
    return tenants_visible_to(_actor(request)).filter(pk__in=allowed)


def _priority_classes(request, tenant_slug: str):
    tenant = _submit_tenants(request).filter(slug=tenant_slug).first()
    if tenant is None:
        return PriorityClass.objects.none()
    return PriorityClass.objects.allowed_to(request.user, tenant).order_by("-value", "name")


def _checked(request, body):
    """The API serializer over the form's body: (validated data or None, errors, refusal)."""
    serializer = JobSubmitSerializer(data=body, context={"request": request})
    try:
        if serializer.is_valid():
            return serializer.validated_data, {}, None
        return None, field_errors(serializer.errors), None
    except Refusal as refusal:  # the image: not resolvable, not allowed, unsigned (422)
        return None, {}, refusal


class PlacementsThrottled(Refusal):
    status = 429
    code = "throttled"


def _check_placement_rate(tenant) -> None:
    """The API's placement rate for the console's searches (submit, preview, explain)."""
    try:
        check_placement_rate(tenant)
    except Throttled as exc:
        raise PlacementsThrottled(
            f"Too many placement searches for {tenant.slug} just now; try again in "
            f"{exc.wait or 1:.0f} s."
        ) from None


def _default_pool(pools) -> str:
    """The first pool (by slug) with a ready, reachable node; else the first pool."""
    ready = set(
        Node.objects.filter(
            pool__in=pools, state=NodeState.READY, reachability="reachable"
        ).values_list("pool__slug", flat=True)
    )
    slugs = [p.slug for p in pools]
    return next((slug for slug in slugs if slug in ready), slugs[0] if slugs else "")


def _shapes(request, pool_slug: str):
    return shapes_visible_to(_actor(request)).filter(pool__slug=pool_slug).order_by("name")


def _image_refusal(body) -> str | None:
    """What the pool's registry policy says of the image, asked beside other field errors so
    that every error comes back in one round (the serializer asks only once the rest is valid)."""
    pool = ComputePool.objects.filter(slug=body.get("pool", "")).first()
    if pool is None or not body.get("image"):
        return None
    try:
        admit_image(pool, body["image"], os="")
    except Refusal as exc:
        return exc.message
    except ValueError:  # not a reference: the serializer says so
        return None
    return None


def _submit(request, values) -> tuple[dict, Refusal | None, object]:
    """Every error of the form in one round: the text's own, the serializer's, and the image's
    refusal beside Image. Returns (errors, refusal, the job or None)."""
    body, errors = submit_body(values)
    data, serializer_errors, refusal = _checked(request, body)
    if refusal is not None and refusal.code.startswith("image"):
        errors.setdefault("image", refusal.message)
        refusal = None
    errors = serializer_errors | errors
    if errors and "image" not in errors and (message := _image_refusal(body)):
        errors["image"] = message
    if errors or refusal is not None or data is None:
        return errors, refusal, None
    try:
        _check_placement_rate(data["tenant"])
        # a shape that never fits is refused here (NeverFits), before any queueing
        return {}, None, services.job_submit(actor=_actor(request), **data)
    except Refusal as exc:
        return {}, exc, None
    except ValidationError as exc:
        return {"form": " ".join(exc.messages)}, None, None


@login_required
def job_new(request):
    tenants = list(_submit_tenants(request))
    pools = list(pools_visible_to(_actor(request)).order_by("slug"))
    values = request.POST or {
        "tenant": tenants[0].slug if tenants else "",
        "pool": _default_pool(pools),
        "max_runtime_s": "3600",
        "shape_mode": "catalogue",
        "retry_max_attempts": "1",
        "retry_backoff_s": "30",
    }
    source = request.GET.get("from", "")
    if request.method == "GET" and source.isdigit():  # Resubmit / Clone
        values = display.clone_values(_job_or_404(request, int(source)))
    errors, refusal = {}, None
    if request.method == "POST":
        errors, refusal, job = _submit(request, request.POST)
        if job is not None:
            return redirect("console-job", job.pk)
    if hasattr(values, "getlist"):  # the form as posted
        retry_on = values.getlist("retry_on")
    else:  # a new form (node_lost), or a clone's own reasons
        retry_on = values.get("retry_on", ["node_lost"])
    context = {
        "values": values,
        "errors": errors,
        "error_list": [(name, message) for name, message in errors.items()],
        "refusal": refusal,
        "tenants": tenants,
        "pools": pools,
        "shapes": _shapes(request, values.get("pool", "")),
        "priority_classes": _priority_classes(request, values.get("tenant", "")),
        "sharing_classes": GpuSharingClass.choices,
        "gang_topologies": GANG_TOPOLOGIES,
        "retry_reasons": [(reason, reason in retry_on) for reason in RETRY_REASONS],
    }
    status = 200 if refusal is None else refusal.status
    return render(request, "console/job_new.html", context, status=status)


@login_required
@require_GET
def job_new_shapes(request):
    """The shape select for the pool just chosen (htmx)."""
    shapes = _shapes(request, request.GET.get("pool", ""))
    return render(request, "console/_shape_options.html", {"shapes": shapes, "values": {}})


@login_required
@require_GET
def job_new_priorities(request):
    """The priority select for the tenant just chosen (htmx)."""
    classes = _priority_classes(request, request.GET.get("tenant", ""))
    return render(request, "console/_priority_options.html", {"priority_classes": classes})


@login_required
@require_POST
def job_preview(request):
    """ "Will it fit now?": the scheduler's answer for the form's request, reserving nothing."""
    body, errors = submit_body(request.POST)
    data = refusal = answer = None
    if not errors:
        data, errors, refusal = _checked(request, body)
    if data is not None:
        try:
            _check_placement_rate(data["tenant"])
        except Refusal as exc:
            data, refusal = None, exc
    if data is not None:
        shape = data.get("shape")
        answer = explain_request(
            pool=data["pool"],
            tenant=data["tenant"],
            request=shape.as_request() if shape else data["resources"],
            image_platforms=data.get("image_platforms", ()),
        )
    context = {"errors": errors, "refusal": refusal, "answer": answer}
    return render(request, "console/_preview.html", context)


# --- one job ---------------------------------------------------------------------------------


USAGE_MEASURES = (
    ("CPU", "cpu_millicores", display.cores),
    ("Memory", "memory_mib", display.gib),
    ("GPU", "gpu_milli", display.gpus),
)


def _percent(value, of) -> int:
    return min(100, round(100 * value / of)) if value is not None and of else 0


def _usage_rows(job, lease) -> list[dict]:
    """Per measure: requested (minimum, preferred), granted, and the use the node's agent
    measured (latest, peak, average), in human units, each with its percent of the grant for
    the small bars."""
    if lease is None:
        return []
    resources, peak, average = job.resources, lease.usage_peak or {}, lease.usage_average or {}
    latest = {
        "cpu_millicores": lease.used_cpu_millicores,
        "memory_mib": lease.used_memory_mib,
        "gpu_milli": lease.used_gpu_milli,
    }
    granted = {
        "cpu_millicores": lease.cpu_millicores,
        "memory_mib": lease.memory_mib,
        "gpu_milli": sum(a.get("milli") or 1000 for a in lease.gpu_allocations or []),
    }
    out = []
    for label, key, unit in USAGE_MEASURES:
        if key == "gpu_milli" and not granted[key]:
            continue
        grant, reported = granted[key], lease.usage_reported_at is not None
        minimum = (
            resources.get(f"{key}_min")
            if key != "gpu_milli"
            else 1000 * (resources.get("gpu_count") or 0)
        )
        preferred = resources.get(f"{key}_preferred") if key != "gpu_milli" else None
        used = {
            "latest": latest[key] if reported else None,
            "peak": peak.get(key),
            "average": average.get(key),
        }
        out.append(
            {
                "label": label,
                "key": key,
                "minimum": unit(minimum) if minimum else "—",
                "preferred": unit(preferred) if preferred else "—",
                "granted": unit(grant),
                "raw": {"granted": grant} | used,
                **{name: unit(value) if value is not None else "—" for name, value in used.items()},
                **{f"{name}_percent": _percent(value, grant) for name, value in used.items()},
            }
        )
        out[-1]["cells"] = [
            (title, (out[-1][name], used[name]), out[-1][f"{name}_percent"])
            for title, name in (("Now", "latest"), ("Peak", "peak"), ("Average", "average"))
        ]
    return out


def trace_rows(job, actor, now=None) -> dict:
    """The job's trace (jobs/trace.py) as the console draws it: per span its offset and width in
    percent of the whole run, its duration; operators also see where it ran. A span still open
    runs to now."""
    spans = selectors.job_trace_spans(job)
    now = now or timezone.now()
    if not spans:
        return {"rows": [], "total_s": 0}
    start = spans[0].start
    end = max((span.end or now) for span in spans)
    total = max((end - start).total_seconds(), 1e-3)
    rows = []
    for span in spans:
        span_end = span.end or now
        seconds = max(0.0, (span_end - span.start).total_seconds())
        offset = 100 * (span.start - start).total_seconds() / total
        rows.append(
            {
                "span": span,
                "label": span.name.replace("_", " "),
                "seconds": seconds,
                "open": span.end is None,
                "offset": round(min(100.0, max(0.0, offset)), 2),
                "width": round(max(0.4, min(100.0 - offset, 100 * seconds / total)), 2),
                "infrastructure": span.infrastructure if actor.is_operator else None,
            }
        )
    return {"rows": rows, "total_s": total, "trace_id": job.trace_id}


def _job_context(request, job) -> dict:
    lease = job.leases.select_related("node").order_by("-created_at", "-id").first()
    # an operator sees the job's metadata; its logs and outputs only under a support grant
    readable = tenant_data_readable(_actor(request), job.tenant_id)
    now = timezone.now()
    spans = selectors.job_trace_spans(job)
    durations = display.job_durations(
        spans, max_runtime_s=job.max_runtime_s, ended=job.state in TERMINAL, now=now
    )
    return {
        "trace": trace_rows(job, _actor(request), now=now),
        "job": job,
        "lease": lease,
        "usage": _usage_rows(job, lease),
        "command_line": display.command_line(job.command),
        "durations": {name: display.duration(value) for name, value in durations.items()},
        "durations_s": durations,
        "data_readable": readable,
        "outputs": list(artifacts.job_outputs(job)) if readable else [],
        "storage": display.storage_sentences(selectors.job_storage(job, lease=lease)),
        "is_active": job.state in ACTIVE,
        "has_ended": job.state in TERMINAL,
        "can_submit": _submit_tenants(request).filter(pk=job.tenant_id).exists(),
    }


@login_required
def job_detail(request, pk):
    job = _job_or_404(request, pk)
    events = list(job.events.order_by("pk")[:TIMELINE_MAX])
    return render(
        request, "console/job_detail.html", {**_job_context(request, job), "events": events}
    )


@login_required
@require_GET
def job_timeline(request, pk):
    """The job's events after `?after=<event id>` (the cursor a live page keeps; a page that
    reconnects asks for what it missed), and its summary again (an out-of-band swap)."""
    job = _job_or_404(request, pk)
    after = request.GET.get("after", "0")
    if not after.isdigit():
        return HttpResponseBadRequest("after: an event id (a whole number).")
    events = list(job.events.filter(pk__gt=int(after)).order_by("pk")[:TIMELINE_MAX])
    context = {**_job_context(request, job), "events": events, "oob": True}
    return render(request, "console/_timeline_update.html", context)


@login_required
@require_GET
def job_log(request, pk):
    job = _job_or_404(request, pk)
    if not tenant_data_readable(_actor(request), job.tenant_id):
        context = {"job": job, "data_readable": False}
        return render(request, "console/_job_log.html", context, status=403)
    context = {"job": job, "log": artifacts.job_log_tail(job, LOG_TAIL_LINES)}
    context["has_ended"], context["lines"] = job.state in TERMINAL, LOG_TAIL_LINES
    return render(request, "console/_job_log.html", context)


@login_required
@require_GET
def job_log_download(request, pk):
    """The job's whole log (every attempt, up to the tail's maximum) as a text file."""
    job = _job_or_404(request, pk)
    if not tenant_data_readable(_actor(request), job.tenant_id):
        return HttpResponse("The log needs a support grant.", status=403, content_type="text/plain")
    text = artifacts.job_log_tail(job, artifacts.LOG_TAIL_MAX_LINES)
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.log"'
    return response


@login_required
@require_GET
def job_explain(request, pk):
    """ "Why is this pending" (or why it runs where it does), from the explain service."""
    job = _job_or_404(request, pk)
    try:  # what the scheduler says now is a placement search: counted like the API's explain
        _check_placement_rate(job.tenant)
        explanation = selectors.job_explanation(job)
    except Refusal:
        explanation = selectors.job_explanation(job, now=False)
    return render(request, "console/_job_explain.html", {"job": job, "x": explanation})


@login_required
def job_cancel(request, pk):
    """GET: the confirmation step; POST: cancel, then back to the job page."""
    job = _job_or_404(request, pk)
    refusal = None
    if request.method == "POST":
        try:
            message = request.POST.get("message", "").strip()[:200]
            services.job_cancel(job=job, actor=_actor(request), message=message)
            return redirect("console-job", job.pk)
        except Refusal as exc:  # it ended meanwhile
            refusal = exc
    template = "console/_job_cancel.html" if request.htmx else "console/job_cancel.html"
    status = 409 if refusal else 200
    return render(request, template, {"job": job, "refusal": refusal}, status=status)
