from datetime import timedelta

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from pools import selectors, services
from pools.actors import Actor
from pools.api.permissions import IsPerson, IsPolicyAdminOrReadOnly
from pools.api.serializers import (
    ApiTokenSerializer,
    MemberRoleSerializer,
    MembershipEventSerializer,
    MembershipSerializer,
    PolicyVersionSerializer,
    PoolSerializer,
    ShapeSerializer,
    SupportGrantCreateSerializer,
    SupportGrantSerializer,
    TenantSecretSerializer,
    TenantSerializer,
)
from pools.choices import PlatformRole
from pools.models import ApiToken, Membership, MembershipEvent, TenantSecret

MEMBER_ADD_ANSWER = (
    "Added with this role if the username names an active person who may join a tenant "
    "(holders of a platform role may not); the member list shows who belongs."
)
ADMINS_ONLY = "Only this tenant's admins {}."


@extend_schema(responses={200: dict})
@api_view(["GET"])
@permission_classes([IsPerson])
def me(request):
    actor = Actor.from_request(request)
    roles = actor.tenant_roles
    tenants = selectors.tenants_visible_to(actor).filter(pk__in=list(roles))
    return Response(
        {
            "username": actor.user.get_username(),
            "tenants": [{"slug": t.slug, "role": roles[t.pk]} for t in tenants],
            "platform_roles": [r for r in PlatformRole.values if actor.has_role(r)],
        }
    )


class TenantViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = TenantSerializer
    permission_classes = [IsPerson]
    lookup_field = "slug"

    def get_queryset(self):
        return selectors.tenants_visible_to(Actor.from_request(self.request))

    @extend_schema(
        request=MembershipSerializer,
        responses={200: MembershipSerializer(many=True), 202: dict},
    )
    @action(detail=True, methods=["get", "post"], pagination_class=None)  # a plain list
    def members(self, request, slug=None):
        """Tenant admins manage who belongs to their tenant, and with what role; operators may
        read the list. Adding answers 202 with the same body whether or not the username names
        someone who may join (see services.member_add): the member list shows who was added."""
        tenant = self.get_object()
        actor = Actor.from_request(request)
        reading = request.method == "GET" and actor.is_operator
        if not (reading or actor.is_tenant_admin(tenant.pk)):
            raise PermissionDenied(ADMINS_ONLY.format("manage its members"))
        if request.method == "POST":
            serializer = MembershipSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            services.member_add(
                tenant=tenant,
                username=serializer.validated_data["user"],
                role=serializer.validated_data["role"],
                actor=actor,
            )
            return Response({"detail": MEMBER_ADD_ANSWER}, status=status.HTTP_202_ACCEPTED)
        memberships = tenant.memberships.select_related("user").order_by("user__username")
        return Response(MembershipSerializer(memberships, many=True).data)

    @extend_schema(request=MemberRoleSerializer, responses={200: MembershipSerializer, 204: None})
    @action(
        detail=True, methods=["patch", "delete"], url_path=r"members/(?P<username>[\w.@+-]{1,150})"
    )
    def member(self, request, slug=None, username=None):
        """A tenant admin changes a member's role (PATCH {"role"}) or removes them (DELETE);
        someone who is not a member of this tenant is a 404, and the tenant's last admin can be
        neither removed nor demoted (409 `last_admin`)."""
        tenant = self.get_object()
        actor = Actor.from_request(request)
        if not actor.is_tenant_admin(tenant.pk):
            raise PermissionDenied(ADMINS_ONLY.format("manage its members"))
        membership = get_object_or_404(
            Membership.objects.select_related("user", "tenant"),
            tenant=tenant,
            user__username=username,
        )
        if request.method == "DELETE":
            services.member_remove(membership=membership, actor=actor)
            return Response(status=status.HTTP_204_NO_CONTENT)
        body = MemberRoleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        membership = services.member_role_change(
            membership=membership, role=body.validated_data["role"], actor=actor
        )
        return Response({"user": membership.user.get_username(), "role": membership.role})

    @extend_schema(responses=MembershipEventSerializer(many=True))
    @action(detail=True, methods=["get"], url_path="member-events")
    def member_events(self, request, slug=None):
        """The history of the tenant's members, newest first (limit/offset pages): each add,
        role change and removal with who made it. Its admins and the operators read it; a
        removed member's events stay."""
        tenant = self.get_object()
        actor = Actor.from_request(request)
        if not (actor.is_tenant_admin(tenant.pk) or actor.is_operator):
            raise PermissionDenied(ADMINS_ONLY.format("read its members' history"))
        events = (
            MembershipEvent.objects.visible_to(actor).filter(tenant=tenant).order_by("-at", "-id")
        )
        page = self.paginate_queryset(events)
        return self.get_paginated_response(MembershipEventSerializer(page, many=True).data)

    @extend_schema(request=TenantSecretSerializer, responses=TenantSecretSerializer(many=True))
    @action(detail=True, methods=["get", "post"], pagination_class=None)  # a plain list
    def secrets(self, request, slug=None):
        """The tenant's secrets, by name: its members list them, its admins create or replace
        one (POST {name, value}); nobody else, operators included. Values are never returned,
        to anyone."""
        tenant = self.get_object()
        actor = Actor.from_request(request)
        if tenant.pk not in actor.tenant_roles:
            raise PermissionDenied("Only this tenant's people see its secrets.")
        if request.method == "POST":
            if not actor.is_tenant_admin(tenant.pk):
                raise PermissionDenied(ADMINS_ONLY.format("manage its secrets"))
            serializer = TenantSecretSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            secret = services.tenant_secret_set(tenant=tenant, **serializer.validated_data)
            return Response(TenantSecretSerializer(secret).data, status=status.HTTP_201_CREATED)
        secrets = TenantSecret.objects.visible_to(actor).filter(tenant=tenant)
        return Response(TenantSecretSerializer(secrets, many=True).data)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["delete"], url_path=r"secrets/(?P<name>[-a-zA-Z0-9_]+)")
    def secret(self, request, slug=None, name=None):
        """A tenant admin deletes one secret by name."""
        tenant = self.get_object()
        actor = Actor.from_request(request)
        if not actor.is_tenant_admin(tenant.pk):
            raise PermissionDenied(ADMINS_ONLY.format("manage its secrets"))
        secret = get_object_or_404(
            TenantSecret.objects.visible_to(actor).filter(tenant=tenant), name=name
        )
        services.tenant_secret_delete(secret=secret)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=SupportGrantCreateSerializer,
        responses={200: SupportGrantSerializer(many=True), 201: SupportGrantSerializer},
    )
    @action(detail=True, methods=["get", "post"], url_path="support-grants", pagination_class=None)
    def support_grants(self, request, slug=None):
        """Support grants: a tenant admin lets one operator read the tenant's job logs and
        outputs for `ttl_hours` (POST {operator, reason, ttl_hours}); its admins and the
        operators list them, each with its events (granted, revoked, expired)."""
        tenant = self.get_object()
        actor = Actor.from_request(request)
        now = timezone.now()
        if not (
            actor.is_tenant_admin(tenant.pk) or (request.method == "GET" and actor.is_operator)
        ):
            raise PermissionDenied(ADMINS_ONLY.format("grant support access"))
        if request.method == "POST":
            body = SupportGrantCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            grant = services.support_grant_create(
                tenant=tenant,
                operator=body.validated_data["operator"],
                ttl=timedelta(hours=body.validated_data["ttl_hours"]),
                reason=body.validated_data["reason"],
                actor=actor,
                now=now,
            )
            data = SupportGrantSerializer(grant, context={"now": now}).data
            return Response(data, status=status.HTTP_201_CREATED)
        grants = selectors.support_grants_visible_to(actor, tenant).prefetch_related("events")
        return Response(SupportGrantSerializer(grants, many=True, context={"now": now}).data)

    @extend_schema(request=None, responses=SupportGrantSerializer)
    @action(detail=True, methods=["delete"], url_path=r"support-grants/(?P<grant_id>[0-9]{1,18})")
    def support_grant(self, request, slug=None, grant_id=None):
        """A tenant admin revokes a grant (200 with the grant; 409 once it has ended)."""
        tenant = self.get_object()
        actor = Actor.from_request(request)
        if not actor.is_tenant_admin(tenant.pk):
            raise PermissionDenied(ADMINS_ONLY.format("revoke support access"))
        grant = get_object_or_404(selectors.support_grants_visible_to(actor, tenant), pk=grant_id)
        grant = services.support_grant_revoke(grant=grant, actor=actor)
        return Response(SupportGrantSerializer(grant, context={"now": timezone.now()}).data)


class PoolViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = PoolSerializer
    permission_classes = [IsPerson]
    lookup_field = "slug"

    def get_queryset(self):
        return selectors.pools_visible_to(Actor.from_request(self.request))

    @extend_schema(request=PolicyVersionSerializer, responses=PolicyVersionSerializer(many=True))
    @action(
        detail=True,
        methods=["get", "post"],
        url_path="policy-versions",
        permission_classes=[IsPolicyAdminOrReadOnly],
        pagination_class=None,  # a plain list
    )
    def policy_versions(self, request, slug=None):
        pool = self.get_object()
        policy = pool.scheduling_policy
        if request.method == "GET":
            return Response(PolicyVersionSerializer(policy.versions.all(), many=True).data)
        serializer = PolicyVersionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        version = services.policy_version_publish(
            policy=policy,
            weights=serializer.validated_data["weights"],
            knobs=serializer.validated_data.get("knobs"),
            comment=serializer.validated_data.get("comment", ""),
            actor=Actor.from_request(request),
        )
        return Response(PolicyVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ComputePoolViewSet(PoolViewSet):
    """The contract's name for pools: `/compute-pools/{id}`, where {id} is the pool's number or
    its slug, and `/compute-pools/{id}/shapes`, the catalogue of shapes it offers. `/pools/{slug}`
    stays as the documented alias (docs/api.md)."""

    lookup_field = "pk"
    lookup_value_regex = r"[-\w]+"

    def get_object(self):
        value = self.kwargs["pk"]
        field = "pk" if value.isdigit() else "slug"
        pool = get_object_or_404(self.get_queryset(), **{field: value})
        self.check_object_permissions(self.request, pool)
        return pool

    @extend_schema(responses=ShapeSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list
    def shapes(self, request, pk=None):
        shapes = selectors.shapes_visible_to(Actor.from_request(request))
        return Response(ShapeSerializer(shapes.filter(pool=self.get_object()), many=True).data)

    policy_versions = None  # policy versions live at /pools/{slug}/policy-versions


class ShapeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = ShapeSerializer
    permission_classes = [IsPerson]
    filterset_fields = {"pool__slug": ["exact"], "gpu_sharing_class": ["exact"]}

    def get_queryset(self):
        return selectors.shapes_visible_to(Actor.from_request(self.request))


class ApiTokenViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """A person's own tokens. The secret is in the create response only."""

    serializer_class = ApiTokenSerializer
    permission_classes = [IsPerson]

    def get_queryset(self):
        return selectors.tokens_visible_to(Actor.from_request(self.request))

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, secret = services.api_token_issue(
            user=request.user,
            name=data["name"],
            scopes=data.get("scopes"),
            ttl=timedelta(days=data["ttl_days"]) if "ttl_days" in data else None,
            # A token minted with a token derives from it; a session mints within the roles.
            parent=request.auth if isinstance(request.auth, ApiToken) else None,
        )
        body = ApiTokenSerializer(token).data | {"secret": secret}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        # get_object: a pk that is no number is a 404 (found by fuzzing: it was a 500)
        return Response(ApiTokenSerializer(services.api_token_revoke(token=self.get_object())).data)
