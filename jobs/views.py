"""The tenant console's job pages (server-rendered; htmx swaps the live parts). Thin: reads go
through `visible_to` (another tenant's job is a 404), writes through jobs.services, and a
submit is checked by the API's own JobSubmitSerializer."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import Throttled

from leases.selectors import quota_rows
from leases.services import explain_request
from pools.actors import Actor
from pools.api.throttles import check_placement_rate
from pools.choices import GpuSharingClass, TenantRole
from pools.models import PriorityClass
from pools.roles import tenant_roles
from pools.selectors import (
    pools_visible_to,
    shapes_visible_to,
    tenant_data_readable,
    tenants_visible_to,
)
from pools.statemachine import Refusal

from . import artifacts, selectors, services
from .api.serializers import JobSubmitSerializer
from .choices import ACTIVE, TERMINAL, JobState
from .forms import RETRY_REASONS, field_errors, submit_body

PAGE_SIZE = 25
RECENT = 10  # jobs on the dashboard
LOG_TAIL_LINES = 200
TIMELINE_MAX = 1000
# What each quota dimension is called on the dashboard's bars.
DIMENSION_LABELS = {
    "leases": "Concurrent jobs and leases",
    "cpu_millicores": "CPU (millicores)",
    "memory_mib": "Memory (MiB)",
    "gpus": "GPUs",
    "gpu_hours": "GPU-hours this period",
    "storage_mib": "Output storage (MiB)",
    "egress_mib": "Egress this period (MiB)",
}


def _actor(request) -> Actor:
    return Actor.from_request(request)


def _job_or_404(request, pk):
    return get_object_or_404(selectors.jobs_visible_to(_actor(request)), pk=pk)


def _page(request, queryset, size=PAGE_SIZE):
    return Paginator(queryset, size).get_page(request.GET.get("page"))


# --- dashboard and job list -----------------------------------------------------------------


def quota_bars(actor, now=None) -> list[dict]:
    """Each (tenant, pool) with a quota or a credit account the actor sees: a bar per dimension
    (used against limit) and the credit balance."""
    rows = []
    for row in quota_rows(actor, now or timezone.now(), pairs_limit=50):
        bars = []
        for name, label in DIMENSION_LABELS.items():
            value, limit = row["dimensions"][name]["used"], row["dimensions"][name]["limit"]
            percent = min(100, round(100 * value / limit)) if limit else (100 if value else 0)
            bars.append(
                {"label": label, "used": round(value, 2), "limit": limit, "percent": percent}
            )
        rows.append(
            {"tenant": row["tenant"], "pool": row["pool"], "bars": bars, "account": row["account"]}
        )
    return rows


@login_required
def dashboard(request):
    actor = _actor(request)
    jobs = selectors.jobs_visible_to(actor)
    counts = dict(jobs.order_by().values_list("state").annotate(n=Count("id")))
    context = {
        "by_state": [(state, label, counts.get(state, 0)) for state, label in JobState.choices],
        "queued": jobs.filter(state=JobState.QUEUED).order_by("created_at")[:10],
        "quotas": quota_bars(actor),
        "jobs": selectors.jobs_for_console(actor, limit=RECENT),
        "tenants": tenants_visible_to(actor),
    }
    return render(request, "console/dashboard.html", context)


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


@login_required
def job_new(request):
    tenants = list(_submit_tenants(request))
    values = request.POST or {
        "tenant": tenants[0].slug if tenants else "",
        "max_runtime_s": "3600",
        "shape_mode": "catalogue",
        "retry_max_attempts": "1",
        "retry_backoff_s": "30",
    }
    errors, refusal = {}, None
    if request.method == "POST":
        body, errors = submit_body(request.POST)
        if not errors:
            data, errors, refusal = _checked(request, body)
            if data is not None:
                try:
                    _check_placement_rate(data["tenant"])
                    # a shape that never fits is refused here (NeverFits), before any queueing
                    job = services.job_submit(actor=_actor(request), **data)
                    return redirect("console-job", job.pk)
                except Refusal as exc:
                    refusal = exc
                except ValidationError as exc:
                    errors = {"form": " ".join(exc.messages)}
    retry_on = values.getlist("retry_on") if hasattr(values, "getlist") else ["node_lost"]
    context = {
        "values": values,
        "errors": errors,
        "refusal": refusal,
        "tenants": tenants,
        "pools": pools_visible_to(_actor(request)),
        "shapes": shapes_visible_to(_actor(request)),
        "priority_classes": _priority_classes(request, values.get("tenant", "")),
        "sharing_classes": GpuSharingClass.choices,
        "retry_reasons": [(reason, reason in retry_on) for reason in RETRY_REASONS],
    }
    status = 200 if refusal is None else refusal.status
    return render(request, "console/job_new.html", context, status=status)


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


def _usage_rows(job, lease) -> list[dict]:
    """Requested (minimum, preferred), granted, peak and average use per measure."""
    if lease is None:
        return []
    resources, peak, average = job.resources, lease.usage_peak or {}, lease.usage_average or {}
    gpu_granted = sum(a.get("milli") or 1000 for a in lease.gpu_allocations or [])
    rows = [
        ("CPU (millicores)", "cpu_millicores", lease.cpu_millicores),
        ("Memory (MiB)", "memory_mib", lease.memory_mib),
    ]
    if gpu_granted:
        rows.append(("GPU (thousandths)", "gpu_milli", gpu_granted))
    out = []
    for label, key, granted in rows:
        used_peak, used_average = peak.get(key), average.get(key)
        out.append(
            {
                "label": label,
                "minimum": resources.get(f"{key}_min"),
                "preferred": resources.get(f"{key}_preferred"),
                "granted": granted,
                "peak": used_peak,
                "average": used_average,
                "peak_percent": min(100, round(100 * used_peak / granted))
                if used_peak is not None and granted
                else 0,
            }
        )
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
    return {
        "trace": trace_rows(job, _actor(request)),
        "job": job,
        "lease": lease,
        "usage": _usage_rows(job, lease),
        "data_readable": readable,
        "outputs": list(artifacts.job_outputs(job)) if readable else [],
        "is_active": job.state in ACTIVE,
        "has_ended": job.state in TERMINAL,
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
