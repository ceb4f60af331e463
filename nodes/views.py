"""Operator console pages for nodes: the filterable list, a node's page (why it is where it is,
its inventory and devices, the actions on it) and enrollment tokens. Reads through
nodes/selectors.py, writes through nodes.services; operators only (anyone else: 403).

Every action asks for a reason (recorded as the event's message) and is confirmed in the
browser (hx-confirm) before it is posted. The pages follow /ws/nodes/ (static/js/ops-live.js):
a node's event refreshes its row or its page; a reconnection refreshes the whole table."""

from datetime import timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Case, Count, Exists, IntegerField, OuterRef, Q, Value, When
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from pools.actors import Actor
from pools.models import ComputePool
from pools.statemachine import TransitionRefused

from . import services
from .api.serializers import EnrollmentTokenSerializer
from .choices import NodeState, Reachability
from .filters import NodeFilter
from .forms import DrainForm
from .models import GpuDevice
from .selectors import enrollment_tokens_visible_to, nodes_with_latest_event

PAGE_SIZE = 25
EVENTS_SHOWN = 200


def _operator(request) -> Actor:
    actor = Actor.from_request(request)
    if not actor.is_operator:
        raise PermissionDenied("Only operators see nodes.")
    return actor


def _node(actor, pk):
    return get_object_or_404(nodes_with_latest_event(actor), pk=pk)


# --- the list ---------------------------------------------------------------------------------

# Problems first: the rank of a node's worst trouble (lower comes first).
UNREACHABLE_LIVE = Q(reachability=Reachability.UNREACHABLE) & ~Q(state=NodeState.RETIRED)


def problems_first(nodes):
    """Unreachable, quarantined, with an unhealthy device, draining, not yet ready, then ready
    ones, then retired; by pool and name within each."""
    sick = GpuDevice.objects.filter(node=OuterRef("pk"), healthy=False)
    return nodes.annotate(
        trouble=Case(
            When(UNREACHABLE_LIVE, then=Value(0)),
            When(state=NodeState.QUARANTINED, then=Value(1)),
            When(Q(Exists(sick)) & ~Q(state=NodeState.RETIRED), then=Value(2)),
            When(state=NodeState.DRAINING, then=Value(3)),
            When(state__in=(NodeState.REGISTERED, NodeState.VERIFIED), then=Value(4)),
            When(state=NodeState.READY, then=Value(5)),
            default=Value(6),
            output_field=IntegerField(),
        )
    ).order_by("trouble", "pool__slug", "name")


def state_counts(nodes) -> list[dict]:
    """How many of `nodes` are in each state, and how many are unreachable (a condition beside
    the state): [{"key", "label", "count", "problem"}], states that no node is in left out."""
    by_state = dict(nodes.order_by().values_list("state").annotate(n=Count("id")))
    counts = [
        {"key": key, "label": label, "count": by_state[key], "problem": key != NodeState.READY}
        for key, label in NodeState.choices
        if by_state.get(key) and key != NodeState.RETIRED
    ]
    unreachable = nodes.filter(UNREACHABLE_LIVE).count()
    if unreachable:
        counts.insert(
            0, {"key": "unreachable", "label": "Unreachable", "count": unreachable, "problem": True}
        )
    if by_state.get(NodeState.RETIRED):
        counts.append(
            {
                "key": "retired",
                "label": "Retired",
                "count": by_state[NodeState.RETIRED],
                "problem": False,
            }
        )
    return counts


@login_required
@require_GET
def nodes_page(request):
    """The filtered, paginated list; with htmx only its table (a reconnected page's refresh)."""
    actor = _operator(request)
    filters = NodeFilter(request.GET, queryset=nodes_with_latest_event(actor), actor=actor)
    valid = filters.is_valid()
    nodes = problems_first(filters.qs if valid else nodes_with_latest_event(actor).none())
    page = Paginator(nodes, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "filters": filters,
        "page": page,
        "nodes": page.object_list,
        "query": query,
        "counts": state_counts(nodes),
    }
    template = "console/_node_table.html" if request.htmx else "console/nodes.html"
    return render(request, template, context, status=200 if valid else 400)


@login_required
@require_GET
def node_row(request, pk: int):
    return render(request, "console/_node_row.html", {"node": _node(_operator(request), pk)})


# --- one node -------------------------------------------------------------------------------

PARTS = {"summary": "console/_node_summary.html", "actions": "console/_node_actions.html"}


@login_required
@require_GET
def node_detail(request, pk: int):
    """The node's page; with htmx and ?part=summary|actions, that part (live refresh)."""
    node = _node(_operator(request), pk)
    if request.htmx and request.GET.get("part") in PARTS:
        return render(request, PARTS[request.GET["part"]], {"node": node})
    context = {
        "node": node,
        "events": node.events.order_by("-at", "-id")[:EVENTS_SHOWN],
        "probes": node.probes.all()[:20],
        "credentials": node.credentials.order_by("-created_at", "-id")[:10],
        "now": timezone.now(),
    }
    return render(request, "console/node_detail.html", context)


@login_required
@require_GET
def node_events(request, pk: int):
    node = _node(_operator(request), pk)
    events = node.events.order_by("-at", "-id")[:EVENTS_SHOWN]
    return render(request, "console/_node_events.html", {"node": node, "events": events})


class ReasonForm(forms.Form):
    """Every action's reason, recorded as its event's message."""

    reason = forms.CharField(max_length=500, strip=True)


def _reason(request) -> str:
    form = ReasonForm(request.POST)
    if not form.is_valid():
        raise ValidationError("A reason (at most 500 characters) is required; it is recorded.")
    return form.cleaned_data["reason"]


def _drain(node, actor, request):
    form = DrainForm(request.POST)
    if not form.is_valid():
        raise ValidationError(form.error_text())
    return services.node_drain(
        node=node, actor=actor, deadline=form.deadline(timezone.now()), message=_reason(request)
    )


def _rotate(node, actor, request):
    _, secret = services.node_credential_reissue(node=node, actor=actor, message=_reason(request))
    return secret


ACTIONS = {
    "drain": _drain,
    "cancel-drain": lambda node, actor, request: services.node_drain_cancel(
        node=node, actor=actor, message=_reason(request)
    ),
    "quarantine": lambda node, actor, request: services.node_quarantine(
        node=node, actor=actor, message=_reason(request)
    ),
    "release": lambda node, actor, request: services.node_release(
        node=node, actor=actor, message=_reason(request)
    ),
    "retire": lambda node, actor, request: services.node_retire(
        node=node, actor=actor, message=_reason(request)
    ),
    "rotate-credential": _rotate,
}


@login_required
@require_POST
def node_action(request, pk: int, action: str):
    """Run the action's service. htmx: answer with the refreshed actions (and, out of band, the
    summary); a refusal or a bad field is shown there. Without htmx: back to the node's page,
    or 400 with the field's error."""
    actor = _operator(request)
    if action not in ACTIONS:
        raise Http404("No such action.")
    node = _node(actor, pk)
    error, secret = "", ""
    try:
        result = ACTIONS[action](node, actor, request)
        secret = result if isinstance(result, str) else ""
    except TransitionRefused as refused:
        error = refused.message
    except ValidationError as invalid:  # a form field out of range: nothing was done
        if not request.htmx:
            return HttpResponseBadRequest(" ".join(invalid.messages), content_type="text/plain")
        error = " ".join(invalid.messages)
    node = _node(actor, pk)
    context = {"node": node, "error": error, "secret": secret, "oob": True}
    if request.htmx:
        # 200 even when refused: htmx swaps only 2xx, and the panel itself shows the refusal.
        return render(request, "console/_node_actions.html", context)
    if secret:  # shown once: this response is the only place it appears
        return render(request, "console/node_secret.html", context)
    return redirect("console-node", pk)


# --- enrollment tokens ------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def enrollment_tokens(request):
    """GET: the tokens and the form. POST: a new token, its secret shown on this answer only."""
    actor = _operator(request)
    errors, created, secret, status = {}, None, "", 200
    if request.method == "POST":
        serializer = EnrollmentTokenSerializer(data=request.POST)
        if serializer.is_valid():
            data = serializer.validated_data
            created, secret = services.enrollment_token_issue(
                pool=data["pool"],
                actor=actor,
                max_uses=data["max_uses"],
                ttl=timedelta(hours=data["ttl_hours"]),
                name=data.get("name", ""),
            )
            status = 201
        else:
            errors, status = {k: " ".join(v) for k, v in serializer.errors.items()}, 400
    tokens = Paginator(enrollment_tokens_visible_to(actor), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    context = {
        "page": tokens,
        "tokens": tokens.object_list,
        "pools": ComputePool.objects.visible_to(actor).order_by("slug"),
        "errors": errors,
        "values": request.POST,
        "created": created,
        "secret": secret,
        "now": timezone.now(),
    }
    return render(request, "console/enrollment_tokens.html", context, status=status)


@login_required
@require_POST
def enrollment_token_revoke(request, pk: int):
    token = get_object_or_404(enrollment_tokens_visible_to(_operator(request)), pk=pk)
    services.enrollment_token_revoke(token=token)
    return redirect("console-enrollment-tokens")
