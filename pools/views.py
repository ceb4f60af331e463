"""Console pages of pools: own API tokens, a tenant admin's members and support grants."""

from contextlib import suppress
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from . import selectors, services
from .actors import Actor
from .api.serializers import (
    MemberRoleSerializer,
    MembershipSerializer,
    SupportGrantCreateSerializer,
)
from .choices import SupportGrantState, TenantRole
from .forms import ApiTokenForm
from .models import Membership, SupportGrant
from .statemachine import Refusal

MEMBERS_PAGE_SIZE = 50


@login_required
def tokens_page(request):
    secret, created = None, None
    form = ApiTokenForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            created, secret = services.api_token_issue(
                user=request.user,
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                ttl=timedelta(days=form.cleaned_data["ttl_days"]),
            )
            form = ApiTokenForm(user=request.user)
        except ValidationError as exc:  # the service's rules, shown on the form's fields
            form.add_error(None, exc)
    context = {
        "form": form,
        "secret": secret,
        "created": created,
        "tokens": selectors.tokens_visible_to(Actor.from_request(request)),
    }
    return render(request, "console/tokens.html", context)


@login_required
@require_POST
def token_revoke(request, pk):
    token = get_object_or_404(selectors.tokens_visible_to(Actor.from_request(request)), pk=pk)
    services.api_token_revoke(token=token)
    if not request.htmx:  # the confirmation's form, posted without htmx
        return redirect("console-tokens")
    return render(request, "console/_token_row.html", {"token": token})


@login_required
def members_page(request):
    """The members of the tenants this person administers; adding one by username answers the
    same whether or not the name may join (services.member_add: no enumeration)."""
    actor = Actor.from_request(request)
    admin_of = _administered(actor)
    errors = {}
    if request.method == "POST":
        tenant = _posted_tenant(request, admin_of)
        body = MembershipSerializer(
            data={"user": request.POST.get("username", ""), **_role(request)}
        )
        if body.is_valid():
            try:
                services.member_add(
                    tenant=tenant,
                    username=body.validated_data["user"],
                    role=body.validated_data["role"],
                    actor=actor,
                )
            except Refusal as exc:  # re-adding the last admin with another role
                return _members(request, admin_of, refusal=exc, status=409)
            return redirect(f"{request.path}?added=1")
        errors = {field: " ".join(map(str, messages)) for field, messages in body.errors.items()}
    return _members(request, admin_of, errors=errors, values=request.POST)


def _members(request, admin_of, *, errors=None, values=None, refusal=None, status=200):
    memberships = (
        Membership.objects.filter(tenant__in=admin_of)
        .select_related("user", "tenant")
        .order_by("tenant__slug", "user__username")
    )
    page = Paginator(memberships, MEMBERS_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "admin_of": admin_of,
        "page": page,
        "memberships": page.object_list,
        "roles": TenantRole.choices,
        "errors": errors or {},
        "values": values or {},
        "refusal": refusal,
        "added": request.GET.get("added") == "1",
        "done": request.GET.get("done", ""),
    }
    return render(request, "console/members.html", context, status=status)


def _administered_membership(actor, admin_of: list, pk: int) -> Membership:
    """A membership of a tenant this person administers; any other is a 404."""
    return get_object_or_404(
        Membership.objects.filter(tenant__in=admin_of).select_related("user", "tenant"), pk=pk
    )


@login_required
@require_POST
def member_role(request, pk):
    """A tenant admin changes a member's role; the last admin is never demoted (409)."""
    actor = Actor.from_request(request)
    admin_of = _administered(actor)
    membership = _administered_membership(actor, admin_of, pk)
    body = MemberRoleSerializer(data={"role": request.POST.get("role", "")})
    if not body.is_valid():
        errors = {f"role-{pk}": " ".join(map(str, body.errors["role"]))}
        return _members(request, admin_of, errors=errors, status=400)
    try:
        services.member_role_change(
            membership=membership, role=body.validated_data["role"], actor=actor
        )
    except Refusal as exc:
        return _members(request, admin_of, refusal=exc, status=409)
    return redirect(f"{reverse('console-members')}?done=role")


@login_required
@require_POST
def member_remove(request, pk):
    """A tenant admin removes a member (after the page's confirmation step); the last admin is
    never removed (409)."""
    actor = Actor.from_request(request)
    admin_of = _administered(actor)
    membership = _administered_membership(actor, admin_of, pk)
    try:
        services.member_remove(membership=membership, actor=actor)
    except Refusal as exc:
        return _members(request, admin_of, refusal=exc, status=409)
    return redirect(f"{reverse('console-members')}?done=removed")


def _administered(actor) -> list:
    return [t for t in selectors.tenants_visible_to(actor) if actor.is_tenant_admin(t.pk)]


def _posted_tenant(request, admin_of: list):
    """The form's tenant, one of those the person administers; any other is a 404 (as if it
    did not exist)."""
    tenant = next((t for t in admin_of if t.slug == request.POST.get("tenant")), None)
    if tenant is None:
        raise Http404("No tenant you administer has this slug.")
    return tenant


def _role(request) -> dict:
    role = request.POST.get("role")
    return {"role": role} if role else {}


@login_required
def support_grants_page(request):
    """A tenant admin's support grants: which operator may read the tenant's logs and outputs,
    until when (create, revoke); an operator sees the grants made to them."""
    actor = Actor.from_request(request)
    admin_of = _administered(actor)
    errors = {}
    if request.method == "POST":
        tenant = _posted_tenant(request, admin_of)
        fields = ("operator", "reason", "ttl_hours")
        body = SupportGrantCreateSerializer(
            data={k: request.POST[k] for k in fields if request.POST.get(k)}
        )
        if body.is_valid():
            try:
                services.support_grant_create(
                    tenant=tenant,
                    operator=body.validated_data["operator"],
                    ttl=timedelta(hours=body.validated_data["ttl_hours"]),
                    reason=body.validated_data["reason"],
                    actor=actor,
                )
                return redirect(request.path)
            except ValidationError as exc:
                errors = {k: " ".join(v) for k, v in exc.message_dict.items()}
        else:
            errors = {k: " ".join(map(str, v)) for k, v in body.errors.items()}
    if admin_of:
        grants = SupportGrant.objects.filter(tenant__in=admin_of)
    else:
        grants = SupportGrant.objects.filter(operator_id=actor.user_id)
    grants = grants.select_related("tenant", "operator", "granted_by")[:100]
    now = timezone.now()
    context = {
        "admin_of": admin_of,
        "grants": [(g, g.is_active(now)) for g in grants],
        "errors": errors,
        "values": request.POST,
    }
    return render(request, "console/support_grants.html", context)


@login_required
@require_POST
def support_grant_revoke(request, pk):
    actor = Actor.from_request(request)
    grant = get_object_or_404(
        SupportGrant.objects.visible_to(actor).select_related("tenant"), pk=pk
    )
    if not actor.is_tenant_admin(grant.tenant_id):
        raise Http404("No grant of a tenant you administer has this id.")
    if grant.state == SupportGrantState.ACTIVE:
        with suppress(Refusal):  # it ended meanwhile: nothing left to revoke
            services.support_grant_revoke(grant=grant, actor=actor)
    return redirect("console-support-grants")
