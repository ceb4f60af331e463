"""The tenant console's leases page: my leases, a future reservation (a window with its
tolerance) through the lease API's own serializer and lease_reserve, and releasing one."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from pools.actors import Actor
from pools.reasons import Reason
from pools.selectors import pools_visible_to, shapes_visible_to, tenants_visible_to
from pools.statemachine import Refusal

from . import selectors, services
from .api.serializers import LeaseCreateSerializer
from .choices import HOLDING

PAGE_SIZE = 25


def _errors(detail) -> dict[str, str]:
    """The serializer's nested errors as {form field: message} (window.start → start)."""
    errors = {}
    for field, messages in detail.items():
        if isinstance(messages, dict):
            errors.update(_errors(messages))
        else:
            errors[field] = " ".join(str(m) for m in messages)
    return errors


def _reserve_body(post) -> dict:
    body = {"tenant": post.get("tenant", ""), "pool": post.get("pool", "")}
    if post.get("shape"):
        body["shape"] = post["shape"]
    else:
        body["resources"] = {
            key: post.get(key, "") for key in ("cpu_millicores_min", "memory_mib_min")
        }
    body["window"] = {
        "start": post.get("start", ""),
        "end": post.get("end", ""),
        "tolerance_s": post.get("tolerance_s") or 300,
    }
    return body


@login_required
def leases_page(request):
    actor = Actor.from_request(request)
    errors, refusal = {}, None
    if request.method == "POST":
        serializer = LeaseCreateSerializer(
            data=_reserve_body(request.POST), context={"request": request}
        )
        if serializer.is_valid():
            data, window = serializer.validated_data, serializer.validated_data["window"]
            try:
                lease = services.lease_reserve(
                    pool=data["pool"],
                    tenant=data["tenant"],
                    request=data["request"],
                    actor=actor,
                    duration=timedelta(seconds=data["duration_s"]),
                    window=services.Window(
                        window["start"], window["end"], timedelta(seconds=window["tolerance_s"])
                    ),
                )
                return redirect(f"{request.path}?reserved={lease.pk}")
            except Refusal as exc:  # no capacity in the window, quota, horizon …
                refusal = exc
        else:
            errors = _errors(serializer.errors)
    leases = selectors.leases_visible_to(actor).order_by("-created_at", "-id")
    reserved = request.GET.get("reserved", "")
    reserved = leases.filter(pk=reserved).first() if reserved.isdigit() else None
    page = Paginator(leases, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "leases": page.object_list,
        "holding": HOLDING,
        "values": request.POST or {"tolerance_s": "300"},
        "errors": errors,
        "refusal": refusal,
        "reserved": reserved,
        "now": timezone.now(),  # the form says the capacity is held from now, not from the start
        "tenants": tenants_visible_to(actor),
        "pools": pools_visible_to(actor),
        "shapes": shapes_visible_to(actor),
    }
    return render(request, "console/leases.html", context, status=409 if refusal else 200)


@login_required
@require_POST
def lease_release(request, pk):
    actor = Actor.from_request(request)
    lease = get_object_or_404(selectors.leases_visible_to(actor), pk=pk)
    refusal = None
    try:
        lease = services.lease_release(
            lease=lease,
            actor=actor,
            reason=Reason.RELEASED_BY_CLIENT,
            message="released in the console",
        )
    except Refusal as exc:  # it ended meanwhile
        refusal = exc
    context = {"lease": lease, "holding": HOLDING, "refusal": refusal}
    return render(request, "console/_lease_row.html", context)
