"""Operator console pages for nodes: where each node is, why, and the actions on it."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from pools.actors import Actor
from pools.statemachine import TransitionRefused

from . import services
from .forms import DrainForm
from .selectors import nodes_with_latest_event


def _operator(request) -> Actor:
    actor = Actor.from_request(request)
    if not actor.is_operator:
        raise PermissionDenied("Only operators see nodes.")
    return actor


@login_required
def nodes_page(request):
    nodes = nodes_with_latest_event(_operator(request))
    return render(request, "console/nodes.html", {"nodes": nodes})


@login_required
def node_detail(request, pk: int):
    node = get_object_or_404(nodes_with_latest_event(_operator(request)), pk=pk)
    events = node.events.order_by("-at", "-id")[:200]
    return render(
        request,
        "console/node_detail.html",
        {"node": node, "events": events, "probes": node.probes.all()[:20]},
    )


def _drain(node, actor, request):
    form = DrainForm(request.POST)
    if not form.is_valid():
        raise ValidationError(form.error_text())
    return services.node_drain(node=node, actor=actor, deadline=form.deadline(timezone.now()))


ACTIONS = {
    "drain": _drain,
    "cancel-drain": lambda node, actor, request: services.node_drain_cancel(node=node, actor=actor),
    "quarantine": lambda node, actor, request: services.node_quarantine(
        node=node, actor=actor, message=request.POST.get("message") or "quarantined from console"
    ),
    "release": lambda node, actor, request: services.node_release(node=node, actor=actor),
    "retire": lambda node, actor, request: services.node_retire(node=node, actor=actor),
}


@login_required
@require_POST
def node_action(request, pk: int, action: str):
    """An htmx post: run the service, answer with the node's refreshed row."""
    actor = _operator(request)
    if action not in ACTIONS:
        raise Http404("No such action.")
    node = get_object_or_404(nodes_with_latest_event(actor), pk=pk)
    error = ""
    try:
        ACTIONS[action](node, actor, request)
    except TransitionRefused as refused:
        error = refused.message
    except ValidationError as invalid:  # a form field out of range: nothing was done
        if not request.htmx:
            return HttpResponseBadRequest(" ".join(invalid.messages), content_type="text/plain")
        error = " ".join(invalid.messages)
    if not request.htmx:
        return redirect("console-nodes")
    node = nodes_with_latest_event(actor).get(pk=pk)
    # 200 even when refused: htmx swaps only 2xx, and the row itself shows the refusal.
    return render(request, "console/_node_row.html", {"node": node, "error": error})
